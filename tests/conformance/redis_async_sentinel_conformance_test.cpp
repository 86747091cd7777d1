// The async recorder and store suites (idem/testing/async_*_conformance.hpp), and the blocking
// recorder and store suites through BlockingOverAsyncRecorder / BlockingOverAsyncStore (the
// operator calls answered by the blocking Redis recorder / store on the same prefix), through a
// redis+sentinel:// URL on the coroutine face: each new connection asks a sentinel for the
// primary and checks its ROLE
// (scripts/servers.sh with IDEM_TEST_REDIS_SENTINEL=1 starts the primary, its replica and three
// sentinels). Each test runs under a key prefix of its own; then the coroutine face's own errors
// for a master name no sentinel monitors and for sentinels that do not answer.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>

#include "../free_port.hpp"
#include "../server_env.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/testing/async_recorder_conformance.hpp"
#include "idem/testing/async_store_conformance.hpp"
#include "idem/testing/async_support.hpp"
#include "idem/testing/blocking_over_async.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "idem/testing/store_conformance.hpp"

IDEM_SERVER_TEST_ENVIRONMENT(redis_sentinel_environment, "IDEM_TEST_REDIS_SENTINEL_URL",
                             "Redis Sentinel group",
                             "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/idem");

namespace {

constexpr idem::async::RecorderCapabilities kClaims{.claims = true, .transactions = false};

idem::redis::RedisOptions sentinel_options(const char* name,
                                           std::shared_ptr<idem::Clock> clock = nullptr) {
  static std::atomic<int> counter{0};
  auto options =
      idem::redis::RedisOptions::from_url(idem::test::env("IDEM_TEST_REDIS_SENTINEL_URL"));
  options.key_prefix =
      "idemtest:" + std::to_string(::getpid()) + ":" + std::to_string(counter++) + ":" + name + ":";
  options.clock = std::move(clock);
  return options;
}

struct SentinelAsyncRecorderFactory {
  static constexpr idem::async::RecorderCapabilities kCapabilities = kClaims;
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::redis::AsyncRedisRecorder>(io.executor(),
                                                             sentinel_options("async-recorder"));
  }
  idem::testing::IoThread io;
};

struct SentinelAsyncStoreFactory {
  std::shared_ptr<idem::async::AsyncStore> make() {
    return std::make_shared<idem::redis::AsyncRedisStore>(io.executor(),
                                                          sentinel_options("async-store"));
  }
  idem::testing::IoThread io;
};

struct BlockingOverAsyncSentinelRecorderFactory {
  static constexpr bool kSupportsClaims = true;
  static constexpr bool kSupportsTransactions = false;
  static constexpr int kConcurrentIds = 100;
  static std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    const auto options = sentinel_options("bova-recorder", std::move(clock));
    return std::make_shared<idem::testing::BlockingOverAsyncRecorder>(
        [options](asio::any_io_executor executor) {
          return std::make_shared<idem::redis::AsyncRedisRecorder>(std::move(executor), options);
        },
        std::make_shared<idem::redis::RedisIdempotencyRecorder>(options));
  }
};

struct BlockingOverAsyncSentinelStoreFactory {
  static constexpr int kRaceKeys = 20;
  static std::shared_ptr<idem::IdempotencyStore> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    const auto options = sentinel_options("bova-store", std::move(clock));
    return std::make_shared<idem::testing::BlockingOverAsyncStore>(
        [options](asio::any_io_executor executor) {
          return std::make_shared<idem::redis::AsyncRedisStore>(std::move(executor), options);
        },
        std::make_shared<idem::redis::RedisIdempotencyStore>(options));
  }
};

TEST(RedisAsyncSentinel, AnUnknownMasterNameIsAClearNonRetryableError) {
  if (idem::test::env("IDEM_TEST_REDIS_SENTINEL_URL").empty()) GTEST_SKIP();
  auto options = sentinel_options("unknown");
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

INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(RedisAsyncSentinel, SentinelAsyncRecorderFactory);
INSTANTIATE_ASYNC_STORE_CONFORMANCE(RedisAsyncSentinelStore, SentinelAsyncStoreFactory);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncRedisSentinel,
                                 BlockingOverAsyncSentinelRecorderFactory);
INSTANTIATE_STORE_CONFORMANCE(BlockingOverAsyncRedisSentinelStore,
                              BlockingOverAsyncSentinelStoreFactory);
