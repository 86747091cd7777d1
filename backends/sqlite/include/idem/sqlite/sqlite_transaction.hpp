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
  using SqlTransaction::exec;
  using SqlTransaction::query_int64;
  using SqlTransaction::query_text;

  SqliteTransaction(const SqliteTransaction&) = delete;
  SqliteTransaction& operator=(const SqliteTransaction&) = delete;

  // The connection the transaction is open on, for anything exec() does not cover.
  sqlite3* db() const noexcept;

  // Runs ONE SQL statement with `params` bound to its placeholders (`?`, or `$1`, `$2`, ...
  // numbered by first appearance) in order, and returns how many rows it changed. The statement
  // is prepared once and cached on the connection. Throws SqliteError when SQLite fails (the
  // transaction then rolls back when the handler's exception leaves it), InvalidArgument for a
  // wrong number of parameters or more than one statement.
  std::int64_t exec(std::string_view sql, std::initializer_list<SqlParam> params) override;

  // The first column of the first row of a query, or nullopt when there is no row or it is
  // NULL. Same rules as exec().
  std::optional<std::int64_t> query_int64(std::string_view sql,
                                          std::initializer_list<SqlParam> params) override;
  std::optional<std::string> query_text(std::string_view sql,
                                        std::initializer_list<SqlParam> params) override;

  // The same three calls with the parameters in a span (for callers that build the list at run
  // time, e.g. idem::sqlite_async's AsyncSqlTransaction).
  std::int64_t exec_params(std::string_view sql, std::span<const SqlParam> params);
  std::optional<std::int64_t> query_int64_params(std::string_view sql,
                                                 std::span<const SqlParam> params);
  std::optional<std::string> query_text_params(std::string_view sql,
                                               std::span<const SqlParam> params);

  // The consumer and event the transaction is recording.
  std::string_view consumer() const noexcept override { return consumer_; }
  std::string_view event_id() const noexcept override { return event_id_; }

  // Internal: made by SqliteIdempotencyRecorder::run_transactional() only.
  SqliteTransaction(detail::Connection& connection, std::string_view consumer,
                    std::string_view event_id) noexcept
      : connection_(&connection), consumer_(consumer), event_id_(event_id) {}

 private:
  detail::Connection* connection_;
  std::string_view consumer_;
  std::string_view event_id_;
};

}  // namespace idem::sqlite
