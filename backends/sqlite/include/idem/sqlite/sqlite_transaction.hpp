// SqliteTransaction: the open SQLite transaction a transactional handler writes through.
//
// SqliteIdempotencyRecorder::run_transactional() begins a write transaction (BEGIN IMMEDIATE),
// inserts the marker, and hands the handler this object. Everything the handler writes through
// it — exec(), or the raw connection from db() — commits together with the marker, or not at
// all: if the handler throws, or the process dies before COMMIT, neither the marker nor the
// handler's rows exist. Handlers reach it through the bus: `bus.transaction()` downcast to
// idem::sqlite::SqliteTransaction.
//
//   auto& tx = dynamic_cast<idem::sqlite::SqliteTransaction&>(*bus.transaction());
//   tx.exec("INSERT INTO shipments(order_id, address) VALUES (?, ?)", {order_id, address});
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

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "idem/error.hpp"
#include "idem/recorder.hpp"

struct sqlite3;

namespace idem::sqlite {

namespace detail {
class Connection;
}

// One bound parameter of exec()/query_*(): NULL, an integer, a real, text or a blob. Text and
// blobs are referenced, not copied: they must outlive the call (temporaries in the argument list
// do).
class SqlParam {
 public:
  struct Blob {
    std::string_view bytes;
  };
  using Value = std::variant<std::nullptr_t, std::int64_t, double, std::string_view, Blob>;

  SqlParam(std::nullptr_t) noexcept : value_(nullptr) {}  // NOLINT: implicit by design
  template <std::integral T>
  SqlParam(T v) : value_(to_int64(v)) {}                          // NOLINT: implicit by design
  SqlParam(double v) noexcept : value_(v) {}                      // NOLINT: implicit by design
  SqlParam(std::string_view text) noexcept : value_(text) {}      // NOLINT: implicit by design
  SqlParam(const char* text) : value_(std::string_view(text)) {}  // NOLINT: implicit by design
  SqlParam(const std::string& text) noexcept                      // NOLINT: implicit by design
      : value_(std::string_view(text)) {}

  static SqlParam blob(std::string_view bytes) noexcept { return SqlParam(Blob{bytes}); }

  const Value& value() const noexcept { return value_; }

 private:
  explicit SqlParam(Blob b) noexcept : value_(b) {}

  template <std::integral T>
  static std::int64_t to_int64(T v) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(std::int64_t)) {
      if (v > static_cast<T>(std::numeric_limits<std::int64_t>::max())) {
        throw InvalidArgument("SQL parameter " + std::to_string(v) +
                              " does not fit SQLite's 64-bit signed INTEGER");
      }
    }
    return static_cast<std::int64_t>(v);
  }

  Value value_;
};

class SqliteTransaction final : public Transaction {
 public:
  SqliteTransaction(const SqliteTransaction&) = delete;
  SqliteTransaction& operator=(const SqliteTransaction&) = delete;

  // The connection the transaction is open on, for anything exec() does not cover.
  sqlite3* db() const noexcept;

  // Runs ONE SQL statement with `params` bound to its `?` placeholders in order, and returns
  // how many rows it changed. The statement is prepared once and cached on the connection.
  // Throws SqliteError when SQLite fails (the transaction then rolls back when the handler's
  // exception leaves it), InvalidArgument for a wrong number of parameters or more than one
  // statement.
  std::int64_t exec(std::string_view sql, std::initializer_list<SqlParam> params = {});

  // The first column of the first row of a query, or nullopt when there is no row or it is
  // NULL. Same rules as exec().
  std::optional<std::int64_t> query_int64(std::string_view sql,
                                          std::initializer_list<SqlParam> params = {});
  std::optional<std::string> query_text(std::string_view sql,
                                        std::initializer_list<SqlParam> params = {});

  // The consumer and event the transaction is recording.
  std::string_view consumer() const noexcept { return consumer_; }
  std::string_view event_id() const noexcept { return event_id_; }

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
