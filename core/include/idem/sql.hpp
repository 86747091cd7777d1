// SQL inside a transactional handler, the same on every SQL backend.
//
// A transactional handler (HandlerMode::transactional, IdempotencyRecorder::run_transactional)
// gets the recorder's transaction as `Transaction&` (BusProxy::transaction()). On the SQL
// backends — idem::sqlite::SqliteTransaction and idem::postgres::PostgresTransaction — that is an
// SqlTransaction: the handler's own statements run in the same transaction as the marker, so the
// business rows and the marker commit or roll back together, without the handler knowing which
// backend it runs on:
//
//   auto& sql = dynamic_cast<idem::SqlTransaction&>(*bus.transaction());
//   sql.exec("INSERT INTO ledger(order_no, cents) VALUES ($1, $2)", {order, cents});
//
// Parameters are numbered `$1`, `$2`, ... in the order they are passed (PostgreSQL's syntax; SQLite
// reads `$1` as a parameter too, numbered by first appearance, and also takes `?`). A statement
// that names each parameter once, in order, is portable between the two; anything past that (column
// types, upsert syntax, RETURNING) is the backend's own SQL.
//
// Thread-safety: a transaction belongs to the handler call it was given to; do not keep it past
// the handler's return or use it from another thread.
#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "idem/error.hpp"
#include "idem/recorder.hpp"

namespace idem {

// One statement parameter: NULL, a boolean, a 64-bit integer, a double, text (UTF-8, no NUL
// byte on PostgreSQL) or bytes (SqlParam::blob). Text and bytes are views: the caller's string
// must live until the call returns. Unsigned values past INT64_MAX throw InvalidArgument (SQL
// integers are signed); a bool binds as PostgreSQL boolean and as SQLite integer 0/1.
class SqlParam {
 public:
  struct Blob {
    std::string_view bytes;
  };
  using Value = std::variant<std::nullptr_t, bool, std::int64_t, double, std::string_view, Blob>;

  SqlParam(std::nullptr_t) noexcept : value_(nullptr) {}  // NOLINT: implicit by design
  SqlParam(bool v) noexcept : value_(v) {}                // NOLINT: implicit by design
  template <std::integral T>
  requires(!std::is_same_v<T, bool>) SqlParam(T v)
      : value_(to_int64(v)) {}                                    // NOLINT: implicit by design
  SqlParam(double v) noexcept : value_(v) {}                      // NOLINT: implicit by design
  SqlParam(std::string_view text) noexcept : value_(text) {}      // NOLINT: implicit by design
  SqlParam(const char* text) : value_(std::string_view(text)) {}  // NOLINT: implicit by design
  SqlParam(const std::string& text) noexcept                      // NOLINT: implicit by design
      : value_(std::string_view(text)) {}

  // Bytes, bound as a BLOB (SQLite) or bytea (PostgreSQL); bytea() is the same, by PostgreSQL's
  // name.
  static SqlParam blob(std::string_view bytes) noexcept { return SqlParam(Blob{bytes}); }
  static SqlParam bytea(std::string_view bytes) noexcept { return blob(bytes); }

  const Value& value() const noexcept { return value_; }

 private:
  explicit SqlParam(Blob b) noexcept : value_(b) {}

  template <std::integral T>
  static std::int64_t to_int64(T v) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(std::int64_t)) {
      if (v > static_cast<T>(std::numeric_limits<std::int64_t>::max())) {
        throw InvalidArgument("SQL parameter " + std::to_string(v) +
                              " does not fit a 64-bit signed SQL integer");
      }
    }
    return static_cast<std::int64_t>(v);
  }

  Value value_;
};

// The transaction of a SQL backend, as a transactional handler sees it. Each call runs ONE
// statement with `params` bound in order. A statement that fails throws: InvalidArgument for
// what idem finds before running it (SQLite: a wrong number of parameters, more than one
// statement; PostgreSQL: text with a NUL byte), the backend's StoreError for what the database
// refuses. Let the exception leave the handler: the transaction then rolls back, marker and all
// (on PostgreSQL a failed statement has aborted the transaction anyway).
class SqlTransaction : public Transaction {
 public:
  // Runs the statement and returns how many rows it changed (for a query: how many it returned).
  std::int64_t exec(std::string_view sql, std::initializer_list<SqlParam> params = {}) {
    return do_exec(sql, {params.begin(), params.size()});
  }
  // The same with the parameters in a span, for callers that build the list at run time.
  std::int64_t exec(std::string_view sql, std::span<const SqlParam> params) {
    return do_exec(sql, params);
  }

  // The first column of the first row, or nullopt when there is no row or it is NULL.
  std::optional<std::int64_t> query_int64(std::string_view sql,
                                          std::initializer_list<SqlParam> params = {}) {
    return do_query_int64(sql, {params.begin(), params.size()});
  }
  std::optional<std::int64_t> query_int64(std::string_view sql, std::span<const SqlParam> params) {
    return do_query_int64(sql, params);
  }
  std::optional<std::string> query_text(std::string_view sql,
                                        std::initializer_list<SqlParam> params = {}) {
    return do_query_text(sql, {params.begin(), params.size()});
  }
  std::optional<std::string> query_text(std::string_view sql, std::span<const SqlParam> params) {
    return do_query_text(sql, params);
  }

  // The (consumer, event id) whose marker commits with this transaction.
  std::string_view consumer() const noexcept { return consumer_; }
  std::string_view event_id() const noexcept { return event_id_; }

 protected:
  // A backend's transaction: `consumer` and `event_id` must outlive it (they are the recorder
  // call's arguments).
  SqlTransaction(std::string_view consumer, std::string_view event_id) noexcept
      : consumer_(consumer), event_id_(event_id) {}
  SqlTransaction(const SqlTransaction&) = delete;
  SqlTransaction& operator=(const SqlTransaction&) = delete;

 private:
  // What a backend implements: one statement, its parameters bound in order.
  virtual std::int64_t do_exec(std::string_view sql, std::span<const SqlParam> params) = 0;
  virtual std::optional<std::int64_t> do_query_int64(std::string_view sql,
                                                     std::span<const SqlParam> params) = 0;
  virtual std::optional<std::string> do_query_text(std::string_view sql,
                                                   std::span<const SqlParam> params) = 0;

  std::string_view consumer_;
  std::string_view event_id_;
};

}  // namespace idem
