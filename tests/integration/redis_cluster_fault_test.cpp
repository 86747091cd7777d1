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
#include "redis_test_env.hpp"

IDEM_REDIS_CLUSTER_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::cluster;

class RedisClusterFailover : public ::testing::Test {
 protected:
  void SetUp() override {
    if (idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL").empty()) GTEST_SKIP();
    ASSERT_TRUE(poll_until(cluster_as_started)) << "the cluster is not whole before the test";
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

  const FailoverMarks marks = mark_through_failover(
      options.connect_timeout + options.command_timeout + 5s,
      [&](const std::string& id) { recorder.mark_processed("billing", id); },
      [&](const std::vector<std::string>& batch) {
        recorder.mark_processed_many("billing", batch);
      });
  ASSERT_TRUE(marks.recovered) << "no batch over every slot succeeded within 60 s of the kill";
  EXPECT_GT(marks.failures, 0) << "no call noticed the primary was gone";
  EXPECT_EQ(recorder.is_processed_many("billing", before), std::vector<bool>(before.size(), true))
      << "a mark its replica had confirmed was lost";
  // Acknowledged after the kill: by a live primary, or by the promoted replica.
  EXPECT_EQ(recorder.is_processed_many("billing", marks.acknowledged),
            std::vector<bool>(marks.acknowledged.size(), true));
}

}  // namespace
