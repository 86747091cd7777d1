// The async Redis recorder and store factories of the conformance suites for a topology of
// servers that the run throws away (redis_async_cluster_conformance_test,
// redis_async_sentinel_conformance_test): the async suites' factories (the recorder or store on an
// IoThread of the factory's own), and the blocking suites' through BlockingOverAsyncRecorder /
// BlockingOverAsyncStore (the operator calls answered by the blocking Redis recorder / store on
// the same prefix). `Topology::options(name, clock)` as in redis_topology_factories.hpp.
#pragma once

#include <memory>
#include <utility>

#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/testing/async_support.hpp"
#include "idem/testing/blocking_over_async.hpp"
#include "redis_topology_factories.hpp"

namespace idem::test {

template <class Topology>
struct RedisTopologyAsyncRecorderFactory {
  static constexpr idem::async::RecorderCapabilities kCapabilities{.claims = true,
                                                                   .transactions = false};
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::redis::AsyncRedisRecorder>(io.executor(),
                                                             Topology::options("async-recorder"));
  }
  idem::testing::IoThread io;
};

template <class Topology>
struct RedisTopologyAsyncStoreFactory {
  std::shared_ptr<idem::async::AsyncStore> make() {
    return std::make_shared<idem::redis::AsyncRedisStore>(io.executor(),
                                                          Topology::options("async-store"));
  }
  idem::testing::IoThread io;
};

template <class Topology>
struct RedisTopologyBlockingOverAsyncRecorderFactory : RedisTopologyRecorderFactory<Topology> {
  static std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    const auto options = Topology::options("bova-recorder", std::move(clock));
    return std::make_shared<idem::testing::BlockingOverAsyncRecorder>(
        [options](asio::any_io_executor executor) {
          return std::make_shared<idem::redis::AsyncRedisRecorder>(std::move(executor), options);
        },
        std::make_shared<idem::redis::RedisIdempotencyRecorder>(options));
  }
};

template <class Topology>
struct RedisTopologyBlockingOverAsyncStoreFactory : RedisTopologyStoreFactory<Topology> {
  static std::shared_ptr<idem::IdempotencyStore> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    const auto options = Topology::options("bova-store", std::move(clock));
    return std::make_shared<idem::testing::BlockingOverAsyncStore>(
        [options](asio::any_io_executor executor) {
          return std::make_shared<idem::redis::AsyncRedisStore>(std::move(executor), options);
        },
        std::make_shared<idem::redis::RedisIdempotencyStore>(options));
  }
};

}  // namespace idem::test
