// The store conformance suite (idem/testing/store_conformance.hpp) against RedisIdempotencyStore
// on the test server (IDEM_TEST_REDIS_URL), each test under a key prefix of its own that is
// deleted afterwards; once with the defaults, once with a hash tag in the prefix (every key in
// one cluster slot) and a single pooled connection.
#include <memory>

#include "../integration/redis_test_env.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/testing/store_conformance.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

struct RedisStoreFactory {
  static constexpr int kRaceKeys = 20;

  std::shared_ptr<idem::IdempotencyStore> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::redis::RedisIdempotencyStore>(keys.options(std::move(clock)));
  }

  idem::test::RedisTestPrefix keys{"store"};
};

struct RedisHashTaggedStoreFactory {
  static constexpr int kRaceKeys = 20;

  std::shared_ptr<idem::IdempotencyStore> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    auto options = keys.options(std::move(clock));
    options.key_prefix += "{slot}:";
    options.pool_size = 1;
    options.wait_timeout = std::chrono::seconds(30);
    return std::make_shared<idem::redis::RedisIdempotencyStore>(options);
  }

  idem::test::RedisTestPrefix keys{"store-tagged"};
};

}  // namespace

INSTANTIATE_STORE_CONFORMANCE(Redis, RedisStoreFactory);
INSTANTIATE_STORE_CONFORMANCE(RedisHashTagged, RedisHashTaggedStoreFactory);
