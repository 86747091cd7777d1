// AsyncSqliteRecorder: the SQLite recorder as an idem::async::AsyncRecorder (target
// idem::sqlite_async).
//
// SQLite has no asynchronous I/O, so the coroutine face never touches the database on the
// awaiting coroutine's thread: every call runs the blocking SqliteIdempotencyRecorder call on a
// thread this object owns (AsyncSqliteOptions::threads of them) and the coroutine resumes on its
// own executor once the call has returned — for a mark, once its commit is as durable as
// SqliteOptions::durability promises. What runs where:
//   * marks (single and batch) join the recorder's group-commit queue from a pool thread, so
//     concurrent coroutine marks, and blocking callers of the same recorder, share commits;
//   * reads use the recorder's idle writer or its reader pool, from a pool thread;
//   * claims, complete, release, renew: one write transaction each, on a pool thread;
//   * run_transactional: one pool thread opens the write transaction, runs every statement the
//     callback issues through AsyncSqlTransaction, and commits or rolls back; the callback itself
//     is a coroutine on the caller's executor, which suspends while its statement runs. That
//     thread, and the recorder's write lock, are held for the whole callback: keep it short, and
//     do not call the recorder (or anything waiting for its write lock) from inside it.
//
// Guarantees: those of SqliteIdempotencyRecorder (sqlite_recorder.hpp), call for call;
// capabilities() == {.claims = true, .transactions = true}. A blocking user of the same
// SqliteIdempotencyRecorder (blocking()) sees the same markers and claims.
//
// Cancellation (the awaiting coroutine's slot): a call still waiting for a pool thread is
// withdrawn and ends with operation_aborted, having done nothing; a call a thread has started
// finishes and reports its real outcome (a commit SQLite began is never abandoned, so it is
// neither hidden nor in doubt). release() is never withdrawn once called (the cleanup
// of a cancelled handler, which resets its cancellation state to make the call).
// run_transactional's callback sees the cancellation in its next statement (operation_aborted), so
// the transaction rolls back.
//
// Thread safety: any number of coroutines on any executors may share one AsyncSqliteRecorder.
// Destroy it only after every call has completed; the destructor runs the queued calls and joins
// its threads. fork(): like the blocking recorder, it belongs to the parent (its threads are not
// in the child); make a new one in the child.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "idem/async/recorder.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"

namespace idem::sqlite {

namespace detail {
class WorkerPool;
}

struct AsyncSqliteOptions {
  // Threads that run the blocking calls. More threads let more marks share one group commit and
  // more reads run at once; a transaction holds one for its whole callback. At least 1
  // (ConfigError). Default 4.
  std::size_t threads = 4;
};

class AsyncSqliteRecorder final : public idem::async::AsyncRecorder {
 public:
  // Opens the database like SqliteIdempotencyRecorder(path, options) — blocking, on the calling
  // thread: construct it before the event loop runs (or on a thread of its own).
  explicit AsyncSqliteRecorder(std::string path, SqliteOptions options = {},
                               AsyncSqliteOptions async_options = {});
  // Serves coroutines from an existing recorder (not null: InvalidArgument), shared with its
  // blocking users.
  explicit AsyncSqliteRecorder(std::shared_ptr<SqliteIdempotencyRecorder> recorder,
                               AsyncSqliteOptions async_options = {});
  ~AsyncSqliteRecorder() override;

  AsyncSqliteRecorder(const AsyncSqliteRecorder&) = delete;
  AsyncSqliteRecorder& operator=(const AsyncSqliteRecorder&) = delete;

  [[nodiscard]] const std::shared_ptr<SqliteIdempotencyRecorder>& blocking() const noexcept {
    return recorder_;
  }

 private:
  using Task0 = idem::async::Task<void>;
  idem::async::Task<bool> do_is_processed(std::string_view consumer,
                                          std::string_view event_id) override;
  Task0 do_mark_processed(std::string_view consumer, std::string_view event_id) override;
  idem::async::Task<std::vector<bool>> do_is_processed_many(
      std::string_view consumer, std::span<const std::string> event_ids) override;
  Task0 do_mark_processed_many(std::string_view consumer,
                               std::span<const std::string> event_ids) override;
  idem::async::RecorderCapabilities do_capabilities() const noexcept override {
    return {.claims = true, .transactions = true};
  }
  idem::async::Task<Claim> do_claim(std::string_view consumer, std::string_view event_id,
                                    Millis lease) override;
  idem::async::Task<bool> do_complete(std::string_view consumer, std::string_view event_id,
                                      std::uint64_t token) override;
  idem::async::Task<bool> do_release(std::string_view consumer, std::string_view event_id,
                                     std::uint64_t token) override;
  idem::async::Task<bool> do_renew(std::string_view consumer, std::string_view event_id,
                                   std::uint64_t token, Millis lease) override;
  idem::async::Task<bool> do_run_transactional(std::string_view consumer, std::string_view event_id,
                                               TransactionalFn fn) override;

  std::shared_ptr<SqliteIdempotencyRecorder> recorder_;
  std::unique_ptr<detail::WorkerPool> pool_;  // last: its threads stop before the recorder goes
};

}  // namespace idem::sqlite
