#include "progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

namespace idem::cli {
namespace {

constexpr std::size_t kFullBar = 30;
constexpr std::size_t kNarrowestBar = 10;

// Rounded down, so that 100 means done.
int percent(std::uint64_t done, std::uint64_t total) {
  if (done >= total) return 100;
  return static_cast<int>(static_cast<double>(done) * 100.0 / static_cast<double>(total));
}

std::string percent_text(std::uint64_t done, std::uint64_t total) {
  std::string text = std::to_string(percent(done, total)) + "%";
  return std::string(4 - std::min<std::size_t>(4, text.size()), ' ') + text;
}

std::string counts_text(std::uint64_t done, std::uint64_t total) {
  return std::to_string(std::min(done, total)) + "/" + std::to_string(total);
}

std::string line(const std::string& label, std::size_t bar_width, std::uint64_t done,
                 std::uint64_t total, const std::string& note) {
  std::string text = label;
  if (bar_width > 0) {
    const auto filled = static_cast<std::size_t>(
        static_cast<double>(bar_width) *
        std::min(1.0, static_cast<double>(done) / static_cast<double>(total)));
    text += " [" + std::string(filled, '#') + std::string(bar_width - filled, '.') + "]";
  }
  text += " " + percent_text(done, total) + " " + counts_text(done, total);
  if (!note.empty()) text += " " + note;
  return text;
}

// `note` without its last ", ..." part; empty when it has one part.
std::string shorter_note(const std::string& note) {
  const std::size_t comma = note.rfind(", ");
  return comma == std::string::npos ? std::string() : note.substr(0, comma);
}

}  // namespace

ProgressBar::ProgressBar(std::string label, std::uint64_t total, std::FILE* out)
    : label_(std::move(label)),
      total_(std::max<std::uint64_t>(total, 1)),
      out_(out),
      tty_(::isatty(::fileno(out)) != 0) {}

ProgressBar::~ProgressBar() {
  finish("stopped");
}

std::size_t ProgressBar::columns_of(std::FILE* out) {
  winsize size{};
  if (::ioctl(::fileno(out), TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  if (const char* columns = std::getenv("COLUMNS")) {
    const long value = std::strtol(columns, nullptr, 10);
    if (value > 0 && value < 10000) return static_cast<std::size_t>(value);
  }
  return 80;
}

std::string ProgressBar::render(const std::string& label, std::uint64_t done, std::uint64_t total,
                                const std::string& note, std::size_t columns) {
  total = std::max<std::uint64_t>(total, 1);
  // One column short of the width: a line that fills the last column leaves some terminals
  // waiting to wrap, and the next \r would then redraw on the line below.
  const std::size_t room = columns > 1 ? columns - 1 : 1;
  std::string shown_note = note;
  for (;;) {
    const std::size_t bare = line(label, 0, done, total, shown_note).size();
    // A bar takes its width plus " []".
    if (bare + 3 + kNarrowestBar <= room) {
      return line(label, std::min(kFullBar, room - bare - 3), done, total, shown_note);
    }
    if (shown_note.empty()) break;
    shown_note = shorter_note(shown_note);
  }
  std::string text = line(label, 0, done, total, "");
  if (text.size() > room) text.resize(room);
  return text;
}

void ProgressBar::update(std::uint64_t done, const std::string& note) {
  if (finished_) return;
  done_ = done;
  note_ = note;
  draw();
}

void ProgressBar::draw() {
  if (tty_) {
    std::string text = render(label_, done_, total_, note_, columns_of(out_));
    if (text == drawn_) return;
    std::fprintf(out_, "\r%s\x1b[K", text.c_str());
    std::fflush(out_);
    drawn_ = std::move(text);
    return;
  }
  const int tenth = percent(done_, total_) / 10;
  if (tenth == printed_tenth_) return;
  printed_tenth_ = tenth;
  drawn_ = line(label_, 0, done_, total_, note_);
  std::fprintf(out_, "%s\n", drawn_.c_str());
  std::fflush(out_);
}

void ProgressBar::finish(const std::string& note) {
  if (finished_) return;
  finished_ = true;
  if (!note.empty()) note_ = note;
  if (tty_) {
    const std::string text = render(label_, done_, total_, note_, columns_of(out_));
    std::fprintf(out_, "\r%s\x1b[K\n", text.c_str());
  } else {
    const std::string text = line(label_, 0, done_, total_, note_);
    if (text != drawn_) std::fprintf(out_, "%s\n", text.c_str());
  }
  std::fflush(out_);
}

}  // namespace idem::cli
