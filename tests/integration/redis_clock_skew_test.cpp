// Clock skew between processes sharing one Redis server: two recorder/store objects on the same
// key prefix, each with its own ManualClock (tests/integration/clock_skew_cases.hpp).
//
// idem's Redis scripts get `now` from the client's clock; Redis's own clock is used for one thing
// only, reclaiming space: claims and results carry PEXPIREAT (client deadline + expiry_slack),
// which the SERVER judges, and markers carry PX marker_ttl (relative, so client skew does not
// matter). The last cases here pin down those two server-clock interactions with clocks set
// relative to real time (the server's clock is the machine's).
#include <chrono>
#include <memory>

#include "clock_skew_cases.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using idem::testing::ManualClock;
using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::minutes;

class RedisSkewBackend final : public idem::test::SkewBackend {
 public:
  std::shared_ptr<idem::IdempotencyRecorder> recorder(std::shared_ptr<idem::Clock> clock) override {
    return std::make_shared<idem::redis::RedisIdempotencyRecorder>(prefix_.options(clock));
  }
  std::shared_ptr<idem::IdempotencyStore> store(std::shared_ptr<idem::Clock> clock) override {
    return std::make_shared<idem::redis::RedisIdempotencyStore>(prefix_.options(clock));
  }

 private:
  idem::test::RedisTestPrefix prefix_{"skew"};
};

// A ManualClock at the machine's (and so the Redis server's) real time plus `offset`.
std::shared_ptr<ManualClock> real_time_plus(milliseconds offset) {
  return std::make_shared<ManualClock>(
      std::chrono::time_point_cast<idem::WallTime::duration>(std::chrono::system_clock::now()) +
      offset);
}

constexpr milliseconds kLease{10'000};

TEST(RedisServerClock, ClaimOfAClientBehindByLessThanTheSlackStaysOnTheServer) {
  idem::test::RedisTestPrefix prefix("slack-ok");
  auto clock = real_time_plus(-minutes(30));  // default expiry_slack: 1 h
  idem::redis::RedisIdempotencyRecorder a(prefix.options(clock));
  idem::redis::RedisIdempotencyRecorder b(prefix.options(clock));
  ASSERT_EQ(a.claim("orders", "e1", kLease).status, idem::Claim::Status::acquired);
  EXPECT_EQ(b.claim("orders", "e1", kLease).status, idem::Claim::Status::in_progress);
}

TEST(RedisServerClock, ClaimOfAClientBehindByMoreThanTheSlackIsReclaimedByTheServerAtOnce) {
  // The documented limit: client clocks must not run behind the server by more than
  // expiry_slack. Beyond it the server's PEXPIREAT is already past, Redis drops the claim, and
  // the next caller acquires without even a takeover — two owners, whatever the lease.
  idem::test::RedisTestPrefix prefix("slack-exceeded");
  auto options = prefix.options(real_time_plus(-hours(2)));
  options.expiry_slack = hours(1);
  idem::redis::RedisIdempotencyRecorder a(options);
  idem::redis::RedisIdempotencyRecorder b(options);
  const idem::Claim held = a.claim("orders", "e1", kLease);
  ASSERT_EQ(held.status, idem::Claim::Status::acquired);
  const idem::Claim second = b.claim("orders", "e1", kLease);
  EXPECT_EQ(second.status, idem::Claim::Status::acquired);
  EXPECT_FALSE(second.took_over);
  EXPECT_FALSE(a.complete("orders", "e1", held.token));  // fenced: the owner gets LeaseLost
}

TEST(RedisServerClock, StoreClaimOfAClientBehindByMoreThanTheSlackIsGoneBeforeItCompletes) {
  idem::test::RedisTestPrefix prefix("store-slack");
  auto options = prefix.options(real_time_plus(-hours(3)));
  options.expiry_slack = hours(1);
  idem::redis::RedisIdempotencyStore a(options);
  idem::redis::RedisIdempotencyStore b(options);
  const idem::ClaimOutcome held = a.claim("k", std::nullopt, kLease);
  ASSERT_EQ(held.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_EQ(prefix.command({"EXISTS", a.record_key("k")}).integer, 0);
  EXPECT_EQ(b.claim("k", std::nullopt, kLease).status, idem::ClaimOutcome::Status::acquired);
  idem::StoredValue value;
  value.bytes = "v";
  EXPECT_FALSE(a.complete("k", held.token, value, idem::ExecutionReport{}, hours(1)));
}

TEST(RedisServerClock, ResultOfAClientBehindByMoreThanTtlPlusSlackIsGoneFromTheServer) {
  // Behind by slack + 5 s, with a lease of 10 s and a TTL of 1 s: the claim survives on the
  // server (deadline + slack still 5 s ahead), the result does not (4 s past).
  idem::test::RedisTestPrefix prefix("result-slack");
  auto options = prefix.options(real_time_plus(-(hours(1) + std::chrono::seconds(5))));
  options.expiry_slack = hours(1);
  idem::redis::RedisIdempotencyStore store(options);
  const idem::ClaimOutcome held = store.claim("k", std::nullopt, kLease);
  ASSERT_EQ(held.status, idem::ClaimOutcome::Status::acquired);
  idem::StoredValue value;
  value.bytes = "v";
  ASSERT_TRUE(store.complete("k", held.token, value, idem::ExecutionReport{}, milliseconds(1000)));
  // By the writer's own clock the result is live for a second, but the server already dropped
  // it: it is not replayed, and the operation would run again.
  EXPECT_FALSE(store.lookup("k").has_value());
  EXPECT_EQ(prefix.command({"EXISTS", store.record_key("k")}).integer, 0);
}

TEST(RedisServerClock, MarkerTtlIsRelativeSoClientSkewDoesNotChangeIt) {
  idem::test::RedisTestPrefix prefix("marker-ttl");
  for (const milliseconds skew : {milliseconds(-hours(3)), milliseconds(hours(3))}) {
    auto options = prefix.options(real_time_plus(skew));
    options.marker_ttl = hours(1);
    idem::redis::RedisIdempotencyRecorder recorder(options);
    const std::string id = skew.count() < 0 ? "behind" : "ahead";
    recorder.mark_processed("orders", id);
    EXPECT_TRUE(recorder.is_processed("orders", id));
    const long long ttl = prefix.command({"PTTL", recorder.marker_key("orders", id)}).integer;
    EXPECT_GT(ttl, 0) << id;
    EXPECT_LE(ttl, milliseconds(hours(1)).count()) << id;
  }
}

TEST(RedisServerClock, ClaimOfAClientAheadIsKeptOnTheServerUntilItsOwnDeadlinePlusSlack) {
  // The mirror image: a client 3 h ahead writes PEXPIREAT 3 h + lease + slack from now. Liveness
  // is still decided by the readers' clocks (a correct client takes the claim over after its
  // stored deadline); only the space lives that much longer.
  idem::test::RedisTestPrefix prefix("ahead");
  auto options = prefix.options(real_time_plus(hours(3)));
  options.expiry_slack = hours(1);
  idem::redis::RedisIdempotencyRecorder a(options);
  ASSERT_EQ(a.claim("orders", "e1", kLease).status, idem::Claim::Status::acquired);
  const long long ttl = prefix.command({"PTTL", a.claim_key("orders", "e1")}).integer;
  EXPECT_GT(ttl, milliseconds(hours(3)).count());
  EXPECT_LE(ttl, milliseconds(hours(4) + kLease).count());
}

}  // namespace

using idem::test::ClockSkewTest;

INSTANTIATE_TEST_SUITE_P(Redis, ClockSkewTest, ::testing::Values(idem::test::SkewBackendFactory([] {
                           return std::make_unique<RedisSkewBackend>();
                         })));
