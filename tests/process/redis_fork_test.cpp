// fork() in a process that has used the Redis recorder and store (the cases: fork_case.hpp).
//
//   * the parent's objects, and with them their connection pools, are gone before the fork: the
//     child connects anew and uses both faces;
//   * objects alive at the fork are refused in the child (ConfigError: their pools hand out no
//     connection there), and the parent goes on using them.
#include <gtest/gtest.h>

#include <memory>

#include "../integration/redis_test_env.hpp"
#include "fork_case.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

class ForkRedis : public ::testing::Test {
 protected:
  idem::test::RedisTestPrefix prefix_{"fork"};
  const idem::test::fork::Backend backend_{
      [this] { return std::make_shared<idem::redis::RedisIdempotencyRecorder>(prefix_.options()); },
      [this] { return std::make_shared<idem::redis::RedisIdempotencyStore>(prefix_.options()); }};
};

TEST_F(ForkRedis, AChildUsesNewObjectsAfterTheParentDestroyedItsOwn) {
  EXPECT_EQ(idem::test::fork::fork_after_use(backend_), "");
}

TEST_F(ForkRedis, ObjectsAliveAtForkAreRefusedInTheChild) {
  EXPECT_EQ(idem::test::fork::alive_at_fork(backend_), "");
}

}  // namespace
