// The async recorder and store suites (idem/testing/async_*_conformance.hpp) on a Redis Cluster
// through the coroutine face: one pipelined connection per primary, each call's commands split by
// slot (scripts/servers.sh starts three primaries with a replica each:
// IDEM_TEST_REDIS_CLUSTER_URL); and the blocking recorder and store suites through
// BlockingOverAsyncRecorder / BlockingOverAsyncStore (the async object's I/O on the adapter's
// executor, its time from the suite's ManualClock, the operator calls answered by the blocking
// Redis recorder / store on the same prefix).
// Each test runs under a key prefix of its own. Then: a batch spread over every primary, and a
// standalone server under a cluster URL.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../integration/redis_test_env.hpp"
#include "idem/redis/async_connection.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/testing/async_recorder_conformance.hpp"
#include "idem/testing/async_store_conformance.hpp"
#include "idem/testing/async_support.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "idem/testing/store_conformance.hpp"
#include "redis_async_topology_factories.hpp"

IDEM_SERVER_TEST_ENVIRONMENT(redis_cluster_environment, "IDEM_TEST_REDIS_CLUSTER_URL",
                             "Redis Cluster", "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/0");

namespace {

using Cluster = idem::test::RedisClusterTopology;

// A batch spans every primary: each gets its part, the replies come back in order, and the
// blocking face (another process, as it were) sees every mark.
TEST(RedisAsyncCluster, ABatchSpreadOverEveryPrimaryComesBackInOrder) {
  if (idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL").empty()) GTEST_SKIP();
  const auto options = Cluster::options("spread");
  asio::io_context io;
  idem::redis::AsyncRedisRecorder recorder(io.get_executor(), options);
  std::vector<std::string> ids;
  for (int i = 0; i < 300; ++i)
    ids.push_back("event-" + std::to_string(i));
  const std::vector<std::string> first(ids.begin(), ids.begin() + 150);
  idem::testing::async_detail::run(io, recorder.mark_processed_many("billing", first));
  auto expected = std::vector<bool>(150, true);
  expected.resize(300, false);
  EXPECT_EQ(idem::testing::async_detail::run(io, recorder.is_processed_many("billing", ids)),
            expected);
  idem::redis::RedisIdempotencyRecorder blocking(options);
  EXPECT_EQ(blocking.is_processed_many("billing", ids), expected);
  EXPECT_EQ(blocking.consumer_counts().at(0).processed, 150u);
}

TEST(RedisAsyncCluster, AStandaloneServerUnderAClusterUrlIsAClearError) {
  const std::string standalone = idem::test::env("IDEM_TEST_REDIS_URL");
  if (standalone.empty()) GTEST_SKIP() << "no IDEM_TEST_REDIS_URL";
  auto options = idem::redis::RedisOptions::from_url(standalone);
  options.cluster_nodes = {{options.host, options.port}};
  asio::io_context io;
  idem::redis::AsyncRedisRecorder recorder(io.get_executor(), options);
  try {
    (void)idem::testing::async_detail::run(io, recorder.is_processed("billing", "event-1"));
    FAIL() << "a standalone server was taken for a cluster";
  } catch (const idem::redis::RedisError& e) {
    EXPECT_NE(std::string(e.what()).find("cluster"), std::string::npos) << e.what();
    EXPECT_FALSE(e.retryable()) << e.what();
  }
}

// The router destroyed while its calls are in flight on another thread: every call ends (with
// its replies, or aborted), and nothing is touched after it is freed (ASan / TSan presets).
TEST(RedisAsyncCluster, DestroyingTheRouterEndsItsCallsInFlight) {
  if (idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL").empty()) GTEST_SKIP();
  const auto options = Cluster::options("shutdown");
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  constexpr int kCalls = 100;
  std::atomic<int> ended{0};
  {
    idem::redis::AsyncConnection router(io.get_executor(), options);
    for (int i = 0; i < kCalls; ++i) {
      idem::redis::CommandBatch batch;  // keys on every primary
      for (int k = 0; k < 10; ++k) {
        const std::string key = options.key_prefix + std::to_string(i * 10 + k);
        batch.add({"SET", key, "1"});
      }
      asio::co_spawn(
          io, router.pipeline(std::move(batch)),
          [&ended](std::exception_ptr, std::vector<idem::redis::RedisReply>) { ++ended; });
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ended.load() < kCalls && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(ended.load(), kCalls) << "a call never ended";
  work.reset();
  runner.join();
}

}  // namespace

IDEM_INSTANTIATE_REDIS_ASYNC_TOPOLOGY_CONFORMANCE(Cluster, Cluster);
