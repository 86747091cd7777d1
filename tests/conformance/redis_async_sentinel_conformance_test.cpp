// The async recorder and store suites (idem/testing/async_*_conformance.hpp), and the blocking
// recorder and store suites through BlockingOverAsyncRecorder / BlockingOverAsyncStore (the
// operator calls answered by the blocking Redis recorder / store on the same prefix), through a
// redis+sentinel:// URL on the coroutine face: each new connection asks a sentinel for the
// primary and checks its ROLE
// (scripts/servers.sh with IDEM_TEST_REDIS_SENTINEL=1 starts the primary, its replica and three
// sentinels). Each test runs under a key prefix of its own; then the coroutine face's own errors
// for a master name no sentinel monitors and for sentinels that do not answer.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "../free_port.hpp"
#include "../integration/redis_test_env.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/testing/async_recorder_conformance.hpp"
#include "idem/testing/async_store_conformance.hpp"
#include "idem/testing/async_support.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "idem/testing/store_conformance.hpp"
#include "redis_async_topology_factories.hpp"

IDEM_SERVER_TEST_ENVIRONMENT(redis_sentinel_environment, "IDEM_TEST_REDIS_SENTINEL_URL",
                             "Redis Sentinel group",
                             "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/idem");

namespace {

using Sentinel = idem::test::RedisSentinelTopology;

TEST(RedisAsyncSentinel, AnUnknownMasterNameIsAClearNonRetryableError) {
  if (idem::test::env("IDEM_TEST_REDIS_SENTINEL_URL").empty()) GTEST_SKIP();
  auto options = Sentinel::options("unknown");
  options.sentinel_master = "no-such-primary";
  asio::io_context io;
  idem::redis::AsyncRedisRecorder recorder(io.get_executor(), options);
  try {
    (void)idem::testing::async_detail::run(io, recorder.is_processed("billing", "event-1"));
    FAIL() << "a name no sentinel monitors was accepted";
  } catch (const idem::redis::RedisError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-primary"), std::string::npos) << e.what();
    EXPECT_FALSE(e.retryable()) << e.what();
    EXPECT_EQ(e.code(), idem::ErrorCode::config_error);
  }
}

TEST(RedisAsyncSentinel, SentinelsThatDoNotAnswerAreARetryableError) {
  auto options = idem::redis::RedisOptions::from_url(
      "redis+sentinel://127.0.0.1:" + std::to_string(idem::test::unused_loopback_port()) +
      ",127.0.0.1:" + std::to_string(idem::test::unused_loopback_port()) +
      "/idem?connect_timeout=500ms");
  asio::io_context io;
  idem::redis::AsyncRedisRecorder recorder(io.get_executor(), options);
  try {
    (void)idem::testing::async_detail::run(io, recorder.is_processed("billing", "event-1"));
    FAIL() << "no sentinel answers, yet a call succeeded";
  } catch (const idem::redis::RedisError& e) {
    EXPECT_TRUE(e.retryable()) << e.what();
    EXPECT_NE(std::string(e.what()).find("no sentinel named the primary"), std::string::npos)
        << e.what();
  }
}

}  // namespace

IDEM_INSTANTIATE_REDIS_ASYNC_TOPOLOGY_CONFORMANCE(Sentinel, Sentinel);
