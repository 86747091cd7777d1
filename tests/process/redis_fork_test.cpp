// fork() in a process that has used the Redis recorder and store (the case itself:
// fork_case.hpp). The parent's objects, and with them their connection pools, are gone before the
// fork; the child connects anew.
#include <gtest/gtest.h>

#include <memory>

#include "../integration/redis_test_env.hpp"
#include "fork_case.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

TEST(ForkRedis, AChildUsesNewObjectsAfterTheParentDestroyedItsOwn) {
  idem::test::RedisTestPrefix prefix("fork");
  const idem::test::fork::Backend backend{
      [&] { return std::make_shared<idem::redis::RedisIdempotencyRecorder>(prefix.options()); },
      [&] { return std::make_shared<idem::redis::RedisIdempotencyStore>(prefix.options()); }};
  EXPECT_EQ(idem::test::fork::fork_after_use(backend), "");
}

}  // namespace
