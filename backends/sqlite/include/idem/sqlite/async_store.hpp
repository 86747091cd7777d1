// AsyncSqliteStore: the SQLite idempotency store as an idem::async::AsyncStore (target
// idem::sqlite_async), for the operation face's coroutine callers.
//
// Like AsyncSqliteRecorder (async_recorder.hpp): every call runs the blocking
// SqliteIdempotencyStore call on a thread this object owns (AsyncSqliteOptions::threads) and the
// awaiting coroutine resumes on its own executor when it has returned; nothing touches SQLite on
// the caller's thread. needs_bytes() is true (values cross as encoded bytes), and
// blocking_store() is the SqliteIdempotencyStore it serves, so blocking and coroutine callers of
// one key in this process can join one execution.
//
// Cancellation: a call still waiting for a thread is withdrawn (operation_aborted, nothing
// done); a started call finishes and reports its real outcome. release() is never withdrawn once
// called.
//
// Thread safety: any number of coroutines on any executors may share one AsyncSqliteStore.
// Destroy it only after its calls have completed. fork(): it belongs to the parent.
#pragma once

#include <memory>
#include <string>

#include "idem/async/store.hpp"
#include "idem/sqlite/async_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"

namespace idem::sqlite {

class AsyncSqliteStore final : public idem::async::AsyncStore {
 public:
  // Opens the database like SqliteIdempotencyStore(path, options) — blocking, on the calling
  // thread: construct it before the event loop runs.
  explicit AsyncSqliteStore(std::string path, SqliteOptions options = {},
                            AsyncSqliteOptions async_options = {});
  // Serves coroutines from an existing store (not null: InvalidArgument).
  explicit AsyncSqliteStore(std::shared_ptr<SqliteIdempotencyStore> store,
                            AsyncSqliteOptions async_options = {});
  ~AsyncSqliteStore() override;

  AsyncSqliteStore(const AsyncSqliteStore&) = delete;
  AsyncSqliteStore& operator=(const AsyncSqliteStore&) = delete;

  [[nodiscard]] const std::shared_ptr<SqliteIdempotencyStore>& blocking() const noexcept {
    return store_;
  }

 private:
  bool do_needs_bytes() const noexcept override { return true; }
  std::shared_ptr<IdempotencyStore> do_blocking_store() const noexcept override { return store_; }
  idem::async::Task<ClaimOutcome> do_claim(std::string_view key,
                                           std::optional<std::string_view> fingerprint,
                                           Millis lease) override;
  idem::async::Task<ClaimOutcome> do_claim_without_report(
      std::string_view key, std::optional<std::string_view> fingerprint, Millis lease) override;
  idem::async::Task<bool> do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                                      const ExecutionReport& report, Millis ttl) override;
  idem::async::Task<bool> do_release(std::string_view key, std::uint64_t token) override;
  idem::async::Task<bool> do_renew(std::string_view key, std::uint64_t token,
                                   Millis lease) override;
  idem::async::Task<std::optional<IdempotencyRecord>> do_lookup(std::string_view key) override;

  void use_store_clock();

  std::shared_ptr<SqliteIdempotencyStore> store_;
  std::unique_ptr<detail::WorkerPool> pool_;  // last: its threads stop before the store goes
};

}  // namespace idem::sqlite
