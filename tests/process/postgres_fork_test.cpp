// fork() in a process that has used the PostgreSQL recorder and store (the cases:
// fork_case.hpp).
//
//   * the parent's objects, and with them their connection pools and the store's LISTEN thread,
//     are gone before the fork: the child connects anew and uses both faces;
//   * objects alive at the fork are refused in the child (ConfigError: their pools hand out no
//     connection there, so the parent's sessions are left alone), and the parent goes on using
//     them.
#include <gtest/gtest.h>

#include <memory>

#include "../postgres_test_support.hpp"
#include "fork_case.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"

IDEM_POSTGRES_TEST_ENVIRONMENT();

namespace {

class ForkPostgres : public ::testing::Test {
 protected:
  idem::test::pg::TempSchema schema_;
  const idem::test::fork::Backend backend_{
      [this] {
        return std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(schema_.options());
      },
      [this] {
        return std::make_shared<idem::postgres::PostgresIdempotencyStore>(schema_.options());
      }};
};

TEST_F(ForkPostgres, AChildUsesNewObjectsAfterTheParentDestroyedItsOwn) {
  EXPECT_EQ(idem::test::fork::fork_after_use(backend_), "");
}

TEST_F(ForkPostgres, ObjectsAliveAtForkAreRefusedInTheChild) {
  EXPECT_EQ(idem::test::fork::alive_at_fork(backend_), "");
}

}  // namespace
