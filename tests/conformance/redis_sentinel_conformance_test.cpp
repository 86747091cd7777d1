// The recorder and store conformance suites (idem/testing/*_conformance.hpp) against a primary
// found through Redis Sentinel: scripts/servers.sh with IDEM_TEST_REDIS_SENTINEL=1 starts a
// primary, its replica and three sentinels (IDEM_TEST_REDIS_SENTINEL_URL, redis+sentinel://);
// then again with min_replicas=1 (every write waits for the replica).
// Each test runs under a key prefix of its own. Failovers are in
// tests/integration/redis_sentinel_fault_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

#include <unistd.h>

#include "../server_env.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "idem/testing/store_conformance.hpp"

IDEM_SERVER_TEST_ENVIRONMENT(redis_sentinel_environment, "IDEM_TEST_REDIS_SENTINEL_URL",
                             "Redis Sentinel group",
                             "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/idem");

namespace {

std::string unique_prefix(const char* name) {
  static std::atomic<int> counter{0};
  return "idemtest:" + std::to_string(::getpid()) + ":" + std::to_string(counter++) + ":" + name +
         ":";
}

idem::redis::RedisOptions sentinel_options(const char* name,
                                           std::shared_ptr<idem::Clock> clock = nullptr,
                                           std::size_t min_replicas = 0) {
  auto options =
      idem::redis::RedisOptions::from_url(idem::test::env("IDEM_TEST_REDIS_SENTINEL_URL"));
  options.key_prefix = unique_prefix(name);
  options.clock = std::move(clock);
  options.min_replicas = min_replicas;
  return options;
}

struct SentinelRecorderFactory {
  static constexpr bool kSupportsClaims = true;
  static constexpr bool kSupportsTransactions = false;
  static constexpr int kConcurrentIds = 100;

  std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::redis::RedisIdempotencyRecorder>(
        sentinel_options("recorder", std::move(clock)));
  }
};

struct SentinelStoreFactory {
  static constexpr int kRaceKeys = 20;

  std::shared_ptr<idem::IdempotencyStore> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::redis::RedisIdempotencyStore>(
        sentinel_options("store", std::move(clock)));
  }
};

// The same with min_replicas=1: every write waits for the replica (WAIT), and nothing else changes.
struct DurableRecorderFactory : SentinelRecorderFactory {
  std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::redis::RedisIdempotencyRecorder>(
        sentinel_options("durable-recorder", std::move(clock), 1));
  }
};

struct DurableStoreFactory : SentinelStoreFactory {
  std::shared_ptr<idem::IdempotencyStore> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::redis::RedisIdempotencyStore>(
        sentinel_options("durable-store", std::move(clock), 1));
  }
};

// A name no sentinel monitors is a configuration mistake: said at once, not retried.
TEST(RedisSentinel, AnUnknownMasterNameIsAClearNonRetryableError) {
  auto options = sentinel_options("unknown");
  options.sentinel_master = "no-such-primary";
  try {
    idem::redis::RedisIdempotencyRecorder recorder(options);
    (void)recorder.is_processed("billing", "event-1");
    FAIL() << "a name no sentinel monitors was accepted";
  } catch (const idem::redis::RedisError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-primary"), std::string::npos) << e.what();
    EXPECT_FALSE(e.retryable()) << e.what();
    EXPECT_EQ(e.code(), idem::ErrorCode::config_error);
  }
}

// The pool's connections go to the server the sentinels name, and it is the primary.
TEST(RedisSentinel, ConnectionsReachThePrimaryTheSentinelsName) {
  const auto options = sentinel_options("role");
  idem::redis::ConnectionPool pool(options);
  auto connection = pool.lease();
  const auto role = connection->command({"ROLE"}, idem::redis::CommandKind::read);
  ASSERT_EQ(role.type, idem::redis::RedisReply::Type::array);
  EXPECT_EQ(role.elements.at(0).str, "master");
  const auto info = connection->command({"CONFIG", "GET", "port"}, idem::redis::CommandKind::read);
  ASSERT_EQ(info.elements.size(), 2u);
  EXPECT_EQ(connection->endpoint(), "127.0.0.1:" + info.elements[1].str + "/0");
}

}  // namespace

INSTANTIATE_RECORDER_CONFORMANCE(RedisSentinel, SentinelRecorderFactory);
INSTANTIATE_STORE_CONFORMANCE(RedisSentinel, SentinelStoreFactory);
INSTANTIATE_RECORDER_CONFORMANCE(RedisSentinelMinReplicas, DurableRecorderFactory);
INSTANTIATE_STORE_CONFORMANCE(RedisSentinelMinReplicas, DurableStoreFactory);
