// `promtool check metrics` for the tests of idem's Prometheus text: the Prometheus project's own
// parser and linter (Debian package prometheus, installed by scripts/install-deps.sh) says
// whether a scrape would read it. A test without promtool is skipped, or fails when
// IDEM_REQUIRE_SERVERS=1 (server_env.hpp), as a missing server is.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include "process/worker/child_process.hpp"
#include "server_env.hpp"

namespace idem::test {

// promtool's path on PATH, "" when it is not installed.
inline std::string promtool_path() {
  std::istringstream path(env("PATH"));
  std::string directory;
  while (std::getline(path, directory, ':')) {
    const std::string candidate = (directory.empty() ? "." : directory) + "/promtool";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

struct PromtoolCheck {
  int exit_code = -1;  // 0: parsed and linted clean
  std::string output;  // what promtool said (stdout and stderr)
};

// `promtool check metrics` with `text` on its standard input.
inline PromtoolCheck promtool_check(const std::string& promtool, const std::string& text) {
  ChildProcess child({"/bin/sh", "-c", "exec \"$0\" check metrics 2>&1", promtool});
  child.write_stdin(text);
  child.close_stdin();
  PromtoolCheck check;
  check.output = child.read_all();
  const int status = child.wait();
  check.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return check;
}

}  // namespace idem::test

// In a test body: `text` passes `promtool check metrics` (parse and lint); skips the test (or
// fails it, IDEM_REQUIRE_SERVERS=1) when promtool is not installed.
#define IDEM_EXPECT_PROMTOOL_ACCEPTS(text)                                                    \
  do {                                                                                        \
    const std::string idem_promtool = ::idem::test::promtool_path();                          \
    if (idem_promtool.empty()) {                                                              \
      IDEM_SERVER_MISSING("promtool (Debian package prometheus) is not installed");           \
    }                                                                                         \
    const ::idem::test::PromtoolCheck idem_check =                                            \
        ::idem::test::promtool_check(idem_promtool, (text));                                  \
    EXPECT_EQ(idem_check.exit_code, 0) << idem_check.output << "\n--- the text:\n" << (text); \
  } while (false)
