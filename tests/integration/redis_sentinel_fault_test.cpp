// Failovers under a Sentinel group (scripts/servers.sh with IDEM_TEST_REDIS_SENTINEL=1: a
// primary, its replica and three sentinels monitoring it as "idem", down-after 1 s). A recorder
// keeps marking events while the sentinels promote the replica — asked to (SENTINEL FAILOVER), or
// because the primary was killed with SIGKILL — and must:
//  * end every call, within its deadline, with success or a retryable / in-doubt RedisError;
//  * reach the promoted replica by itself, with no new recorder and no restart;
//  * keep every mark the replica had before the failover (WAIT confirmed it).
// Marks acknowledged by the old primary after the replica was promoted may be lost (replication
// is asynchronous): the tests count them (docs/redis.md, "Redis Sentinel") but assert nothing
// about them. Each test leaves the group whole again: two data nodes, one primary, the replica in
// sync, every sentinel agreeing.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "idem/redis/redis_recorder.hpp"
#include "redis_sentinel_env.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_SENTINEL_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::sentinel;

RedisOptions sentinel_options(const char* name) {
  auto options = idem::test::redis_url_test_options("IDEM_TEST_REDIS_SENTINEL_URL", name);
  options.connect_timeout = 1s;
  options.command_timeout = 2s;
  options.pool_size = 4;
  return options;
}

// What a recorder saw while the group failed over.
struct Marks {
  std::vector<std::string> acknowledged;
  std::vector<std::string> in_doubt;
  int retryable_failures = 0;
};

// Marks events "<tag>-N" until `done` holds after a successful mark, or 60 s. Every call must end
// with success or a retryable / in-doubt RedisError, within its deadlines (connect_timeout +
// command_timeout, and a generous margin: this asserts that no call hangs, not a speed).
Marks mark_through(idem::redis::RedisIdempotencyRecorder& recorder, const RedisOptions& options,
                   const std::string& tag, const std::function<bool()>& done) {
  Marks marks;
  const auto limit = Clock::now() + 60s;
  const auto bound = options.connect_timeout + options.command_timeout + 5s;
  for (int i = 0; Clock::now() < limit; ++i) {
    const std::string id = tag + "-" + std::to_string(i);
    const auto start = Clock::now();
    try {
      recorder.mark_processed("billing", id);
      marks.acknowledged.push_back(id);
      if (done()) break;
    } catch (const RedisError& e) {
      EXPECT_TRUE(e.retryable() || e.in_doubt()) << e.what();
      if (e.in_doubt()) {
        marks.in_doubt.push_back(id);
      } else {
        ++marks.retryable_failures;
      }
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_LT(Clock::now() - start, bound) << "mark_processed(" << id << ") did not end in time";
  }
  return marks;
}

// Marks `before` and makes sure the replica holds them (WAIT), so a failover cannot lose them;
// the primary's port, or 0 (with a failure) when that could not be done.
int mark_replicated(idem::redis::RedisIdempotencyRecorder& recorder,
                    const std::vector<std::string>& before) {
  recorder.mark_processed_many("billing", before);
  const int primary = named_primary();
  const auto acked = primary == 0 ? std::nullopt : ask(primary, {"WAIT", "1", "5000"});
  if (!acked || acked->integer != 1) {
    ADD_FAILURE() << "the replica did not confirm the marks before the failover";
    return 0;
  }
  return primary;
}

class RedisSentinelFailover : public ::testing::Test {
 protected:
  void SetUp() override {
    if (idem::test::env("IDEM_TEST_REDIS_SENTINEL_URL").empty()) GTEST_SKIP();
    ASSERT_TRUE(poll_until(group_whole)) << "the Sentinel group is not whole before the test";
  }
  void TearDown() override {
    if (idem::test::env("IDEM_TEST_REDIS_SENTINEL_URL").empty()) return;
    EXPECT_TRUE(poll_until(group_whole, 60s)) << "the Sentinel group did not become whole again";
  }
};

TEST_F(RedisSentinelFailover, AForcedFailoverIsFollowedWithoutLosingReplicatedMarks) {
  const auto options = sentinel_options("forced");
  idem::redis::RedisIdempotencyRecorder recorder(options);
  const auto before = ids("before", 100);
  const int old_primary = mark_replicated(recorder, before);
  ASSERT_NE(old_primary, 0);

  const auto failover =
      ask(ports_of("IDEM_TEST_REDIS_SENTINEL_PORTS").at(0), {"SENTINEL", "FAILOVER", "idem"});
  ASSERT_TRUE(failover.has_value());
  ASSERT_FALSE(failover->is_error()) << failover->str;

  const Marks marks =
      mark_through(recorder, options, "during", [&] { return switched_from(old_primary); });
  const int new_primary = named_primary();
  ASSERT_NE(new_primary, old_primary) << "the sentinels did not fail over within 60 s";

  // The recorder reaches the promoted replica by itself: its new connections go there.
  idem::redis::ConnectionPool pool(options);
  const auto lease = pool.lease();
  EXPECT_EQ(lease->endpoint(), "127.0.0.1:" + std::to_string(new_primary) + "/0");
  EXPECT_EQ(recorder.is_processed_many("billing", before), std::vector<bool>(before.size(), true));
  recorder.mark_processed("billing", "after");
  EXPECT_TRUE(recorder.is_processed("billing", "after"));
  std::size_t lost = 0;
  for (const auto& id : marks.acknowledged)
    lost += recorder.is_processed("billing", id) ? 0 : 1;
  RecordProperty("acknowledged_during", static_cast<int>(marks.acknowledged.size()));
  RecordProperty("lost_during", static_cast<int>(lost));
  RecordProperty("in_doubt_during", static_cast<int>(marks.in_doubt.size()));
}

TEST_F(RedisSentinelFailover, AKilledPrimaryIsReplacedAndCallsEndWithinTheirDeadlines) {
  const auto options = sentinel_options("killed");
  idem::redis::RedisIdempotencyRecorder recorder(options);
  const auto before = ids("before", 100);
  const int old_primary = mark_replicated(recorder, before);
  ASSERT_NE(old_primary, 0);

  const std::string dir =
      idem::test::env("IDEM_TEST_REDIS_SENTINEL_DIR") + "/" + std::to_string(old_primary);
  pid_t pid = 0;
  std::ifstream(dir + "/redis.pid") >> pid;
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);

  const Marks marks =
      mark_through(recorder, options, "after-kill", [&] { return switched_from(old_primary); });
  const int new_primary = named_primary();
  ASSERT_NE(new_primary, old_primary) << "the sentinels did not promote the replica within 60 s";
  EXPECT_GT(marks.retryable_failures + static_cast<int>(marks.in_doubt.size()), 0)
      << "no call noticed the primary was gone";
  EXPECT_EQ(recorder.is_processed_many("billing", before), std::vector<bool>(before.size(), true));
  for (const auto& id : marks.acknowledged)  // acknowledged by the new primary only
    EXPECT_TRUE(recorder.is_processed("billing", id)) << id;

  // The killed server comes back empty; the sentinels make it the new primary's replica.
  ASSERT_EQ(std::system(("redis-server " + dir + "/redis.conf >/dev/null").c_str()), 0);
}

}  // namespace
