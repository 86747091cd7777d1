// SqliteTransaction: the open SQLite transaction a transactional handler writes through.
//
// SqliteIdempotencyRecorder::run_transactional() begins a write transaction (BEGIN IMMEDIATE),
// inserts the marker, and hands the handler this object. Everything the handler writes through
// it — exec(), or the raw connection from db() — commits together with the marker, or not at
// all: if the handler throws, or the process dies before COMMIT, neither the marker nor the
// handler's rows exist. Handlers reach it through the bus: `bus.transaction()` downcast to
// idem::SqlTransaction (idem/sql.hpp: the same calls on every SQL backend), or to
// idem::sqlite::SqliteTransaction for the raw connection.
//
//   auto& tx = dynamic_cast<idem::SqlTransaction&>(*bus.transaction());
//   tx.exec("INSERT INTO shipments(order_id, address) VALUES ($1, $2)", {order_id, address});
//
// Rules: do not COMMIT, ROLLBACK or BEGIN through db() (idem owns the transaction; ending it
// early is detected and reported as an in-doubt StoreError); SAVEPOINTs are fine. Do not call
// the same recorder's writing methods from inside the handler (they would wait for the
// transaction that is running them; idem throws an Error with code reentry instead). Keep the
// handler short: it holds the database's single write lock, in this process and in every
// other process sharing the file.
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

struct sqlite3;

namespace idem::sqlite {

namespace detail {
class Connection;
}

// The statement parameter of idem/sql.hpp (its spelling in this namespace).
using SqlParam = idem::SqlParam;

class SqliteTransaction final : public SqlTransaction {
 public:
  // The connection the transaction is open on, for anything exec() does not cover.
  sqlite3* db() const noexcept;

  // Internal: made by SqliteIdempotencyRecorder::run_transactional() only.
  SqliteTransaction(detail::Connection& connection, std::string_view consumer,
                    std::string_view event_id) noexcept
      : SqlTransaction(consumer, event_id), connection_(&connection) {}

 private:
  // exec() and the queries bind their parameters to the statement's placeholders (`?`, or `$1`,
  // `$2`, ... numbered by first appearance) in order; the statement is prepared once and cached
  // on the connection. They throw SqliteError when SQLite fails (the transaction then rolls back
  // when the handler's exception leaves it), InvalidArgument for a wrong number of parameters or
  // more than one statement.
  std::int64_t do_exec(std::string_view sql, std::span<const SqlParam> params) override;
  std::optional<std::int64_t> do_query_int64(std::string_view sql,
                                             std::span<const SqlParam> params) override;
  std::optional<std::string> do_query_text(std::string_view sql,
                                           std::span<const SqlParam> params) override;

  detail::Connection* connection_;
};

}  // namespace idem::sqlite
