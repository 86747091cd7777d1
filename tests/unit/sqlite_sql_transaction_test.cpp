// The SQLite recorder's transaction as an idem::SqlTransaction: the portable handler of
// sql_transaction_case.hpp, with `$n` parameters.
#include <gtest/gtest.h>

#include "../sql_transaction_case.hpp"
#include "../temp_dir.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_transaction.hpp"

namespace {

TEST(SqliteSqlTransaction, APortableHandlerRunsUnchanged) {
  idem::test::TempDir dir;
  idem::sqlite::SqliteIdempotencyRecorder recorder(dir.file("inbox.db"));
  ASSERT_TRUE(recorder.run_transactional("setup", "schema", [](idem::Transaction& t) {
    dynamic_cast<idem::SqlTransaction&>(t).exec(
        "CREATE TABLE shipments(order_id TEXT, qty INTEGER, weight REAL, paid BOOLEAN, note "
        "TEXT, photo BLOB)");
  }));
  idem::test::portable_sql_transaction_case(recorder, "shipments");
}

TEST(SqliteSqlTransaction, ABoolBindsAsZeroOrOne) {
  idem::sqlite::SqliteIdempotencyRecorder recorder(":memory:");
  ASSERT_TRUE(recorder.run_transactional("c", "e", [](idem::Transaction& t) {
    auto& tx = dynamic_cast<idem::SqlTransaction&>(t);
    EXPECT_EQ(tx.query_int64("SELECT $1 + $2", {true, false}), 1);
  }));
}

}  // namespace
