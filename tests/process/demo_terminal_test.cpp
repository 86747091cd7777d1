// What `idem demo` (the CLI, IDEM_CLI) shows. On an 80-column terminal (a pseudo-terminal made
// with forkpty) every progress line is redrawn in place: no line of the output, and no redraw
// within one, is wider than 80 columns, each phase leaves exactly one progress line, and the
// killed phase's line ends where the kill was, not at 100%. Piped, each progress line's percent
// is its exact count's (rounded down), never a rounded-down tenth.
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "demo_cli.hpp"

extern char** environ;

namespace {

using idem::test::CliRun;
using idem::test::has;

using idem::test::kDemoHasSqlite;

// Runs the CLI on a pseudo-terminal of `columns` x 40 and returns all it wrote there.
CliRun run_in_terminal(const std::vector<std::string>& arguments, unsigned short columns) {
  std::vector<std::string> args = {IDEM_CLI};
  args.insert(args.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (std::string& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  // The terminal's width must come from the terminal, not from the environment.
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string_view(*e).rfind("COLUMNS=", 0) != 0) envp.push_back(*e);
  }
  envp.push_back(nullptr);
  winsize size{};
  size.ws_col = columns;
  size.ws_row = 40;
  int terminal = -1;
  const pid_t pid = ::forkpty(&terminal, nullptr, nullptr, &size);
  if (pid < 0) throw std::runtime_error("forkpty failed");
  if (pid == 0) {
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  CliRun run;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(terminal, buffer, sizeof buffer);
    if (n > 0) {
      run.output.append(buffer, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EIO: the program exited and the terminal's other side closed
    }
  }
  ::close(terminal);
  int status = 0;
  ::waitpid(pid, &status, 0);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// The output as a terminal's lines, each as the redraws ('\r'-separated) it holds, with
// escape sequences (ESC[K) left out.
std::vector<std::vector<std::string>> terminal_lines(const std::string& output) {
  const std::string plain = std::regex_replace(output, std::regex("\x1b\\[[0-9;]*[A-Za-z]"), "");
  std::vector<std::vector<std::string>> lines;
  std::istringstream in(plain);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> redraws;
    std::istringstream parts(line);
    std::string part;
    while (std::getline(parts, part, '\r'))
      redraws.push_back(part);
    lines.push_back(redraws);
  }
  return lines;
}

TEST(DemoTerminal, ProgressLinesFitAnEightyColumnTerminalAndRedrawInPlace) {
  IDEM_REQUIRE_CLI();
  if (!kDemoHasSqlite) GTEST_SKIP() << "the demo's default store needs SQLite";
  const CliRun run = run_in_terminal({"demo", "--events", "3000"}, 80);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::regex bar("\\[[#.]+\\]");
  int bar_lines = 0;
  std::string consuming;
  for (const std::vector<std::string>& line : terminal_lines(run.output)) {
    std::string last;
    for (const std::string& redraw : line) {
      EXPECT_LE(redraw.size(), 80u) << "'" << redraw << "'";
      if (!redraw.empty()) last = redraw;
    }
    if (std::regex_search(last, bar)) {
      ++bar_lines;
      if (last.find("  consuming ") == 0) consuming = last;
    }
  }
  // producing, consuming, consumer restarted: one line each however often they were redrawn.
  EXPECT_EQ(bar_lines, 3) << run.output;
  EXPECT_NE(consuming.find(" killed"), std::string::npos) << consuming;
  EXPECT_EQ(consuming.find("100%"), std::string::npos) << consuming;
  EXPECT_NE(consuming.find(" 45% "), std::string::npos) << consuming;  // --kill-at 0.45
}

TEST(DemoTerminal, PipedProgressShowsExactCounts) {
  IDEM_REQUIRE_CLI();
  if (!kDemoHasSqlite) GTEST_SKIP() << "the demo's default store needs SQLite";
  const CliRun run = idem::test::run_cli({"demo", "--events", "1000", "--hops", "2"});
  idem::test::expect_two_hop_demo_ok(run, 1000);
  EXPECT_EQ(run.output.find('\r'), std::string::npos);
  const std::regex progress("^  ([a-z][a-z ]*[a-z]) +([0-9]+)% ([0-9]+)/([0-9]+)( .*)?$");
  int lines = 0;
  std::istringstream in(run.output);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, progress)) continue;
    ++lines;
    const long long percent = std::stoll(m[2]);
    const long long done = std::stoll(m[3]);
    const long long total = std::stoll(m[4]);
    EXPECT_LE(done, total) << line;
    EXPECT_EQ(percent, done * 100 / total) << line;
    if (m[5].str().find("killed") != std::string::npos) {
      EXPECT_LT(done, total) << line;
    }
  }
  EXPECT_GT(lines, 8) << run.output;
}

}  // namespace
