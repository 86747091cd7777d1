// A consumer process SIGKILLed in the middle of its handler, then the event redelivered.
//
// The worker (idem_test_worker hang) writes its side effect inside the handler, tells the test
// "ready" through a pipe and blocks there; the test kills it with SIGKILL.
//   transactional: the side-effect row was written through the open transaction, so after the
//                  kill neither it nor the marker exists; a fresh process then runs the event
//                  exactly once.
//   exclusive:     the side effect (a line in a file) is outside any transaction and stays; the
//                  killed owner's claim blocks other deliveries until its lease (200 ms) has
//                  passed, then a fresh process takes it over and runs the event again — the
//                  documented at-least-once window of exclusive mode across a crash.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../temp_dir.hpp"
#include "idem/event.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/testing/manual_clock.hpp"
#include "worker/child_process.hpp"

namespace {

using idem::test::ChildProcess;

using idem::test::TempDir;

// A read-only look at the file from outside, as an operator with the sqlite3 shell would.
long long query_int(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_busy_timeout(db, 5000);
  sqlite3_stmt* stmt = nullptr;
  long long value = -1;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    value = sqlite3_column_int64(stmt, 0);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

int count_lines(const std::string& path, const std::string& wanted) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);)
    n += (line == wanted) ? 1 : 0;
  return n;
}

bool killed_by_sigkill(int status) {
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

class SqliteCrash : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = dir_.file("crash.db");
    { idem::sqlite::SqliteIdempotencyRecorder create(db_); }
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(db_.c_str(), &db), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db, "CREATE TABLE side_effects(event_id TEXT NOT NULL, worker TEXT)",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
    event_ = idem::new_event_id();
    events_file_ = dir_.file("redelivery.txt");
    std::ofstream(events_file_) << event_ << "\n";
  }

  std::vector<std::string> worker(const std::string& command, const std::string& mode) const {
    std::vector<std::string> argv = {IDEM_TEST_WORKER, command, "--db",       db_,
                                     "--mode",         mode,    "--consumer", "payments",
                                     "--lease-ms",     "200",   "--effects",  effects_};
    if (command == "hang") {
      argv.insert(argv.end(), {"--event", event_});
    } else {
      argv.insert(argv.end(), {"--events", events_file_});
    }
    return argv;
  }

  // Runs one redelivery in a fresh process; returns its summary line.
  std::string redeliver(const std::string& mode) const {
    ChildProcess child(worker("consume", mode));
    child.close_stdin();
    const std::string output = child.read_all();
    const int status = child.wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
    return output.substr(0, output.find('\n'));
  }

  long long markers() const {
    return query_int(db_,
                     "SELECT count(*) FROM processed_log WHERE consumer = 'payments' AND "
                     "event_id = '" +
                         event_ + "'");
  }

  TempDir dir_;
  std::string db_;
  std::string effects_ = dir_.file("effects.txt");
  std::string event_;
  std::string events_file_;
};

TEST_F(SqliteCrash, TransactionalKilledMidHandlerLeavesNeitherMarkerNorSideEffect) {
  const std::string side_effects =
      "SELECT count(*) FROM side_effects WHERE event_id = '" + event_ + "'";
  {
    ChildProcess child(worker("hang", "transactional"));
    ASSERT_EQ(child.read_line(), "ready");
    // The row is written but not committed: invisible from outside.
    EXPECT_EQ(query_int(db_, side_effects), 0);
    EXPECT_EQ(markers(), 0);
    child.kill(SIGKILL);
    EXPECT_TRUE(killed_by_sigkill(child.wait()));
  }
  EXPECT_EQ(query_int(db_, side_effects), 0) << "the killed transaction left its side effect";
  EXPECT_EQ(markers(), 0) << "the killed transaction left its marker";

  // The broker redelivers to a fresh process: it runs once and commits both.
  EXPECT_EQ(redeliver("transactional"), "processed=1 duplicate=0 redelivered=0");
  EXPECT_EQ(query_int(db_, side_effects), 1);
  EXPECT_EQ(markers(), 1);
  // Any later copy is a duplicate.
  EXPECT_EQ(redeliver("transactional"), "processed=0 duplicate=1 redelivered=0");
  EXPECT_EQ(query_int(db_, side_effects), 1);
}

TEST_F(SqliteCrash, ExclusiveKilledOwnersClaimIsTakenOverAfterItsLease) {
  std::int64_t lease_until_ms = 0;
  {
    ChildProcess child(worker("hang", "exclusive"));
    ASSERT_EQ(child.read_line(), "ready");
    EXPECT_EQ(count_lines(effects_, event_), 1);
    child.kill(SIGKILL);
    EXPECT_TRUE(killed_by_sigkill(child.wait()));
    lease_until_ms =
        query_int(db_, "SELECT lease_until_ms FROM idem_claims WHERE event_id = '" + event_ + "'");
  }
  ASSERT_GT(lease_until_ms, 0) << "the killed owner's claim is in idem_claims";
  EXPECT_EQ(markers(), 0) << "killed before complete(): not marked";

  // Until the lease ends, the dead owner's claim still holds: another delivery is refused.
  // (Checked at a pinned instant just before the deadline, so the test does not race the clock.)
  {
    auto clock = std::make_shared<idem::testing::ManualClock>(
        idem::WallTime(std::chrono::milliseconds(lease_until_ms - 1)));
    idem::sqlite::SqliteOptions options;
    options.clock = clock;
    idem::sqlite::SqliteIdempotencyRecorder recorder(db_, options);
    const auto claim = recorder.claim("payments", event_, std::chrono::milliseconds(200));
    EXPECT_EQ(claim.status, idem::Claim::Status::in_progress);
    EXPECT_EQ(claim.lease_until, idem::WallTime(std::chrono::milliseconds(lease_until_ms)));
  }

  // Wait for the wall clock to pass the stored deadline (the state we wait on is the lease in
  // the file; nothing else would end it).
  std::this_thread::sleep_until(
      std::chrono::system_clock::time_point(std::chrono::milliseconds(lease_until_ms + 1)));

  // A fresh process takes the claim over and runs the side effect again: exclusive mode is
  // at-least-once across a crash between the side effect and complete().
  EXPECT_EQ(redeliver("exclusive"), "processed=1 duplicate=0 redelivered=0");
  EXPECT_EQ(count_lines(effects_, event_), 2);
  EXPECT_EQ(markers(), 1);
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM idem_claims"), 0);
  EXPECT_EQ(redeliver("exclusive"), "processed=0 duplicate=1 redelivered=0");
  EXPECT_EQ(count_lines(effects_, event_), 2);
}

}  // namespace
