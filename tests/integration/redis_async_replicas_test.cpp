// (Named _async_ so the build links the coroutine face: both faces are tested here.)
// min_replicas: every write waits (WAIT) for its replicas, and a write they do not confirm is in
// doubt, never a success. Against real replicas: the Sentinel group's primary and replica
// (scripts/servers.sh with IDEM_TEST_REDIS_SENTINEL=1, reached by their own addresses and through
// the sentinels) and the Redis Cluster, whose three primaries have a replica each (each primary
// waits for its own).
#include <gtest/gtest.h>

#include <unistd.h>

#include <asio/io_context.hpp>
#include <chrono>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../async_test_support.hpp"
#include "../server_env.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "redis_names.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_SENTINEL_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::redis_names;

RedisOptions through_sentinels(const char* name, std::size_t min_replicas) {
  auto options = idem::test::redis_url_test_options("IDEM_TEST_REDIS_SENTINEL_URL", name);
  options.min_replicas = min_replicas;
  options.replica_timeout = 200ms;
  return options;
}

// The data node the sentinels do not name as primary: the replica.
int replica_port() {
  ConnectionPool pool(through_sentinels("probe", 0));
  const auto lease = pool.lease();
  const std::string primary = lease->endpoint();
  std::istringstream ports(idem::test::env("IDEM_TEST_REDIS_SENTINEL_DATA_PORTS"));
  int port = 0;
  while (ports >> port) {
    if (primary.find(":" + std::to_string(port) + "/") == std::string::npos) return port;
  }
  return 0;
}

long long keys_on(int port, const std::string& key_prefix) {
  RedisOptions options;
  options.port = port;
  ConnectionPool pool(options);
  auto connection = pool.lease();
  long long n = 0;
  std::string cursor = "0";
  do {
    const auto page = connection->command(
        {"SCAN", cursor, "MATCH", key_prefix + "*", "COUNT", "1000"}, CommandKind::read);
    cursor = page.elements.at(0).str;
    n += static_cast<long long>(page.elements.at(1).elements.size());
  } while (cursor != "0");
  return n;
}

std::vector<std::string> ids(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i)
    out.push_back("event-" + std::to_string(i));
  return out;
}

class RedisMinReplicas : public ::testing::Test {
 protected:
  void SetUp() override {
    if (idem::test::env("IDEM_TEST_REDIS_SENTINEL_URL").empty()) GTEST_SKIP();
  }
};

// Once a mark returns, the replica already holds it: a failover now cannot lose it.
TEST_F(RedisMinReplicas, AMarkReturnsOnlyOnceTheReplicaHoldsIt) {
  const auto options = through_sentinels("confirmed", 1);
  idem::redis::RedisIdempotencyRecorder recorder(options);
  const int replica = replica_port();
  ASSERT_NE(replica, 0);
  recorder.mark_processed("billing", "event-0");
  EXPECT_EQ(keys_on(replica, options.key_prefix), 1);
  recorder.mark_processed_many("billing", ids(100));  // event-0 again, and 99 new ones
  EXPECT_EQ(keys_on(replica, options.key_prefix), 100);
}

// One replica cannot confirm for two: the write is on the primary, but reported in doubt.
TEST_F(RedisMinReplicas, AWriteTooFewReplicasConfirmIsInDoubtOnEveryFace) {
  const auto options = through_sentinels("short", 2);
  idem::redis::RedisIdempotencyRecorder recorder(options);
  try {
    recorder.mark_processed("billing", "event-1");
    FAIL() << "a mark one replica confirmed counted as confirmed by two";
  } catch (const RedisError& e) {
    EXPECT_TRUE(e.in_doubt()) << e.what();
    EXPECT_TRUE(e.retryable()) << "a mark is safe to repeat: " << e.what();
    EXPECT_NE(std::string(e.what()).find("1 of the 2 replicas"), std::string::npos) << e.what();
  }
  // In doubt, and in fact written on the primary.
  EXPECT_TRUE(recorder.is_processed("billing", "event-1"));
  // Reads never wait.
  EXPECT_FALSE(recorder.is_processed("billing", "event-2"));

  idem::redis::RedisIdempotencyStore store(options);
  try {
    (void)store.claim("payment-1", std::nullopt, 10s);
    FAIL() << "a claim one replica confirmed counted as confirmed by two";
  } catch (const RedisError& e) {
    EXPECT_TRUE(e.in_doubt()) << e.what();
  }

  // The coroutine face, on the primary's own address (it does not ask sentinels).
  idem::redis::ConnectionPool pool(options);
  const auto lease = pool.lease();
  auto direct = RedisOptions::from_url("redis://" + lease->endpoint());
  direct.key_prefix = options.key_prefix;
  direct.min_replicas = 2;
  direct.replica_timeout = 200ms;
  asio::io_context io;
  idem::redis::AsyncRedisRecorder async_recorder(io.get_executor(), direct);
  try {
    idem::test::run(io, async_recorder.mark_processed("billing", "event-3"));
    FAIL() << "the coroutine face counted one replica as two";
  } catch (const RedisError& e) {
    EXPECT_TRUE(e.in_doubt()) << e.what();
    EXPECT_TRUE(e.retryable()) << e.what();
  }
  direct.min_replicas = 1;
  idem::redis::AsyncRedisRecorder confirmed(io.get_executor(), direct);
  idem::test::run(io, confirmed.mark_processed("billing", "event-4"));
  EXPECT_TRUE(idem::test::run(io, confirmed.is_processed("billing", "event-4")));
}

// On a cluster each primary waits for its own replica; a batch split over the three confirms.
TEST_F(RedisMinReplicas, EachClusterPrimaryWaitsForItsReplica) {
  const std::string url = idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL");
  if (url.empty()) GTEST_SKIP() << "no IDEM_TEST_REDIS_CLUSTER_URL";
  auto options = RedisOptions::from_url(url + "?min_replicas=1&replica_timeout=500ms");
  options.key_prefix = idem::test::redis_url_test_prefix("cluster");
  idem::redis::RedisIdempotencyRecorder recorder(options);
  const auto batch = ids(300);
  recorder.mark_processed_many("billing", batch);
  EXPECT_EQ(recorder.is_processed_many("billing", batch), std::vector<bool>(batch.size(), true));
  idem::redis::RedisIdempotencyStore store(options);
  const auto outcome = store.claim("payment-1", std::nullopt, 10s);
  ASSERT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  idem::StoredValue value;
  value.bytes = "ok";
  EXPECT_TRUE(store.complete("payment-1", outcome.token, value, idem::ExecutionReport{}, 60s));
  options.min_replicas = 2;  // one replica per primary cannot confirm for two
  idem::redis::RedisIdempotencyRecorder short_of_replicas(options);
  EXPECT_THROW(short_of_replicas.mark_processed_many("billing", ids(10)), RedisError);
}

}  // namespace
