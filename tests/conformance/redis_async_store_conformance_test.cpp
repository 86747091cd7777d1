// The async store cases (tests/async_store_cases.hpp) against AsyncRedisStore on the test server
// (IDEM_TEST_REDIS_URL), each test under a key prefix of its own that is deleted afterwards. The
// store's socket I/O runs on an io_context of its own thread, so every call also checks that the
// caller resumes on its own executor; once with one pipelined connection, once with two.
#include <memory>

#include "../async_store_cases.hpp"
#include "../async_test_support.hpp"
#include "../integration/redis_test_env.hpp"
#include "idem/redis/async_redis_store.hpp"

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
  idem::test::IoThread io;
};

}  // namespace

INSTANTIATE_ASYNC_STORE_CASES(AsyncRedisStore, AsyncRedisStoreFactory<1>);
INSTANTIATE_ASYNC_STORE_CASES(AsyncRedisStoreTwoConnections, AsyncRedisStoreFactory<2>);
