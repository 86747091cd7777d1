// The PostgreSQL recorder's transaction as an idem::SqlTransaction: the portable handler of
// sql_transaction_case.hpp, unchanged from SQLite's, on a real server (IDEM_TEST_POSTGRES_URL).
#include <gtest/gtest.h>

#include "../postgres_test_support.hpp"
#include "../sql_transaction_case.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_transaction.hpp"

IDEM_POSTGRES_TEST_ENVIRONMENT();

namespace {

TEST(PostgresSqlTransaction, APortableHandlerRunsUnchanged) {
  idem::test::pg::TempSchema schema;
  idem::postgres::PostgresIdempotencyRecorder recorder(schema.options());
  const std::string table = schema.table("shipments");
  ASSERT_TRUE(recorder.run_transactional("setup", "schema", [&](idem::Transaction& t) {
    dynamic_cast<idem::SqlTransaction&>(t).exec(
        "CREATE TABLE " + table +
        "(order_id TEXT, qty BIGINT, weight DOUBLE PRECISION, paid BOOLEAN, note TEXT, photo "
        "BYTEA)");
  }));
  idem::test::portable_sql_transaction_case(recorder, table);
}

}  // namespace
