// An owner process SIGKILLed mid-operation on Redis; another process takes over after the lease
// and the work completes once more; the dead owner's token is fenced off.
//
// The worker (idem_test_redis_worker hang / hang-key) writes its side effect, tells the test
// "ready" through a pipe and blocks while holding the claim; the test kills it with SIGKILL.
// Leases are 60 s, so they never run out by themselves during the test: a fresh process is
// started with its clock 61 s ahead (--clock-offset-ms), which is how it sees the lease over
// without the test sleeping. Until then, a claim at the last millisecond of the lease is refused.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../integration/redis_test_env.hpp"
#include "../temp_dir.hpp"
#include "idem/event.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/testing/manual_clock.hpp"
#include "worker_process.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using idem::test::ChildProcess;
using namespace std::chrono_literals;

constexpr const char* kLeaseMs = "60000";
constexpr const char* kLaterMs = "61000";  // the fresh process's clock: past the lease

using idem::test::count_lines;
using idem::test::TempDir;

class RedisCrash : public ::testing::Test {
 protected:
  std::vector<std::string> worker(std::vector<std::string> extra) const {
    std::vector<std::string> argv = {
        IDEM_REDIS_WORKER, extra.front(),  "--url",     idem::test::redis_url(),
        "--prefix",        keys_.prefix(), "--effects", effects_,
        "--lease-ms",      kLeaseMs};
    argv.insert(argv.end(), extra.begin() + 1, extra.end());
    return argv;
  }

  // Runs a worker to its end; returns its summary line.
  std::string run(std::vector<std::string> extra) const {
    return idem::test::run_to_end(worker(std::move(extra)));
  }

  // Starts a hanging worker, waits until it holds the claim inside the operation, kills it.
  void start_and_kill(std::vector<std::string> extra, const std::string& item) const {
    ChildProcess child(worker(std::move(extra)));
    ASSERT_EQ(child.read_line(), "ready");
    EXPECT_EQ(count_lines(effects_, item), 1);
    idem::test::kill_and_reap(child);
  }

  long long hash_field(const std::string& key, const std::string& field) const {
    return std::stoll(keys_.command({"HGET", key, field}).str);
  }

  // The n-th space-separated number of a store claim, "1i <token> <lease_until> <fp>"
  // (docs/redis.md §5): 1 is the token, 2 the lease.
  long long claim_number(const std::string& key, int n) const {
    std::istringstream text(keys_.command({"GET", key}).str);
    std::string part;
    for (int i = 0; i <= n; ++i)
      text >> part;
    return std::stoll(part);
  }

  TempDir dir_;
  std::string effects_ = dir_.file("effects.txt");
  idem::test::RedisTestPrefix keys_{"crash"};
};

TEST_F(RedisCrash, KilledConsumersClaimIsTakenOverAndItsTokenFenced) {
  const std::string event = idem::new_event_id();
  const std::string events_file = dir_.file("events.txt");
  std::ofstream(events_file) << event << "\n";
  start_and_kill({"hang", "--consumer", "payments", "--event", event}, event);

  // What the dead owner left: its claim, no marker.
  auto clock = std::make_shared<idem::testing::ManualClock>();
  idem::redis::RedisIdempotencyRecorder recorder(keys_.options(clock));
  const std::string claim_key = recorder.claim_key("payments", event);
  const auto dead_token = static_cast<std::uint64_t>(hash_field(claim_key, "token"));
  const long long lease_until = hash_field(claim_key, "lease_until");
  EXPECT_FALSE(recorder.is_processed("payments", event)) << "killed before complete()";

  // Until the lease ends, the dead owner's claim holds.
  clock->set_wall(idem::WallTime(std::chrono::milliseconds(lease_until - 1)));
  const auto refused = recorder.claim("payments", event, 1s);
  EXPECT_EQ(refused.status, idem::Claim::Status::in_progress);
  EXPECT_EQ(refused.lease_until, idem::WallTime(std::chrono::milliseconds(lease_until)));

  // A fresh process whose clock is past the lease takes over and runs the event again: exclusive
  // mode is at-least-once across a crash between the side effect and complete().
  EXPECT_EQ(run({"consume", "--consumer", "payments", "--events", events_file, "--clock-offset-ms",
                 kLaterMs}),
            "processed=1 duplicate=0 redelivered=0");
  EXPECT_EQ(count_lines(effects_, event), 2);
  EXPECT_TRUE(recorder.is_processed("payments", event));
  EXPECT_EQ(keys_.command({"EXISTS", claim_key}).integer, 0) << "the successor completed";

  // The dead owner's late calls are refused and change nothing.
  EXPECT_FALSE(recorder.complete("payments", event, dead_token));
  EXPECT_FALSE(recorder.release("payments", event, dead_token));
  EXPECT_FALSE(recorder.renew("payments", event, dead_token, 1s));
  EXPECT_EQ(run({"consume", "--consumer", "payments", "--events", events_file}),
            "processed=0 duplicate=1 redelivered=0");
  EXPECT_EQ(count_lines(effects_, event), 2);
}

TEST_F(RedisCrash, KilledOperationsKeyIsTakenOverAndReplayedAfterwards) {
  const std::string key = "payment:" + idem::new_event_id();
  const std::string keys_file = dir_.file("keys.txt");
  std::ofstream(keys_file) << key << "\n";
  start_and_kill({"hang-key", "--key", key}, key);

  auto clock = std::make_shared<idem::testing::ManualClock>();
  idem::redis::RedisIdempotencyStore store(keys_.options(clock));
  // The worker's operation scopes its keys by its name.
  const std::string stored = idem::scoped_idempotency_key("redis-worker", key);
  const std::string record = store.record_key(stored);
  const auto dead_token = static_cast<std::uint64_t>(claim_number(record, 1));
  const long long lease_until = claim_number(record, 2);
  clock->set_wall(idem::WallTime(std::chrono::milliseconds(lease_until - 1)));
  const auto refused = store.claim(stored, std::nullopt, 1s);
  ASSERT_EQ(refused.status, idem::ClaimOutcome::Status::in_progress);
  EXPECT_EQ(refused.record->token, dead_token);

  // A fresh process past the lease executes the key again (a takeover), then it is replayed.
  EXPECT_EQ(run({"run-keys", "--keys", keys_file, "--clock-offset-ms", kLaterMs}),
            "executed=1 replayed=0 joined=0 redelivered=0 took_over=1");
  EXPECT_EQ(count_lines(effects_, key), 2);
  clock->set_wall(idem::WallTime(std::chrono::milliseconds(lease_until + 1)));
  const auto done = store.lookup(stored);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->state, idem::IdempotencyRecord::State::completed);
  EXPECT_GT(done->token, dead_token);
  EXPECT_EQ(*done->value.bytes, "value:" + key);

  // The dead owner's late complete is refused; the result stays the successor's.
  idem::StoredValue stale;
  stale.bytes = "stale";
  EXPECT_FALSE(store.complete(stored, dead_token, stale, {}, 1h));
  EXPECT_FALSE(store.release(stored, dead_token));
  EXPECT_EQ(*store.lookup(stored)->value.bytes, "value:" + key);
  EXPECT_EQ(run({"run-keys", "--keys", keys_file, "--clock-offset-ms", kLaterMs}),
            "executed=0 replayed=1 joined=0 redelivered=0 took_over=0");
  EXPECT_EQ(count_lines(effects_, key), 2);
}

}  // namespace
