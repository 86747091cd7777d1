// PostgresTransaction: the open PostgreSQL transaction a transactional handler writes through.
//
// PostgresIdempotencyRecorder::run_transactional() takes a pooled connection, begins a
// transaction, inserts the marker, and hands the handler this object. Everything the handler
// writes through it — exec(), or the raw connection from connection() — commits together with
// the marker, or not at all: if the handler throws, or the process or the connection dies before
// COMMIT, neither the marker nor the handler's rows exist. Handlers reach it through the bus:
//
//   auto& tx = dynamic_cast<idem::postgres::PostgresTransaction&>(*bus.transaction());
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

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "idem/error.hpp"
#include "idem/recorder.hpp"

struct pg_conn;
using PGconn = pg_conn;

namespace idem::postgres {

namespace detail {
class Connection;
}

// One parameter of exec()/query_*() for a $n placeholder: NULL, a boolean, an integer, a double,
// text or bytea. Text and bytes are referenced, not copied: they must outlive the call
// (temporaries in the argument list do). Text must not contain NUL bytes (PostgreSQL text cannot
// hold them; use PgParam::bytea).
class PgParam {
 public:
  struct Bytea {
    std::string_view bytes;
  };
  using Value = std::variant<std::nullptr_t, bool, std::int64_t, double, std::string_view, Bytea>;

  PgParam(std::nullptr_t) noexcept : value_(nullptr) {}  // NOLINT: implicit by design
  PgParam(bool v) noexcept : value_(v) {}                // NOLINT: implicit by design
  template <std::integral T>
  requires(!std::is_same_v<T, bool>) PgParam(T v)
      : value_(to_int64(v)) {}                                   // NOLINT: implicit by design
  PgParam(double v) noexcept : value_(v) {}                      // NOLINT: implicit by design
  PgParam(std::string_view text) noexcept : value_(text) {}      // NOLINT: implicit by design
  PgParam(const char* text) : value_(std::string_view(text)) {}  // NOLINT: implicit by design
  PgParam(const std::string& text) noexcept                      // NOLINT: implicit by design
      : value_(std::string_view(text)) {}

  static PgParam bytea(std::string_view bytes) noexcept { return PgParam(Bytea{bytes}); }

  const Value& value() const noexcept { return value_; }

 private:
  explicit PgParam(Bytea b) noexcept : value_(b) {}

  template <std::integral T>
  static std::int64_t to_int64(T v) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(std::int64_t)) {
      if (v > static_cast<T>(std::numeric_limits<std::int64_t>::max())) {
        throw InvalidArgument("SQL parameter " + std::to_string(v) +
                              " does not fit PostgreSQL's bigint");
      }
    }
    return static_cast<std::int64_t>(v);
  }

  Value value_;
};

class PostgresTransaction final : public Transaction {
 public:
  PostgresTransaction(const PostgresTransaction&) = delete;
  PostgresTransaction& operator=(const PostgresTransaction&) = delete;

  // The connection the transaction is open on, for anything exec() does not cover.
  PGconn* connection() const noexcept;

  // Runs ONE SQL statement with `params` bound to $1, $2, ... (types inferred by the server from
  // the statement) and returns how many rows it changed (or returned). Throws PostgresError when
  // the server refuses it (the transaction is then aborted: let the exception leave the
  // handler), InvalidArgument for text with a NUL byte.
  std::int64_t exec(std::string_view sql, std::initializer_list<PgParam> params = {});

  // The first column of the first row of a query, or nullopt when there is no row or it is
  // NULL. Same rules as exec(). query_int64 also throws PostgresError when the value is not an
  // integer.
  std::optional<std::int64_t> query_int64(std::string_view sql,
                                          std::initializer_list<PgParam> params = {});
  std::optional<std::string> query_text(std::string_view sql,
                                        std::initializer_list<PgParam> params = {});

  // The consumer and event the transaction is recording.
  std::string_view consumer() const noexcept { return consumer_; }
  std::string_view event_id() const noexcept { return event_id_; }

  // Internal: made by PostgresIdempotencyRecorder::run_transactional() only.
  PostgresTransaction(detail::Connection& connection, std::string_view consumer,
                      std::string_view event_id) noexcept
      : connection_(&connection), consumer_(consumer), event_id_(event_id) {}

 private:
  detail::Connection* connection_;
  std::string_view consumer_;
  std::string_view event_id_;
};

}  // namespace idem::postgres
