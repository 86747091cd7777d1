// The async Redis recorder and store factories of the conformance suites for a topology of
// servers that the run throws away (redis_async_cluster_conformance_test,
// redis_async_sentinel_conformance_test): the async suites' factories (the recorder or store on an
// IoThread of the factory's own), and the blocking suites' through BlockingOverAsyncRecorder /
// BlockingOverAsyncStore (the operator calls answered by the blocking Redis recorder / store on
// the same prefix). `Topology::options(name, clock)` as in redis_topology_factories.hpp.
#pragma once

#include <memory>
#include <utility>

#include "blocking_over_async_backend.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/testing/async_recorder_conformance.hpp"
#include "idem/testing/async_store_conformance.hpp"
#include "idem/testing/async_support.hpp"
#include "idem/testing/blocking_over_async.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "idem/testing/store_conformance.hpp"
#include "recorder_traits.hpp"
#include "redis_topology_factories.hpp"

namespace idem::test {

template <class Topology>
struct RedisTopologyAsyncRecorderFactory : idem::test::AsyncRecorderTraits<false> {
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
    return blocking_over_async<idem::testing::BlockingOverAsyncRecorder,
                               idem::redis::AsyncRedisRecorder,
                               idem::redis::RedisIdempotencyRecorder>(options);
  }
};

template <class Topology>
struct RedisTopologyBlockingOverAsyncStoreFactory : RedisTopologyStoreFactory<Topology> {
  static std::shared_ptr<idem::IdempotencyStore> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    const auto options = Topology::options("bova-store", std::move(clock));
    return blocking_over_async<idem::testing::BlockingOverAsyncStore, idem::redis::AsyncRedisStore,
                               idem::redis::RedisIdempotencyStore>(options);
  }
};

}  // namespace idem::test

// The four suites over `Topology`: the async recorder and store suites (RedisAsync<Name>,
// RedisAsync<Name>Store) and the blocking ones through the adapters (BlockingOverAsyncRedis<Name>,
// BlockingOverAsyncRedis<Name>Store).
#define IDEM_INSTANTIATE_REDIS_ASYNC_TOPOLOGY_CONFORMANCE(Name, Topology)                          \
  INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(RedisAsync##Name,                                         \
                                         idem::test::RedisTopologyAsyncRecorderFactory<Topology>); \
  INSTANTIATE_ASYNC_STORE_CONFORMANCE(RedisAsync##Name##Store,                                     \
                                      idem::test::RedisTopologyAsyncStoreFactory<Topology>);       \
  INSTANTIATE_RECORDER_CONFORMANCE(                                                                \
      BlockingOverAsyncRedis##Name,                                                                \
      idem::test::RedisTopologyBlockingOverAsyncRecorderFactory<Topology>);                        \
  INSTANTIATE_STORE_CONFORMANCE(BlockingOverAsyncRedis##Name##Store,                               \
                                idem::test::RedisTopologyBlockingOverAsyncStoreFactory<Topology>)
