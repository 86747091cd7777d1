// The Redis recorder and store factories of the conformance suites for a topology of servers that
// the run throws away (redis_cluster_conformance_test, redis_sentinel_conformance_test and their
// async twins, redis_async_topology_factories.hpp). `Topology::options(name, clock)` gives one
// test's RedisOptions under a key prefix of its own (redis_url_test_options): the Cluster's
// (RedisClusterTopology) or the Sentinel group's (RedisSentinelTopology).
#pragma once

#include <memory>
#include <string_view>
#include <utility>

#include "../integration/redis_test_env.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/testing/manual_clock.hpp"
#include "recorder_traits.hpp"

namespace idem::test {

// The Redis Cluster of scripts/servers.sh: three primaries with a replica each.
struct RedisClusterTopology {
  static redis::RedisOptions options(std::string_view name,
                                     std::shared_ptr<Clock> clock = nullptr) {
    return redis_url_test_options("IDEM_TEST_REDIS_CLUSTER_URL", name, std::move(clock));
  }
};

// The primary that the sentinels of scripts/servers.sh (IDEM_TEST_REDIS_SENTINEL=1) name.
struct RedisSentinelTopology {
  static redis::RedisOptions options(std::string_view name,
                                     std::shared_ptr<Clock> clock = nullptr) {
    return redis_url_test_options("IDEM_TEST_REDIS_SENTINEL_URL", name, std::move(clock));
  }
};

template <class Topology>
struct RedisTopologyRecorderFactory : idem::test::RecorderTraits<false, 100> {
  static std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::redis::RedisIdempotencyRecorder>(
        Topology::options("recorder", std::move(clock)));
  }
};

template <class Topology>
struct RedisTopologyStoreFactory {
  static constexpr int kRaceKeys = 20;

  static std::shared_ptr<idem::IdempotencyStore> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::redis::RedisIdempotencyStore>(
        Topology::options("store", std::move(clock)));
  }
};

}  // namespace idem::test
