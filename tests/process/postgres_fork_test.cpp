// fork() in a process that has used the PostgreSQL recorder and store (the case itself:
// fork_case.hpp). The parent's objects, and with them their connection pools and the store's
// LISTEN thread, are gone before the fork; the child connects anew.
#include <gtest/gtest.h>

#include <memory>

#include "../postgres_test_support.hpp"
#include "fork_case.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"

IDEM_POSTGRES_TEST_ENVIRONMENT();

namespace {

TEST(ForkPostgres, AChildUsesNewObjectsAfterTheParentDestroyedItsOwn) {
  idem::test::pg::TempSchema schema;
  const idem::test::fork::Backend backend{
      [&] {
        return std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(schema.options());
      },
      [&] { return std::make_shared<idem::postgres::PostgresIdempotencyStore>(schema.options()); }};
  EXPECT_EQ(idem::test::fork::fork_after_use(backend), "");
}

}  // namespace
