// A Redis Cluster primary killed with SIGKILL under a recorder that keeps marking (the cluster of
// scripts/servers.sh: three primaries with a replica each, cluster-node-timeout 2 s, so the
// replica is promoted a few seconds after the kill). The recorder must:
//  * end every call, within its deadlines, with success or a retryable / in-doubt RedisError;
//  * reach the promoted replica by itself (MOVED, or the layout read again), with no new object;
//  * keep every mark written with min_replicas=1 before the kill (its replica confirmed it).
// Afterwards the killed node is started again (it rejoins as the replica of the promoted one) and
// made primary again with CLUSTER FAILOVER, a coordinated switch that loses nothing, so the
// cluster is as servers.sh left it (primaries first in IDEM_TEST_REDIS_CLUSTER_PORTS) for the
// tests that follow.
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
#include "redis_cluster_env.hpp"

IDEM_SERVER_TEST_ENVIRONMENT(redis_cluster_environment, "IDEM_TEST_REDIS_CLUSTER_URL",
                             "Redis Cluster", "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/0");

namespace {

using namespace idem::test::cluster;

class RedisClusterFailover : public ::testing::Test {
 protected:
  void SetUp() override {
    if (idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL").empty()) GTEST_SKIP();
    ASSERT_TRUE(eventually(cluster_as_started)) << "the cluster is not whole before the test";
  }
};

TEST_F(RedisClusterFailover, AKilledPrimaryIsReplacedAndCallsEndWithinTheirDeadlines) {
  auto options = RedisOptions::from_url(idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL"));
  options.key_prefix = "idemtest:" + std::to_string(::getpid()) + ":cluster-kill:";
  options.connect_timeout = 500ms;
  options.command_timeout = 2s;
  // Written with min_replicas=1: each primary's replica holds them before the kill.
  auto durable = options;
  durable.min_replicas = 1;
  const auto before = ids("before", 300);
  idem::redis::RedisIdempotencyRecorder(durable).mark_processed_many("billing", before);

  idem::redis::RedisIdempotencyRecorder recorder(options);
  // The first primary (the coroutine face's test kills the second: each shard fails over once per
  // run).
  const int victim = cluster_ports().at(0);
  const KilledPrimary killed(victim);  // put back at the end, whatever happens
  ASSERT_TRUE(killed.killed());

  // Single marks round the keyspace (a third of them on the killed primary's slots) until a
  // whole batch over every slot succeeds after the promotion.
  const auto bound = options.connect_timeout + options.command_timeout + 5s;
  const auto limit = Clock::now() + 60s;
  std::vector<std::string> acknowledged;
  int failures = 0;
  bool recovered = false;
  for (int i = 0; !recovered && Clock::now() < limit; ++i) {
    const std::string id = "during-" + std::to_string(i);
    const auto start = Clock::now();
    try {
      recorder.mark_processed("billing", id);
      acknowledged.push_back(id);
      if (i % 20 == 0) {
        const auto batch = ids("probe-" + std::to_string(i), 30);
        recorder.mark_processed_many("billing", batch);
        recovered = true;
      }
    } catch (const RedisError& e) {
      EXPECT_TRUE(e.retryable() || e.in_doubt()) << e.what();
      ++failures;
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_LT(Clock::now() - start, bound) << "call " << i << " did not end in time";
  }
  ASSERT_TRUE(recovered) << "no batch over every slot succeeded within 60 s of the kill";
  EXPECT_GT(failures, 0) << "no call noticed the primary was gone";
  EXPECT_EQ(recorder.is_processed_many("billing", before), std::vector<bool>(before.size(), true))
      << "a mark its replica had confirmed was lost";
  // Acknowledged after the kill: by a live primary, or by the promoted replica.
  EXPECT_EQ(recorder.is_processed_many("billing", acknowledged),
            std::vector<bool>(acknowledged.size(), true));
}

}  // namespace
