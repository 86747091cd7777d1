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

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../sqlite_raw_db.hpp"
#include "../temp_dir.hpp"
#include "idem/event.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/testing/manual_clock.hpp"
#include "worker_process.hpp"

namespace {

using idem::test::ChildProcess;
using idem::test::TempDir;

class SqliteCrash : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = dir_.file("crash.db");
    { idem::sqlite::SqliteIdempotencyRecorder create(db_); }
    idem::test::sqlite_exec(db_, "CREATE TABLE side_effects(event_id TEXT NOT NULL, worker TEXT)");
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
    return idem::test::run_to_end(worker("consume", mode));
  }

  long long markers() const {
    return idem::test::sqlite_query_int(
        db_,
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
    EXPECT_EQ(idem::test::sqlite_query_int(db_, side_effects), 0);
    EXPECT_EQ(markers(), 0);
    idem::test::kill_and_reap(child);
  }
  EXPECT_EQ(idem::test::sqlite_query_int(db_, side_effects), 0)
      << "the killed transaction left its side effect";
  EXPECT_EQ(markers(), 0) << "the killed transaction left its marker";

  // The broker redelivers to a fresh process: it runs once and commits both.
  EXPECT_EQ(redeliver("transactional"), "processed=1 duplicate=0 redelivered=0");
  EXPECT_EQ(idem::test::sqlite_query_int(db_, side_effects), 1);
  EXPECT_EQ(markers(), 1);
  // Any later copy is a duplicate.
  EXPECT_EQ(redeliver("transactional"), "processed=0 duplicate=1 redelivered=0");
  EXPECT_EQ(idem::test::sqlite_query_int(db_, side_effects), 1);
}

TEST_F(SqliteCrash, ExclusiveKilledOwnersClaimIsTakenOverAfterItsLease) {
  std::int64_t lease_until_ms = 0;
  {
    ChildProcess child(worker("hang", "exclusive"));
    ASSERT_EQ(child.read_line(), "ready");
    EXPECT_EQ(idem::test::count_lines(effects_, event_), 1);
    idem::test::kill_and_reap(child);
    lease_until_ms = idem::test::sqlite_query_int(
        db_, "SELECT lease_until_ms FROM idem_claims WHERE event_id = '" + event_ + "'");
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
  EXPECT_EQ(idem::test::count_lines(effects_, event_), 2);
  EXPECT_EQ(markers(), 1);
  EXPECT_EQ(idem::test::sqlite_query_int(db_, "SELECT count(*) FROM idem_claims"), 0);
  EXPECT_EQ(redeliver("exclusive"), "processed=0 duplicate=1 redelivered=0");
  EXPECT_EQ(idem::test::count_lines(effects_, event_), 2);
}

}  // namespace
