// AsyncRecorder: the consumer face's recorder protocol (see idem/recorder.hpp for the blocking
// one, whose meaning it shares call for call) as coroutines.
//
// The public calls are non-virtual: each checks its arguments once (consumer and event id as
// validate_key() defines them, lease > 0) and then calls the private do_* virtual a backend
// implements, so a backend only ever sees valid arguments. The batch and claim defaults below
// are what a backend inherits when it does not override them.
//
// Thread safety: one AsyncRecorder may be used by any number of coroutines on any executors at
// once, unless the backend's header says otherwise.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/async/task.hpp"
#include "idem/clock.hpp"
#include "idem/recorder.hpp"
#include "idem/sql.hpp"

namespace idem::async {

// The same capabilities value as the blocking recorder's.
using idem::RecorderCapabilities;

// The transaction a transactional handler writes through, as coroutines: SqlTransaction's twin
// (idem/sql.hpp), call for call and with the same results, with two differences. query_int64
// throws StoreError where the blocking one returns std::nullopt (no row, or NULL). The
// parameters come as a span (an array of SqlParam), not a braced list: g++ 12 cannot keep a
// braced list's array alive across the co_await that runs the statement. It is bound to the
// coroutine that runs run_transactional's callback: do not use it from another coroutine, nor
// after the callback has returned. Await each call where you make it: the parameters are read
// while the statement runs, not copied.
//
// The public calls are non-virtual; a backend implements the private do_* coroutines.
class AsyncSqlTransaction {
 public:
  virtual ~AsyncSqlTransaction() = default;

  // Runs one statement with positional parameters (SQLite `?` or `$1`, PostgreSQL `$1`) and
  // completes with how many rows it changed (for a query: how many it returned).
  Task<std::int64_t> exec(std::string_view sql, std::span<const SqlParam> params = {}) {
    return do_exec(sql, params);
  }
  // The first column of the first row as an integer (StoreError when there is no row or it is
  // NULL).
  Task<std::int64_t> query_int64(std::string_view sql, std::span<const SqlParam> params = {}) {
    return do_query_int64(sql, params);
  }
  // The first column of the first row as text; std::nullopt for SQL NULL or no row.
  Task<std::optional<std::string>> query_text(std::string_view sql,
                                              std::span<const SqlParam> params = {}) {
    return do_query_text(sql, params);
  }

  // The consumer and event id whose marker this transaction inserts.
  std::string_view consumer() const noexcept { return consumer_; }
  std::string_view event_id() const noexcept { return event_id_; }

 protected:
  // A backend's transaction: `consumer` and `event_id` must outlive it (they are the recorder
  // call's arguments).
  AsyncSqlTransaction(std::string_view consumer, std::string_view event_id) noexcept
      : consumer_(consumer), event_id_(event_id) {}
  AsyncSqlTransaction(const AsyncSqlTransaction&) = delete;
  AsyncSqlTransaction& operator=(const AsyncSqlTransaction&) = delete;

 private:
  // What a backend implements: one statement, its parameters bound in order.
  virtual Task<std::int64_t> do_exec(std::string_view sql, std::span<const SqlParam> params) = 0;
  virtual Task<std::int64_t> do_query_int64(std::string_view sql,
                                            std::span<const SqlParam> params) = 0;
  virtual Task<std::optional<std::string>> do_query_text(std::string_view sql,
                                                         std::span<const SqlParam> params) = 0;

  std::string_view consumer_;
  std::string_view event_id_;
};

class AsyncRecorder {
 public:
  virtual ~AsyncRecorder() = default;

  // True when `consumer` has marked `event_id` processed.
  Task<bool> is_processed(std::string_view consumer, std::string_view event_id);
  // Records the marker; a repeat is harmless. Completes once the marker is as durable as the
  // backend promises.
  Task<void> mark_processed(std::string_view consumer, std::string_view event_id);
  // result[i] == is_processed(consumer, event_ids[i]); every id is checked first.
  Task<std::vector<bool>> is_processed_many(std::string_view consumer,
                                            std::span<const std::string> event_ids);
  // mark_processed for every id (every id checked first; see IdempotencyRecorder for what a
  // failure in the middle means).
  Task<void> mark_processed_many(std::string_view consumer, std::span<const std::string> event_ids);

  [[nodiscard]] RecorderCapabilities capabilities() const noexcept { return do_capabilities(); }

  // Exclusive mode (capabilities().claims), with IdempotencyRecorder's semantics.
  Task<Claim> claim(std::string_view consumer, std::string_view event_id, Millis lease);
  Task<bool> complete(std::string_view consumer, std::string_view event_id, std::uint64_t token);
  Task<bool> release(std::string_view consumer, std::string_view event_id, std::uint64_t token);
  Task<bool> renew(std::string_view consumer, std::string_view event_id, std::uint64_t token,
                   Millis lease);

  // Transactional mode (capabilities().transactions): in one transaction, insert the marker; if
  // it existed, roll back and return false without calling `fn`; else co_await fn(tx) and
  // commit. If fn throws (or is cancelled), roll back and rethrow.
  using TransactionalFn = std::function<Task<void>(AsyncSqlTransaction&)>;
  Task<bool> run_transactional(std::string_view consumer, std::string_view event_id,
                               TransactionalFn fn);

 protected:
  friend class RecorderWrapper;  // forwards to the do_* of the recorder it wraps (wrapper.hpp)

  // What a backend implements (protected, so that an override can call the base's default).
  virtual Task<bool> do_is_processed(std::string_view consumer, std::string_view event_id) = 0;
  virtual Task<void> do_mark_processed(std::string_view consumer, std::string_view event_id) = 0;
  // Defaults: one call per id, in order.
  virtual Task<std::vector<bool>> do_is_processed_many(std::string_view consumer,
                                                       std::span<const std::string> event_ids);
  virtual Task<void> do_mark_processed_many(std::string_view consumer,
                                            std::span<const std::string> event_ids);
  virtual RecorderCapabilities do_capabilities() const noexcept { return {}; }
  // Defaults: throw NotSupported.
  virtual Task<Claim> do_claim(std::string_view consumer, std::string_view event_id, Millis lease);
  virtual Task<bool> do_complete(std::string_view consumer, std::string_view event_id,
                                 std::uint64_t token);
  virtual Task<bool> do_release(std::string_view consumer, std::string_view event_id,
                                std::uint64_t token);
  virtual Task<bool> do_renew(std::string_view consumer, std::string_view event_id,
                              std::uint64_t token, Millis lease);
  virtual Task<bool> do_run_transactional(std::string_view consumer, std::string_view event_id,
                                          TransactionalFn fn);
};

}  // namespace idem::async
