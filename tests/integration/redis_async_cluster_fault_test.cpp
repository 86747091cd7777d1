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

IDEM_SERVER_TEST_ENVIRONMENT(redis_cluster_environment, "IDEM_TEST_REDIS_CLUSTER_URL",
                             "Redis Cluster", "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/0");

namespace {

using namespace idem::test::cluster;

TEST(RedisAsyncClusterFailover, AKilledPrimaryIsReplacedUnderThePipelinedRouter) {
  if (idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL").empty()) GTEST_SKIP();
  ASSERT_TRUE(eventually(cluster_as_started)) << "the cluster is not whole before the test";
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
  const auto bound = options.connect_timeout + options.command_timeout + 5s;
  const auto limit = Clock::now() + 60s;
  std::vector<std::string> acknowledged;
  int failures = 0;
  bool recovered = false;
  for (int i = 0; !recovered && Clock::now() < limit; ++i) {
    const std::string id = "during-" + std::to_string(i);
    const auto start = Clock::now();
    try {
      idem::test::run(io, recorder.mark_processed("billing", id));
      acknowledged.push_back(id);
      if (i % 20 == 0) {
        idem::test::run(io, recorder.mark_processed_many("billing", ids("probe-" + id, 30)));
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
  EXPECT_EQ(idem::test::run(io, recorder.is_processed_many("billing", before)),
            std::vector<bool>(before.size(), true))
      << "a mark its replica had confirmed was lost";
  EXPECT_EQ(idem::test::run(io, recorder.is_processed_many("billing", acknowledged)),
            std::vector<bool>(acknowledged.size(), true));
}

}  // namespace
