// The recorder and store conformance suites (idem/testing/*_conformance.hpp) against a primary
// found through Redis Sentinel: scripts/servers.sh with IDEM_TEST_REDIS_SENTINEL=1 starts a
// primary, its replica and three sentinels (IDEM_TEST_REDIS_SENTINEL_URL, redis+sentinel://);
// then again with min_replicas=1 (every write waits for the replica).
// Each test runs under a key prefix of its own. Failovers are in
// tests/integration/redis_sentinel_fault_test.cpp.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "../integration/redis_test_env.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "idem/testing/store_conformance.hpp"
#include "redis_topology_factories.hpp"

IDEM_SERVER_TEST_ENVIRONMENT(redis_sentinel_environment, "IDEM_TEST_REDIS_SENTINEL_URL",
                             "Redis Sentinel group",
                             "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/idem");

namespace {

using Sentinel = idem::test::RedisSentinelTopology;

// The same with min_replicas=1: every write waits for the replica (WAIT), and nothing else changes.
struct SentinelMinReplicas {
  static idem::redis::RedisOptions options(std::string_view name,
                                           std::shared_ptr<idem::Clock> clock = nullptr) {
    auto options = Sentinel::options(name, std::move(clock));
    options.min_replicas = 1;
    return options;
  }
};

// A name no sentinel monitors is a configuration mistake: said at once, not retried.
TEST(RedisSentinel, AnUnknownMasterNameIsAClearNonRetryableError) {
  auto options = Sentinel::options("unknown");
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
  const auto options = Sentinel::options("role");
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

INSTANTIATE_RECORDER_CONFORMANCE(RedisSentinel, idem::test::RedisTopologyRecorderFactory<Sentinel>);
INSTANTIATE_STORE_CONFORMANCE(RedisSentinel, idem::test::RedisTopologyStoreFactory<Sentinel>);
INSTANTIATE_RECORDER_CONFORMANCE(RedisSentinelMinReplicas,
                                 idem::test::RedisTopologyRecorderFactory<SentinelMinReplicas>);
INSTANTIATE_STORE_CONFORMANCE(RedisSentinelMinReplicas,
                              idem::test::RedisTopologyStoreFactory<SentinelMinReplicas>);
