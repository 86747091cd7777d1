// The recorder and store conformance suites (idem/testing/*_conformance.hpp) against a Redis
// Cluster: three primaries with a replica each, started by scripts/servers.sh
// (IDEM_TEST_REDIS_CLUSTER_URL, redis+cluster://). Every record's keys share one hash tag, so
// records spread over the primaries; each test runs under a key prefix of its own (the cluster
// is thrown away with the run). Then: the keys do spread over every primary, and purge() and
// entry_count() see all of them.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../integration/redis_test_env.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "idem/testing/store_conformance.hpp"
#include "redis_topology_factories.hpp"

IDEM_SERVER_TEST_ENVIRONMENT(redis_cluster_environment, "IDEM_TEST_REDIS_CLUSTER_URL",
                             "Redis Cluster", "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/0");

namespace {

using Cluster = idem::test::RedisClusterTopology;

// The primaries' ports: the first three of IDEM_TEST_REDIS_CLUSTER_PORTS (servers.sh lists the
// primaries first).
std::vector<int> primary_ports() {
  std::istringstream ports(idem::test::env("IDEM_TEST_REDIS_CLUSTER_PORTS"));
  std::vector<int> out;
  int port = 0;
  while (out.size() < 3 && ports >> port)
    out.push_back(port);
  return out;
}

long long keys_on(int port, const std::string& prefix) {
  idem::redis::RedisOptions options;
  options.port = port;
  idem::redis::ConnectionPool pool(options);
  auto connection = pool.lease();
  long long n = 0;
  std::string cursor = "0";
  const std::string pattern = prefix + "*";
  do {
    const auto page = connection->command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    cursor = page.elements.at(0).str;
    n += static_cast<long long>(page.elements.at(1).elements.size());
  } while (cursor != "0");
  return n;
}

TEST(RedisCluster, RecordsSpreadOverEveryPrimaryAndWholeKeyspaceCallsSeeThemAll) {
  auto clock = std::make_shared<idem::testing::ManualClock>();
  const auto options = Cluster::options("spread", clock);
  idem::redis::RedisIdempotencyRecorder recorder(options);
  std::vector<std::string> ids;
  for (int i = 0; i < 300; ++i)
    ids.push_back("event-" + std::to_string(i));
  recorder.mark_processed_many("billing", ids);
  EXPECT_EQ(recorder.is_processed_many("billing", ids), std::vector<bool>(ids.size(), true));
  const auto ports = primary_ports();
  ASSERT_EQ(ports.size(), 3u);
  long long total = 0;
  for (int port : ports) {
    const long long here = keys_on(port, options.key_prefix);
    EXPECT_GT(here, 50) << "primary at port " << port;
    total += here;
  }
  EXPECT_EQ(total, 300);
  const auto counts = recorder.consumer_counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].processed, 300u);
  clock->advance(std::chrono::hours(2));
  EXPECT_EQ(recorder.purge(std::chrono::hours(1)), 300u);
  for (int port : ports)
    EXPECT_EQ(keys_on(port, options.key_prefix), 0) << "primary at port " << port;
}

TEST(RedisCluster, AStandaloneServerUnderAClusterUrlIsAClearError) {
  const std::string standalone = idem::test::env("IDEM_TEST_REDIS_URL");
  if (standalone.empty()) GTEST_SKIP() << "no IDEM_TEST_REDIS_URL";
  auto options = idem::redis::RedisOptions::from_url(standalone);
  options.cluster_nodes = {{options.host, options.port}};
  try {
    idem::redis::RedisIdempotencyRecorder recorder(options);
    FAIL() << "a standalone server was taken for a cluster";
  } catch (const idem::redis::RedisError& e) {
    EXPECT_NE(std::string(e.what()).find("cluster"), std::string::npos) << e.what();
    EXPECT_FALSE(e.retryable());
  }
}

}  // namespace

INSTANTIATE_RECORDER_CONFORMANCE(RedisCluster, idem::test::RedisTopologyRecorderFactory<Cluster>);
INSTANTIATE_STORE_CONFORMANCE(RedisCluster, idem::test::RedisTopologyStoreFactory<Cluster>);
