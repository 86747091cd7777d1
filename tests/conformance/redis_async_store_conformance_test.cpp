// AsyncRedisStore on the test server (IDEM_TEST_REDIS_URL), each test under a key prefix of its
// own that is deleted afterwards; once with one pipelined connection, once with two.
//
// The async store suite (idem/testing/async_store_conformance.hpp): the store's socket I/O runs
// on an io_context of its own thread, so every call also checks that the caller resumes on its
// own executor. The blocking store suite (idem/testing/store_conformance.hpp) through
// BlockingOverAsyncStore: the store's I/O on the adapter's executor, its time from the suite's
// ManualClock, and the operator calls answered by a RedisIdempotencyStore on the same prefix.
#include <memory>
#include <utility>

#include "../integration/redis_test_env.hpp"
#include "blocking_over_async_backend.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/testing/async_store_conformance.hpp"
#include "idem/testing/blocking_over_async.hpp"
#include "idem/testing/store_conformance.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

template <std::size_t Connections>
struct AsyncRedisStoreFactory {
  std::shared_ptr<idem::async::AsyncStore> make() {
    auto options = keys.options();
    options.async_connections = Connections;
    return std::make_shared<idem::redis::AsyncRedisStore>(io.executor(), options);
  }
  // Destroyed in reverse: the prefix's keys are deleted after the I/O thread has stopped.
  idem::test::RedisTestPrefix keys{"async-store"};
  idem::testing::IoThread io;
};

template <std::size_t Connections>
struct BlockingOverAsyncRedisStoreFactory {
  static constexpr int kRaceKeys = 20;
  std::shared_ptr<idem::IdempotencyStore> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    auto options = keys.options(std::move(clock));
    options.async_connections = Connections;
    return idem::test::blocking_over_async<idem::testing::BlockingOverAsyncStore,
                                           idem::redis::AsyncRedisStore,
                                           idem::redis::RedisIdempotencyStore>(options);
  }
  // Deleted after the store (and the adapter's I/O thread) have gone.
  idem::test::RedisTestPrefix keys{"bova-store"};
};

}  // namespace

INSTANTIATE_ASYNC_STORE_CONFORMANCE(AsyncRedisStore, AsyncRedisStoreFactory<1>);
INSTANTIATE_ASYNC_STORE_CONFORMANCE(AsyncRedisStoreTwoConnections, AsyncRedisStoreFactory<2>);
INSTANTIATE_STORE_CONFORMANCE(BlockingOverAsyncRedisStore, BlockingOverAsyncRedisStoreFactory<1>);
INSTANTIATE_STORE_CONFORMANCE(BlockingOverAsyncRedisStoreTwoConnections,
                              BlockingOverAsyncRedisStoreFactory<2>);
