// A failover under the coroutine face: an AsyncRedisRecorder on a redis+sentinel:// URL keeps
// marking while the sentinels promote the replica (SENTINEL FAILOVER), and must end every call
// with success or a retryable / in-doubt RedisError within its deadlines, reach the promoted
// replica by itself (its pipelined connection asks the sentinels again), and keep every mark the
// replica held before the failover. The group is whole again afterwards (redis_sentinel_env.hpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <asio/io_context.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "../async_test_support.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "redis_sentinel_env.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_SENTINEL_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::sentinel;

TEST(RedisAsyncSentinelFailover, AForcedFailoverIsFollowedByThePipelinedConnection) {
  if (idem::test::env("IDEM_TEST_REDIS_SENTINEL_URL").empty()) GTEST_SKIP();
  ASSERT_TRUE(poll_until(group_whole)) << "the Sentinel group is not whole before the test";
  auto options = RedisOptions::from_url(idem::test::env("IDEM_TEST_REDIS_SENTINEL_URL"));
  options.key_prefix = "idemtest:" + std::to_string(::getpid()) + ":async-forced:";
  options.connect_timeout = 1s;
  options.command_timeout = 2s;
  options.min_replicas = 1;  // the marks before the failover are on the replica
  asio::io_context io;
  idem::redis::AsyncRedisRecorder durable(io.get_executor(), options);
  std::vector<std::string> before;
  for (int i = 0; i < 100; ++i)
    before.push_back("before-" + std::to_string(i));
  idem::test::run(io, durable.mark_processed_many("billing", before));

  options.min_replicas = 0;
  idem::redis::AsyncRedisRecorder recorder(io.get_executor(), options);
  const int old_primary = named_primary();
  ASSERT_NE(old_primary, 0);
  const auto failover =
      ask(ports_of("IDEM_TEST_REDIS_SENTINEL_PORTS").at(0), {"SENTINEL", "FAILOVER", "idem"});
  ASSERT_TRUE(failover.has_value());
  ASSERT_FALSE(failover->is_error()) << failover->str;

  const auto bound = options.connect_timeout + options.command_timeout + 5s;
  const auto limit = Clock::now() + 60s;
  bool switched = false;
  int acknowledged_after_switch = 0;
  for (int i = 0; acknowledged_after_switch < 5 && Clock::now() < limit; ++i) {
    const auto start = Clock::now();
    try {
      idem::test::run(io, recorder.mark_processed("billing", "during-" + std::to_string(i)));
      if (switched) ++acknowledged_after_switch;
    } catch (const RedisError& e) {
      EXPECT_TRUE(e.retryable() || e.in_doubt()) << e.what();
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_LT(Clock::now() - start, bound) << "mark " << i << " did not end in time";
    if (!switched) switched = switched_from(old_primary);
  }
  ASSERT_TRUE(switched) << "the sentinels did not fail over within 60 s";
  EXPECT_EQ(acknowledged_after_switch, 5) << "the recorder did not reach the promoted replica";
  EXPECT_EQ(idem::test::run(io, recorder.is_processed_many("billing", before)),
            std::vector<bool>(before.size(), true));
  // Once the old primary is the new one's replica, a write through a connection still open to it
  // would be refused (READONLY): this one must go to the promoted replica.
  EXPECT_TRUE(poll_until(group_whole, 60s)) << "the Sentinel group did not become whole again";
  idem::test::run(io, recorder.mark_processed("billing", "after"));
  EXPECT_TRUE(idem::test::run(io, recorder.is_processed("billing", "after")));
}

}  // namespace
