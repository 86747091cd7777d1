// Runs `idem demo` (the CLI, IDEM_CLI) for the process tests of --store: its exit code and
// everything it printed (stdout and stderr together).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <string>
#include <string_view>
#include <vector>

#include "worker/child_process.hpp"

// Without the CLI (-DIDEM_BUILD_TOOLS=OFF) the tests that need it skip: IDEM_REQUIRE_CLI().
#ifndef IDEM_CLI
#define IDEM_CLI ""
#endif
#define IDEM_REQUIRE_CLI()                                                                \
  do {                                                                                    \
    if (std::string_view(IDEM_CLI).empty()) GTEST_SKIP() << "built without the idem CLI"; \
  } while (false)

namespace idem::test {

struct CliRun {
  int exit_code = -1;  // -1: killed by a signal
  std::string output;
};

// `arguments` are passed to the CLI as they are (no shell quoting involved): the CLI's stderr
// is sent to its stdout by a /bin/sh wrapper, and the arguments reach it through "$@".
inline CliRun run_cli(const std::vector<std::string>& arguments) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", IDEM_CLI};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  ChildProcess child(argv);
  child.close_stdin();
  CliRun run;
  run.output = child.read_all();
  const int status = child.wait();
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// A small demo: each run is a few hundred events, a SIGKILL and a restart (well under 20 s).
inline CliRun run_demo(const std::string& store, const std::string& mode,
                       const std::string& events = "400") {
  std::vector<std::string> arguments = {"demo", "--events", events, "--mode", mode};
  if (!store.empty()) arguments.insert(arguments.end(), {"--store", store});
  return run_cli(arguments);
}

inline bool has(const CliRun& run, const std::string& text) {
  return run.output.find(text) != std::string::npos;
}

// The demo passed its own check, and really killed a consumer inside a handler (so at least
// that delivery came again).
inline void expect_demo_ok(const CliRun& run, const std::string& events) {
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(has(run, "\nOK: side effects == distinct events == " + events + " ")) << run.output;
  EXPECT_TRUE(has(run, "killed with SIGKILL inside the handler of delivery #")) << run.output;
  EXPECT_FALSE(has(run, "despite 0 redeliveries")) << run.output;
}

}  // namespace idem::test
