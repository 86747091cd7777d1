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

// Whether the CLI's demo can run: its default store is SQLite.
#if __has_include("idem/sqlite/sqlite_recorder.hpp")
inline constexpr bool kDemoHasSqlite = true;
#else
inline constexpr bool kDemoHasSqlite = false;
#endif

struct CliRun {
  int exit_code = -1;  // -1: killed by a signal
  std::string output;
};

// `arguments` are passed to the CLI as they are (no shell quoting involved): the CLI's stderr
// is sent to its stdout by a /bin/sh wrapper, and the arguments reach it through "$@".
// `environment` ("NAME=value" entries) is added to the CLI's environment (through env(1)).
inline CliRun run_cli(const std::vector<std::string>& arguments,
                      const std::vector<std::string>& environment = {}) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", "/usr/bin/env"};
  argv.insert(argv.end(), environment.begin(), environment.end());
  argv.push_back(IDEM_CLI);
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

// The figure of a result-table row ("  label   123"), or -1 when the row is missing.
inline long long row(const CliRun& run, const std::string& label) {
  const std::string key = "\n  " + label + " ";
  const std::size_t at = run.output.find(key);
  if (at == std::string::npos) return -1;
  std::size_t digits = run.output.find_first_not_of(' ', at + key.size());
  if (digits == std::string::npos) return -1;
  long long value = 0;
  bool any = false;
  for (; digits < run.output.size() && run.output[digits] >= '0' && run.output[digits] <= '9';
       ++digits) {
    value = value * 10 + (run.output[digits] - '0');
    any = true;
  }
  return any ? value : -1;
}

// The demo passed its own check, and really killed a consumer inside a handler (so at least
// that delivery came again). Each mode shows what it promises: transactional and exclusive
// (killed before the effect) every effect once; check_then_mark (killed between the effect and
// its marker) the killed event's effect twice, and every other once.
// The demo stopped before it started anything: exit `code` (2: a usage error or a refused store;
// 3: a store error, docs/cli.md), the output says each of `said`, and no producer ran.
inline void expect_stopped_before_start(const CliRun& run, int code,
                                        const std::vector<std::string>& said = {}) {
  EXPECT_EQ(run.exit_code, code) << run.output;
  for (const std::string& text : said)
    EXPECT_TRUE(has(run, text)) << "no '" << text << "' in:\n" << run.output;
  EXPECT_FALSE(has(run, "producer:")) << "started anyway:\n" << run.output;
}

inline void expect_demo_ok(const CliRun& run, const std::string& events,
                           const std::string& mode = "transactional") {
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const long long n = std::stoll(events);
  if (mode == "check_then_mark") {
    EXPECT_TRUE(has(run, "\nOK: side effects " + std::to_string(n + 1) + " for " + events +
                             " distinct events (1 event ran twice)"))
        << run.output;
    EXPECT_TRUE(has(run, "what check_then_mark admits: the crash fell between the effect"))
        << run.output;
    EXPECT_EQ(row(run, "side effects"), n + 1) << run.output;
    EXPECT_EQ(row(run, "events run twice"), 1) << run.output;
  } else {
    EXPECT_TRUE(has(run, "\nOK: side effects == distinct events == " + events + " ")) << run.output;
    EXPECT_EQ(row(run, "events run twice"), 0) << run.output;
  }
  EXPECT_EQ(row(run, "events marked processed"), n) << run.output;
  EXPECT_TRUE(has(run, "SIGKILLed in the handler of delivery #")) << run.output;
  EXPECT_FALSE(has(run, "despite 0 redeliveries")) << run.output;
}

// `idem demo --hops 2` with a small stream (and --store / --broker when given).
inline CliRun run_two_hop_demo(const std::string& events, const std::string& store = "",
                               const std::string& broker = "") {
  std::vector<std::string> arguments = {"demo", "--hops", "2", "--events", events};
  if (!store.empty()) arguments.insert(arguments.end(), {"--store", store});
  if (!broker.empty()) arguments.insert(arguments.end(), {"--broker", broker});
  return run_cli(arguments);
}

// Both hops passed: billing's effects once, every order.charged relayed (the relay killed once
// after a publish, so its last batch went out again and shipping dropped it), shipping's
// effects once, the outbox empty; both consumers and the relay were really killed.
inline void expect_two_hop_demo_ok(const CliRun& run, long long events) {
  expect_demo_ok(run, std::to_string(events));
  EXPECT_TRUE(has(run, "\nOK: orders shipped == follow-ups == " + std::to_string(events) + " "))
      << run.output;
  EXPECT_TRUE(has(run, "  crash:     relay pid ")) << run.output;
  EXPECT_TRUE(has(run, "  crash:     shipping pid ")) << run.output;
  EXPECT_EQ(row(run, "side effects"), events) << run.output;
  EXPECT_EQ(row(run, "follow-ups in the outbox"), events) << run.output;
  const long long relayed = row(run, "relayed (published)");
  const long long again = row(run, "relayed again after crash");
  EXPECT_GT(again, 0) << run.output;  // the killed relay's last batch
  EXPECT_EQ(relayed, events + again) << run.output;
  // Every relayed row was delivered at least once; the ones relayed again were dropped.
  EXPECT_GE(row(run, "shipping deliveries"), relayed) << run.output;
  EXPECT_GE(row(run, "duplicates dropped (ship)"), again) << run.output;
  EXPECT_EQ(row(run, "shipping side effects"), events) << run.output;
  EXPECT_EQ(row(run, "orders shipped"), events) << run.output;
  EXPECT_EQ(row(run, "charges marked shipped"), events) << run.output;
  EXPECT_TRUE(has(run, "\n  outbox left                0 waiting, 0 parked\n")) << run.output;
  EXPECT_TRUE(has(run, "\n  relay restarted ")) << run.output;  // every restarted phase named
  EXPECT_TRUE(has(run, "\n  shipping restarted ")) << run.output;
  EXPECT_TRUE(has(run, "\n  billing restarted ")) << run.output;
}

}  // namespace idem::test
