// `idem demo` (the CLI, IDEM_CLI) never changes what is the user's and leaves nothing of its own
// behind: a SIGINT, SIGTERM or SIGPIPE in each phase (raised by the demo against itself at the
// phase's start, IDEM_DEMO_RAISE_AT) ends it with 128 + the signal and a summary, no child
// process left and its temporary work dir gone; a --dir holding files it did not make, or a
// --store file that exists, is refused untouched (exit 2) unless the user allows it, and then
// only the demo's own files and rows are replaced or removed; --keep names what it kept.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "../temp_dir.hpp"
#include "demo_cli.hpp"
#include "idem/open.hpp"
#include "idem/sql.hpp"

#define IDEM_REQUIRE_DEMO()                                                       \
  do {                                                                            \
    IDEM_REQUIRE_CLI();                                                           \
    if (!idem::test::kDemoHasSqlite)                                              \
      GTEST_SKIP() << "the demo's default store needs SQLite (IDEM_WITH_SQLITE)"; \
  } while (false)

namespace {

namespace fs = std::filesystem;
using idem::test::CliRun;
using idem::test::has;
using idem::test::run_cli;
using idem::test::TempDir;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Processes whose command line mentions `text` (the demo's children name their work dir).
std::vector<std::string> processes_mentioning(const std::string& text) {
  std::vector<std::string> found;
  for (const fs::directory_entry& entry : fs::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_file(entry.path() / "cmdline");
    for (char& c : cmdline)
      if (c == '\0') c = ' ';
    if (cmdline.find(text) != std::string::npos) found.push_back(pid + ": " + cmdline);
  }
  return found;
}

// The demo with its TMPDIR in `tmp` and the signal `signal` ("INT", "TERM", "PIPE") raised when
// it enters `phase`.
CliRun stop_demo(const TempDir& tmp, const std::string& phase, const std::string& signal,
                 std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), "demo");
  return run_cli(arguments,
                 {"TMPDIR=" + tmp.path().string(), "IDEM_DEMO_RAISE_AT=" + phase + ":" + signal});
}

// The first column of `sql`'s first row in the SQLite file at `url`, read in a recorder
// transaction that is rolled back.
long long sqlite_count(const std::string& url, const std::string& sql) {
  struct Rollback {};
  long long count = -1;
  try {
    static_cast<void>(
        idem::open_recorder(url)->run_transactional("test", "look", [&](idem::Transaction& tx) {
          count = dynamic_cast<idem::SqlTransaction&>(tx).query_int64(sql).value_or(-1);
          throw Rollback{};
        }));
  } catch (const Rollback&) {
  }
  return count;
}

int signal_number(const std::string& name) {
  return name == "TERM" ? SIGTERM : name == "PIPE" ? SIGPIPE : SIGINT;
}

void expect_stopped_and_gone(const CliRun& run, const TempDir& tmp, const std::string& phase,
                             const std::string& signal) {
  EXPECT_EQ(run.exit_code, 128 + signal_number(signal)) << run.output;
  EXPECT_TRUE(has(run, "idem demo: stopped by SIG" + signal + " in phase " + phase + ";"))
      << run.output;
  EXPECT_TRUE(fs::is_empty(tmp.path())) << "left in TMPDIR:\n" << run.output;
  EXPECT_EQ(processes_mentioning(tmp.path().string()), std::vector<std::string>{});
}

TEST(DemoCleanup, ASignalInEachPhaseLeavesNothing) {
  IDEM_REQUIRE_DEMO();
  const std::vector<std::pair<std::string, std::string>> stops = {
      {"starting", "INT"},           {"producing", "TERM"}, {"consuming", "PIPE"},
      {"consumer-restarted", "INT"}, {"results", "TERM"},
  };
  for (const auto& [phase, signal] : stops) {
    SCOPED_TRACE(phase);
    TempDir tmp;
    const CliRun run = stop_demo(tmp, phase, signal, {"--events", "300"});
    expect_stopped_and_gone(run, tmp, phase, signal);
    if (phase == "consuming") {
      // The progress line of the stopped phase ends where it was, not at the total.
      EXPECT_TRUE(has(run, " 0% 0/390 stopped")) << run.output;
    }
  }
}

TEST(DemoCleanup, ASignalInEachPhaseOfTwoHopsLeavesNothing) {
  IDEM_REQUIRE_DEMO();
  const std::vector<std::pair<std::string, std::string>> stops = {
      {"relaying", "TERM"},
      {"relay-restarted", "INT"},
      {"shipping", "PIPE"},
      {"shipping-restarted", "TERM"},
  };
  for (const auto& [phase, signal] : stops) {
    SCOPED_TRACE(phase);
    TempDir tmp;
    const CliRun run = stop_demo(tmp, phase, signal, {"--events", "150", "--hops", "2"});
    expect_stopped_and_gone(run, tmp, phase, signal);
  }
}

TEST(DemoCleanup, AFailureLeavesNoWorkDir) {
  IDEM_REQUIRE_DEMO();
  TempDir tmp;
  // Refused after the work dir was made: the broker URL is checked, then the store.
  const CliRun run = run_cli({"demo", "--events", "50", "--store", "memory://"},
                             {"TMPDIR=" + tmp.path().string()});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_TRUE(fs::is_empty(tmp.path())) << run.output;
}

TEST(DemoCleanup, KeepNamesWhatItKeptAndWhatToTryNext) {
  IDEM_REQUIRE_DEMO();
  TempDir tmp;
  const CliRun run =
      run_cli({"demo", "--events", "200", "--keep"}, {"TMPDIR=" + tmp.path().string()});
  idem::test::expect_demo_ok(run, "200");
  ASSERT_TRUE(has(run, "\nkept:\n  work dir:  " + tmp.path().string() + "/idem-demo-"))
      << run.output;
  EXPECT_TRUE(has(run, "try:\n  idem stats sqlite://" + tmp.path().string())) << run.output;
  EXPECT_TRUE(has(run, "  idem inspect sqlite://")) << run.output;
  // The side effects of transactional mode are ledger rows, and the demo says where.
  EXPECT_TRUE(has(run, "side effects are the rows of idem_demo_ledger")) << run.output;
  // The store holds the demo's consumer, and nothing the demo used internally.
  const std::string dir = fs::directory_iterator(tmp.path())->path().string();
  const auto counts = idem::open_recorder("sqlite://" + dir + "/idem.db")->consumer_counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].consumer, "billing");
  EXPECT_EQ(counts[0].processed, 200u);
}

TEST(DemoCleanup, ADirWithOtherFilesIsRefusedUntouched) {
  IDEM_REQUIRE_DEMO();
  TempDir dir;
  std::ofstream(dir.path() / "idem.db") << "the user's database";
  std::ofstream(dir.path() / "notes.txt") << "the user's notes";
  const CliRun run = run_cli({"demo", "--events", "50", "--dir", dir.path().string()});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_TRUE(has(run, "holds '")) << run.output;
  EXPECT_TRUE(has(run, "--reuse-dir")) << run.output;
  EXPECT_EQ(read_file(dir.path() / "idem.db"), "the user's database");
  EXPECT_EQ(read_file(dir.path() / "notes.txt"), "the user's notes");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);

  // A file where the directory should be is refused too.
  const CliRun file = run_cli({"demo", "--dir", (dir.path() / "notes.txt").string()});
  EXPECT_EQ(file.exit_code, 2) << file.output;
  EXPECT_TRUE(has(file, "is not a directory")) << file.output;
}

TEST(DemoCleanup, ReuseDirReplacesOnlyTheDemosOwnFiles) {
  IDEM_REQUIRE_DEMO();
  TempDir dir;
  std::ofstream(dir.path() / "notes.txt") << "the user's notes";
  const CliRun run =
      run_cli({"demo", "--events", "100", "--dir", dir.path().string(), "--reuse-dir"});
  idem::test::expect_demo_ok(run, "100");
  EXPECT_EQ(read_file(dir.path() / "notes.txt"), "the user's notes");
  EXPECT_TRUE(fs::exists(dir.path() / "idem.db"));  // --dir is kept
}

TEST(DemoCleanup, ADirTheDemoUsedBeforeIsItsOwn) {
  IDEM_REQUIRE_DEMO();
  TempDir parent;
  const fs::path dir = parent.path() / "demo";  // made by the demo
  ASSERT_EQ(run_cli({"demo", "--events", "100", "--dir", dir.string()}).exit_code, 0);
  // Stopped half way, the second run leaves its files in the directory it was given, and no
  // process behind.
  const CliRun stopped = run_cli({"demo", "--events", "100", "--dir", dir.string()},
                                 {"IDEM_DEMO_RAISE_AT=consumer-restarted:TERM"});
  EXPECT_EQ(stopped.exit_code, 128 + SIGTERM) << stopped.output;
  EXPECT_TRUE(fs::exists(dir / "queue.jsonl"));
  EXPECT_EQ(processes_mentioning(dir.string()), std::vector<std::string>{});
  const CliRun third = run_cli({"demo", "--events", "100", "--dir", dir.string()});
  idem::test::expect_demo_ok(third, "100");
}

TEST(DemoCleanup, AStoreFileTheDemoMadeIsDeletedOnEveryWayOut) {
  IDEM_REQUIRE_DEMO();
  TempDir dir;
  const std::string file = (dir.path() / "new.db").string();
  const CliRun done = run_cli({"demo", "--events", "100", "--store", "sqlite://" + file});
  idem::test::expect_demo_ok(done, "100");
  EXPECT_TRUE(fs::is_empty(dir.path())) << done.output;
  const CliRun stopped = run_cli({"demo", "--events", "100", "--store", "sqlite://" + file},
                                 {"IDEM_DEMO_RAISE_AT=consuming:INT"});
  EXPECT_EQ(stopped.exit_code, 128 + SIGINT) << stopped.output;
  EXPECT_TRUE(fs::is_empty(dir.path())) << stopped.output;
}

TEST(DemoCleanup, AnExistingStoreFileIsRefusedUntouchedUnlessAllowed) {
  IDEM_REQUIRE_DEMO();
  TempDir dir;
  const std::string file = (dir.path() / "app.db").string();
  const std::string url = "sqlite://" + file;
  idem::open_recorder(url)->mark_processed("payments", "evt-precious");
  const std::string before = read_file(file);
  const CliRun refused = run_cli({"demo", "--events", "50", "--store", url});
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(has(refused, "already exists")) << refused.output;
  EXPECT_TRUE(has(refused, "--allow-nonempty-store")) << refused.output;
  EXPECT_EQ(read_file(file), before);

  // Allowed: the demo works beside the user's marker and takes all of its own away again, on
  // success and when stopped.
  for (const char* mode : {"transactional", "check_then_mark"}) {
    const CliRun run = run_cli(
        {"demo", "--events", "100", "--mode", mode, "--store", url, "--allow-nonempty-store"});
    idem::test::expect_demo_ok(run, "100", mode);
  }
  const CliRun two_hops =
      run_cli({"demo", "--events", "100", "--hops", "2", "--store", url, "--allow-nonempty-store"});
  idem::test::expect_two_hop_demo_ok(two_hops, 100);
  const CliRun stopped =
      run_cli({"demo", "--events", "100", "--hops", "2", "--store", url, "--allow-nonempty-store"},
              {"IDEM_DEMO_RAISE_AT=shipping:TERM"});
  EXPECT_EQ(stopped.exit_code, 128 + SIGTERM) << stopped.output;
  const auto counts = idem::open_recorder(url)->consumer_counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].consumer, "payments");
  EXPECT_EQ(counts[0].processed, 1u);
  // No row in the outbox and no table of the demo's are left either.
  EXPECT_EQ(sqlite_count(url, "SELECT COUNT(*) FROM idem_outbox"), 0);
  EXPECT_EQ(sqlite_count(url, "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE 'idem_demo%'"),
            0);
}

}  // namespace
