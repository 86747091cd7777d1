// A Redis Cluster primary killed with SIGKILL under the coroutine face: an AsyncRedisRecorder on
// the cluster keeps marking while the killed primary's replica is promoted. Every call must end
// within its deadlines with success or a retryable / in-doubt RedisError, the router must reach
// the promoted replica by itself (its layout read again), and marks confirmed by their replica
// (min_replicas=1) before the kill must survive. The cluster is put back as it was started
// (redis_cluster_env.hpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <asio/io_context.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "../async_test_support.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "redis_cluster_env.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_CLUSTER_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::cluster;

TEST(RedisAsyncClusterFailover, AKilledPrimaryIsReplacedUnderThePipelinedRouter) {
  if (idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL").empty()) GTEST_SKIP();
  ASSERT_TRUE(poll_until(cluster_as_started)) << "the cluster is not whole before the test";
  auto options = RedisOptions::from_url(idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL"));
  options.key_prefix = "idemtest:" + std::to_string(::getpid()) + ":async-cluster-kill:";
  options.connect_timeout = 500ms;
  options.command_timeout = 2s;
  asio::io_context io;
  auto durable = options;
  durable.min_replicas = 1;
  const auto before = ids("before", 300);
  {
    idem::redis::AsyncRedisRecorder writer(io.get_executor(), durable);
    idem::test::run(io, writer.mark_processed_many("billing", before));
  }
  idem::redis::AsyncRedisRecorder recorder(io.get_executor(), options);
  // The router knows the layout before the kill.
  EXPECT_EQ(idem::test::run(io, recorder.is_processed_many("billing", before)),
            std::vector<bool>(before.size(), true));

  // The second primary (the blocking face's test kills the first: each shard fails over once per
  // run).
  const int victim = cluster_ports().at(1);
  const KilledPrimary killed(victim);  // put back at the end, whatever happens
  ASSERT_TRUE(killed.killed());
  const FailoverMarks marks = mark_through_failover(
      options.connect_timeout + options.command_timeout + 5s,
      [&](const std::string& id) { idem::test::run(io, recorder.mark_processed("billing", id)); },
      [&](const std::vector<std::string>& batch) {
        idem::test::run(io, recorder.mark_processed_many("billing", batch));
      });
  ASSERT_TRUE(marks.recovered) << "no batch over every slot succeeded within 60 s of the kill";
  EXPECT_GT(marks.failures, 0) << "no call noticed the primary was gone";
  EXPECT_EQ(idem::test::run(io, recorder.is_processed_many("billing", before)),
            std::vector<bool>(before.size(), true))
      << "a mark its replica had confirmed was lost";
  EXPECT_EQ(idem::test::run(io, recorder.is_processed_many("billing", marks.acknowledged)),
            std::vector<bool>(marks.acknowledged.size(), true));
}

}  // namespace
