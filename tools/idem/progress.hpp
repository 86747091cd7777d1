// A progress line for a long step of the CLI (the demo's phases, `idem purge`), on stderr.
//
// On a terminal it is one line redrawn in place (\r, then ESC[K), cut to the terminal's width
// (ioctl TIOCGWINSZ on the stream, else $COLUMNS, else 80) so that it never wraps: the bar
// narrows first, then the note loses its last ", ..." parts, then the bar goes. Elsewhere (a
// pipe, a file) it prints a line each time another tenth of the total is reached, and one when
// it finishes, each with the exact count and percent (the percent rounded down, so 100% means
// done). finish() leaves the line at the last count given to update(), never at the total unless
// it was reached: a step that stopped half way shows where it stopped.
//
// Thread-safety: one ProgressBar belongs to one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace idem::cli {

class ProgressBar {
 public:
  ProgressBar(std::string label, std::uint64_t total, std::FILE* out = stderr);
  // A bar neither finished nor abandoned (an exception went through its step) is finished with
  // the note "stopped", so the next line starts on a line of its own.
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `done` of the total so far (more than the total is shown as the total), with a short note.
  void update(std::uint64_t done, const std::string& note = "");
  // Draws the last count once more with `note` (or the last note when empty) and ends the line.
  // Later calls do nothing.
  void finish(const std::string& note = "");

  std::uint64_t done() const noexcept { return done_; }

  // The line for one state, at most `columns` - 1 characters (without \r and ESC[K); the
  // terminal drawing of update(). Public for tests.
  static std::string render(const std::string& label, std::uint64_t done, std::uint64_t total,
                            const std::string& note, std::size_t columns);
  // The width of the terminal `out` writes to, else $COLUMNS, else 80.
  static std::size_t columns_of(std::FILE* out);

 private:
  void draw();

  std::string label_;
  std::uint64_t total_;
  std::FILE* out_;
  bool tty_;
  std::uint64_t done_ = 0;
  std::string note_;
  std::string drawn_;       // terminal: the line on screen; elsewhere: the last line printed
  int printed_tenth_ = -1;  // elsewhere: the tenth of the total of the last line printed
  bool finished_ = false;
};

}  // namespace idem::cli
