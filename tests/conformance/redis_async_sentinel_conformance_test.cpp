// The async recorder and store cases (tests/async_*_cases.hpp) through a redis+sentinel:// URL on
// the coroutine face: each new connection asks a sentinel for the primary and checks its ROLE
// (scripts/servers.sh with IDEM_TEST_REDIS_SENTINEL=1 starts the primary, its replica and three
// sentinels). Each test runs under a key prefix of its own; then the coroutine face's own errors
// for a master name no sentinel monitors and for sentinels that do not answer.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>

#include "../async_recorder_cases.hpp"
#include "../async_store_cases.hpp"
#include "../async_test_support.hpp"
#include "../free_port.hpp"
#include "../server_env.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "idem/redis/redis_error.hpp"

IDEM_SERVER_TEST_ENVIRONMENT(redis_sentinel_environment, "IDEM_TEST_REDIS_SENTINEL_URL",
                             "Redis Sentinel group",
                             "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/idem");

namespace {

constexpr idem::async::RecorderCapabilities kClaims{.claims = true, .transactions = false};

idem::redis::RedisOptions sentinel_options(const char* name) {
  static std::atomic<int> counter{0};
  auto options =
      idem::redis::RedisOptions::from_url(idem::test::env("IDEM_TEST_REDIS_SENTINEL_URL"));
  options.key_prefix =
      "idemtest:" + std::to_string(::getpid()) + ":" + std::to_string(counter++) + ":" + name + ":";
  return options;
}

struct SentinelAsyncRecorderFactory {
  static constexpr idem::async::RecorderCapabilities kCapabilities = kClaims;
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::redis::AsyncRedisRecorder>(io.executor(),
                                                             sentinel_options("async-recorder"));
  }
  idem::test::IoThread io;
};

struct SentinelAsyncStoreFactory {
  std::shared_ptr<idem::async::AsyncStore> make() {
    return std::make_shared<idem::redis::AsyncRedisStore>(io.executor(),
                                                          sentinel_options("async-store"));
  }
  idem::test::IoThread io;
};

TEST(RedisAsyncSentinel, AnUnknownMasterNameIsAClearNonRetryableError) {
  if (idem::test::env("IDEM_TEST_REDIS_SENTINEL_URL").empty()) GTEST_SKIP();
  auto options = sentinel_options("unknown");
  options.sentinel_master = "no-such-primary";
  asio::io_context io;
  idem::redis::AsyncRedisRecorder recorder(io.get_executor(), options);
  try {
    (void)idem::test::run(io, recorder.is_processed("billing", "event-1"));
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
    (void)idem::test::run(io, recorder.is_processed("billing", "event-1"));
    FAIL() << "no sentinel answers, yet a call succeeded";
  } catch (const idem::redis::RedisError& e) {
    EXPECT_TRUE(e.retryable()) << e.what();
    EXPECT_NE(std::string(e.what()).find("no sentinel named the primary"), std::string::npos)
        << e.what();
  }
}

}  // namespace

INSTANTIATE_ASYNC_RECORDER_CASES(RedisAsyncSentinel, SentinelAsyncRecorderFactory);
INSTANTIATE_ASYNC_STORE_CASES(RedisAsyncSentinelStore, SentinelAsyncStoreFactory);
