// One transactional handler written against idem::SqlTransaction (idem/sql.hpp), run unchanged on
// every SQL backend: `$n` parameters of every kind, the row counts, the queries, and the commit or
// rollback of the handler's rows together with the marker.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "idem/error.hpp"
#include "idem/recorder.hpp"
#include "idem/sql.hpp"

namespace idem::test {

// `table` exists with columns (order_id TEXT, qty BIGINT, weight DOUBLE/REAL, paid BOOLEAN,
// note TEXT, photo BLOB/BYTEA) and is empty; `recorder` has no marker for consumer "shipping".
inline void portable_sql_transaction_case(IdempotencyRecorder& recorder, const std::string& table) {
  const auto ship = [&](Transaction& t) {
    auto& tx = dynamic_cast<SqlTransaction&>(t);
    EXPECT_EQ(tx.consumer(), "shipping");
    EXPECT_EQ(tx.event_id(), "order-7");
    const std::string order = "order-7";
    EXPECT_EQ(tx.exec("INSERT INTO " + table + " VALUES ($1, $2, $3, $4, $5, $6)",
                      {order, 3, 1.5, true, nullptr, SqlParam::blob(std::string("\0x", 2))}),
              1);
    EXPECT_EQ(tx.query_int64("SELECT qty FROM " + table + " WHERE order_id = $1", {order}), 3);
    EXPECT_EQ(tx.query_text("SELECT order_id FROM " + table + " WHERE qty = $1", {3u}), order);
    EXPECT_EQ(tx.query_int64("SELECT COUNT(*) FROM " + table + " WHERE paid = $1", {true}), 1);
    EXPECT_EQ(tx.query_text("SELECT note FROM " + table), std::nullopt) << "NULL";
    EXPECT_EQ(tx.query_int64("SELECT qty FROM " + table + " WHERE order_id = 'none'"),
              std::nullopt);
  };
  EXPECT_TRUE(recorder.run_transactional("shipping", "order-7", ship));
  EXPECT_FALSE(recorder.run_transactional("shipping", "order-7", ship)) << "a duplicate";

  // A handler that throws leaves neither its row nor its marker.
  EXPECT_THROW(static_cast<void>(recorder.run_transactional(
                   "shipping", "order-8",
                   [&](Transaction& t) {
                     dynamic_cast<SqlTransaction&>(t).exec(
                         "INSERT INTO " + table + "(order_id) VALUES ($1)", {"order-8"});
                     throw std::runtime_error("gateway down");
                   })),
               std::runtime_error);
  EXPECT_FALSE(recorder.is_processed("shipping", "order-8"));

  std::optional<std::int64_t> rows;
  std::optional<std::int64_t> bytes;
  EXPECT_TRUE(recorder.run_transactional("reader", "count", [&](Transaction& t) {
    auto& tx = dynamic_cast<SqlTransaction&>(t);
    rows = tx.query_int64("SELECT COUNT(*) FROM " + table);
    bytes = tx.query_int64("SELECT length(photo) FROM " + table);
  }));
  EXPECT_EQ(rows, 1);
  EXPECT_EQ(bytes, 2);
}

}  // namespace idem::test
