// Processes SIGKILLed mid-operation on PostgreSQL, and a waiter in another process woken by
// NOTIFY.
//
//   transactional consumer: the handler's row was written through the open transaction, so
//     after the kill neither it nor the marker exists (the server rolls the dead session back);
//     a fresh process then runs the event exactly once.
//   exclusive consumer: the killed owner's claim blocks other deliveries until its lease has
//     passed; a process whose clock is past the lease takes it over and runs the event again
//     (the documented at-least-once window of exclusive mode across a crash); the dead owner's
//     token is fenced off.
//   store: an operation killed while running keeps its key in progress (its lease is no longer
//     renewed); past the lease the next caller takes over, executes once, completes, and a late
//     complete with the old token is refused.
// Time never passes by sleeping: the successor's clock is set past the lease instead.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../postgres_test_support.hpp"
#include "idem/event.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"
#include "postgres_worker.hpp"
#include "worker_process.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

using idem::test::ChildProcess;
using idem::test::count_lines;
using idem::test::kill_and_reap;
using namespace std::chrono_literals;
namespace pg = idem::test::pg;

constexpr auto kLease = std::chrono::seconds(60);

// A ManualClock at the system's wall time plus `ahead`: a process that finds a lease passed.
std::shared_ptr<idem::testing::ManualClock> clock_ahead(std::chrono::milliseconds ahead) {
  return std::make_shared<idem::testing::ManualClock>(
      std::chrono::time_point_cast<idem::WallTime::duration>(std::chrono::system_clock::now() +
                                                             ahead));
}

class PostgresCrash : public ::testing::Test {
 protected:
  void SetUp() override {
    idem::test::pg_worker::create_tables(schema_);
    effects_ =
        (std::filesystem::temp_directory_path() / ("idem-pg-crash-" + schema_.name() + ".txt"))
            .string();
  }
  void TearDown() override { std::filesystem::remove(effects_); }

  std::vector<std::string> worker(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {idem::test::pg_worker::self_path(), "--postgres-worker"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--schema");
    argv.push_back(schema_.name());
    return argv;
  }

  // Delivers the event once more in a fresh process; returns its summary line.
  std::string redeliver(const std::string& mode, long long clock_ahead_ms = 0) {
    const std::string events = idem::test::write_lines(effects_ + ".events", {event_});
    return idem::test::run_to_end(
        worker({"consume", "--mode", mode, "--consumer", "inventory", "--events", events,
                "--effects", effects_, "--clock-ahead-ms", std::to_string(clock_ahead_ms)}));
  }

  long long markers() const {
    return pg::query_int("SELECT count(*) FROM " + schema_.table("processed_log"));
  }
  long long side_effects() const {
    return pg::query_int("SELECT count(*) FROM " + schema_.table("side_effects"));
  }

  pg::TempSchema schema_;
  std::string effects_;
  std::string event_ = idem::new_event_id();
};

TEST_F(PostgresCrash, TransactionalKilledMidHandlerLeavesNeitherMarkerNorSideEffect) {
  {
    ChildProcess child(
        worker({"hang", "--mode", "transactional", "--consumer", "inventory", "--event", event_}));
    ASSERT_EQ(child.read_line(), "ready");
    EXPECT_EQ(side_effects(), 0) << "uncommitted: invisible to everyone else";
    kill_and_reap(child);
  }
  EXPECT_EQ(side_effects(), 0) << "the killed transaction left its side effect";
  EXPECT_EQ(markers(), 0) << "the killed transaction left its marker";
  // The redelivery's marker insert waits for the server to roll the dead session back, then
  // runs the handler once.
  EXPECT_EQ(redeliver("transactional"), "processed=1 duplicate=0 redelivered=0");
  EXPECT_EQ(side_effects(), 1);
  EXPECT_EQ(markers(), 1);
  EXPECT_EQ(redeliver("transactional"), "processed=0 duplicate=1 redelivered=0");
  EXPECT_EQ(side_effects(), 1);
}

TEST_F(PostgresCrash, ExclusiveKilledOwnersClaimIsTakenOverAfterItsLease) {
  {
    ChildProcess child(worker({"hang", "--mode", "exclusive", "--consumer", "inventory", "--event",
                               event_, "--effects", effects_, "--lease-ms",
                               std::to_string(std::chrono::milliseconds(kLease).count())}));
    ASSERT_EQ(child.read_line(), "ready");
    EXPECT_EQ(count_lines(effects_, event_), 1);
    kill_and_reap(child);
  }
  EXPECT_EQ(markers(), 0) << "killed before complete(): not marked";
  {
    // Before the lease ends, another delivery is refused (and would be redelivered later).
    idem::postgres::PostgresIdempotencyRecorder now(schema_.options());
    EXPECT_EQ(now.claim("inventory", event_, 1s).status, idem::Claim::Status::in_progress);
  }
  // A process whose clock is past the lease takes the claim over and runs the event again.
  const long long past_lease = std::chrono::milliseconds(kLease + 5s).count();
  EXPECT_EQ(redeliver("exclusive", past_lease), "processed=1 duplicate=0 redelivered=0");
  EXPECT_EQ(count_lines(effects_, event_), 2) << "the at-least-once window of exclusive mode";
  EXPECT_EQ(markers(), 1);
  EXPECT_EQ(redeliver("exclusive"), "processed=0 duplicate=1 redelivered=0");
  EXPECT_EQ(count_lines(effects_, event_), 2);
}

TEST_F(PostgresCrash, AKilledOwnersLateCompleteIsRefused) {
  std::uint64_t old_token = 0;
  {
    ChildProcess child(
        worker({"claim-hang", "--consumer", "inventory", "--event", event_, "--lease-ms",
                std::to_string(std::chrono::milliseconds(kLease).count())}));
    const std::string line = child.read_line();
    ASSERT_EQ(line.rfind("token ", 0), 0u) << line;
    old_token = std::stoull(line.substr(6));
    kill_and_reap(child);
  }
  idem::postgres::PostgresOptions options = schema_.options();
  options.clock = clock_ahead(kLease + 1s);
  idem::postgres::PostgresIdempotencyRecorder successor(options);
  const auto claim = successor.claim("inventory", event_, 10s);
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  EXPECT_TRUE(claim.took_over);
  EXPECT_GT(claim.token, old_token);
  EXPECT_FALSE(successor.complete("inventory", event_, old_token)) << "the dead owner is fenced";
  EXPECT_FALSE(successor.release("inventory", event_, old_token));
  EXPECT_FALSE(successor.is_processed("inventory", event_));
  EXPECT_TRUE(successor.complete("inventory", event_, claim.token));
  EXPECT_FALSE(successor.complete("inventory", event_, old_token));
  EXPECT_EQ(markers(), 1);
}

TEST_F(PostgresCrash, AKilledOperationIsTakenOverAndCompletesOnce) {
  const std::string key = "pay:" + event_;
  // The worker's operation ("operation_hang") scopes the key; so does the successor below.
  const std::string stored = idem::scoped_idempotency_key("operation_hang", key);
  std::uint64_t old_token = 0;
  {
    ChildProcess child(worker({"operation-hang", "--key", key, "--lease-ms",
                               std::to_string(std::chrono::milliseconds(kLease).count())}));
    ASSERT_EQ(child.read_line(), "ready");
    idem::postgres::PostgresIdempotencyStore observer(schema_.options());
    const auto record = observer.lookup(stored);
    ASSERT_TRUE(record.has_value());
    EXPECT_EQ(record->state, idem::IdempotencyRecord::State::in_progress);
    old_token = record->token;
    kill_and_reap(child);
  }
  idem::postgres::PostgresOptions options = schema_.options();
  options.clock = clock_ahead(kLease + 1s);
  auto store = std::make_shared<idem::postgres::PostgresIdempotencyStore>(options);
  int runs = 0;
  auto pay = idem::resilient(
      [&](const std::string&) {
        ++runs;
        return std::string("receipt");
      },
      {.name = "operation_hang",
       .idempotency_key = [](const std::string& k) { return k; },
       .idempotency_store = store,
       .idempotency_in_progress = idem::InProgressPolicy::reject,
       .clock = options.clock});
  const auto first = pay(key);
  EXPECT_EQ(first.value, "receipt");
  EXPECT_EQ(first.report.metadata.at("idempotency_status"), "executed");
  const auto second = pay(key);
  EXPECT_EQ(second.report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(runs, 1);
  idem::StoredValue late;
  late.bytes = "late";
  EXPECT_FALSE(store->complete(stored, old_token, late, idem::ExecutionReport{}, 1h))
      << "the killed owner's token is fenced off";
  EXPECT_EQ(store->lookup(stored)->value.bytes, std::optional<std::string>("receipt"));
}

TEST_F(PostgresCrash, AWaiterInAnotherProcessIsWokenByNotify) {
  idem::postgres::PostgresIdempotencyStore owner(schema_.options());
  const auto claim = owner.claim("job-1", std::nullopt, 1h);
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  ChildProcess child(worker({"wait", "--key", "job-1"}));
  ASSERT_EQ(child.read_line(), "blocked");
  idem::StoredValue value;
  value.bytes = "done";
  ASSERT_TRUE(owner.complete("job-1", claim.token, value, idem::ExecutionReport{}, 1h));
  // The child re-checks only hourly: it can only have returned because the NOTIFY woke it.
  EXPECT_EQ(idem::test::summary_at_exit(child), "completed notified=1 rechecks=0");
}

// A waiting process holds its key's interest lock (complete() notifies only keys somebody
// waits on); killed, its session ends and takes the lock with it, and the key completes as usual.
TEST_F(PostgresCrash, AKilledWaiterTakesItsInterestInTheKeyWithIt) {
  idem::postgres::PostgresIdempotencyStore owner(schema_.options());
  const auto claim = owner.claim("job-1", std::nullopt, 1h);
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  const std::string interest =
      "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND classid = " +
      std::to_string(0x6964656d) + " AND objid = (hashtext('" + schema_.name() +
      "_records:job-1')::bigint & 4294967295)::oid";
  {
    ChildProcess child(worker({"wait", "--key", "job-1"}));
    ASSERT_EQ(child.read_line(), "blocked");
    EXPECT_EQ(pg::query_int(interest), 1) << "the waiter's listener holds the key's lock";
    kill_and_reap(child);
  }
  ASSERT_TRUE(pg::eventually([&] { return pg::query_int(interest) == 0; }));
  idem::StoredValue value;
  value.bytes = "done";
  ASSERT_TRUE(owner.complete("job-1", claim.token, value, idem::ExecutionReport{}, 1h));
  EXPECT_EQ(owner.lookup("job-1")->state, idem::IdempotencyRecord::State::completed);
}

}  // namespace
