// PostgresTransaction: the open PostgreSQL transaction a transactional handler writes through.
//
// PostgresIdempotencyRecorder::run_transactional() takes a pooled connection, begins a
// transaction, inserts the marker, and hands the handler this object. Everything the handler
// writes through it — exec(), or the raw connection from connection() — commits together with
// the marker, or not at all: if the handler throws, or the process or the connection dies before
// COMMIT, neither the marker nor the handler's rows exist. Handlers reach it through the bus, as
// idem::SqlTransaction (idem/sql.hpp: the same calls on every SQL backend) or as
// idem::postgres::PostgresTransaction for the raw connection:
//
//   auto& tx = dynamic_cast<idem::SqlTransaction&>(*bus.transaction());
//   tx.exec("INSERT INTO shipments(order_id, address) VALUES ($1, $2)", {order_id, address});
//
// Rules: do not COMMIT, ROLLBACK or BEGIN through connection() (idem owns the transaction;
// ending it early is detected and reported as an in-doubt PostgresError); SAVEPOINTs are fine.
// A statement that fails aborts the transaction: let the exception leave the handler (catching
// it and going on makes run_transactional() roll back and throw). Keep handlers short: they hold
// a pooled connection and row locks until they return. statement_timeout applies to each
// statement.
//
// Thread-safety: only the thread running the handler may use it, and only until the handler
// returns.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "idem/sql.hpp"

struct pg_conn;
using PGconn = pg_conn;

namespace idem::postgres {

namespace detail {
class Connection;
}

// The statement parameter of idem/sql.hpp (its spelling in this namespace): text parameters go
// untyped and the server infers their type from the statement, as for a literal; bytes
// (PgParam::bytea) go as bytea.
using PgParam = idem::SqlParam;

class PostgresTransaction final : public SqlTransaction {
 public:
  // The connection the transaction is open on, for anything exec() does not cover.
  PGconn* connection() const noexcept;

  // Internal: made by PostgresIdempotencyRecorder::run_transactional() only.
  PostgresTransaction(detail::Connection& connection, std::string_view consumer,
                      std::string_view event_id) noexcept
      : SqlTransaction(consumer, event_id), connection_(&connection) {}

 private:
  // exec() and the queries bind their parameters to $1, $2, ... (types inferred by the server
  // from the statement). They throw PostgresError when the server refuses the statement (the
  // transaction is then aborted: let the exception leave the handler), InvalidArgument for text
  // with a NUL byte; query_int64 also throws PostgresError when the value is not an integer.
  std::int64_t do_exec(std::string_view sql, std::span<const PgParam> params) override;
  std::optional<std::int64_t> do_query_int64(std::string_view sql,
                                             std::span<const PgParam> params) override;
  std::optional<std::string> do_query_text(std::string_view sql,
                                           std::span<const PgParam> params) override;

  detail::Connection* connection_;
};

}  // namespace idem::postgres
