// AsyncRedisStore: the Redis idempotency store (redis_store.hpp) for coroutines.
//
// The same record layout (one string at P s:{key}), the same tokens, the same commands and
// scripts (a claim starts with a GET or with SET NX GET as the store's last claim ended) and the
// same meaning call for call as the blocking RedisIdempotencyStore: blocking and coroutine callers
// of one key meet in Redis — one claims, the other sees it in progress, and either can replay the
// other's result. needs_bytes() is true: values are stored encoded.
//
// Calls go over an AsyncConnectionPool (async_connection.hpp; RedisOptions::async_connections
// pipelined connections, default 1). Nothing is opened by the constructor. Errors are those of
// the blocking store (redis_error.hpp); a call cancelled through its coroutine's cancellation
// slot before its command was written ends with asio::system_error(operation_aborted) and
// nothing happened; after, a lookup still ends with operation_aborted and a write with an
// in-doubt RedisError (a claim then holds the key until its lease ends, as after a crash).
//
// Thread safety: any number of coroutines on any executors may use one store at once; each
// resumes on its own executor. The I/O executor's execution context must outlive the store.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <asio/any_io_executor.hpp>

#include "idem/async/store.hpp"
#include "idem/clock.hpp"
#include "idem/redis/async_connection.hpp"
#include "idem/redis/redis_options.hpp"

namespace idem::redis {

class AsyncRedisStore final : public async::AsyncStore {
 public:
  // Validates the options (ConfigError) and makes a pool on `executor`.
  AsyncRedisStore(asio::any_io_executor executor, RedisOptions options);
  // Shares `pool` (e.g. with an AsyncRedisRecorder). Throws InvalidArgument when it is null.
  explicit AsyncRedisStore(std::shared_ptr<AsyncConnectionPool> pool);

  // PING on one connection: throws RedisError when the server cannot be reached.
  async::Task<void> ping();

  using executor_type = asio::any_io_executor;
  // The executor its connections run on (the pool's).
  executor_type get_executor() const noexcept { return pool_->get_executor(); }
  const std::shared_ptr<AsyncConnectionPool>& pool() const noexcept { return pool_; }
  // The Redis key of a record (the blocking store's layout).
  std::string record_key(std::string_view key) const;

 private:
  bool do_needs_bytes() const noexcept override { return true; }
  async::Task<ClaimOutcome> do_claim(std::string_view key,
                                     std::optional<std::string_view> fingerprint,
                                     Millis lease) override;
  // A completed record found is decoded without its report.
  async::Task<ClaimOutcome> do_claim_without_report(std::string_view key,
                                                    std::optional<std::string_view> fingerprint,
                                                    Millis lease) override;
  async::Task<ClaimOutcome> claim_record(std::string_view key,
                                         std::optional<std::string_view> fingerprint, Millis lease,
                                         bool with_report);
  async::Task<bool> do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                                const ExecutionReport& report, Millis ttl) override;
  async::Task<bool> do_release(std::string_view key, std::uint64_t token) override;
  async::Task<bool> do_renew(std::string_view key, std::uint64_t token, Millis lease) override;
  async::Task<std::optional<IdempotencyRecord>> do_lookup(std::string_view key) override;
  // Woken by the record's pub/sub channel (docs/redis.md, "Waiters"), polling as a fallback.
  async::Task<std::optional<IdempotencyRecord>> do_wait(std::string_view key, SteadyTime deadline,
                                                        std::stop_token stop) override;

  std::shared_ptr<AsyncConnectionPool> pool_;
  std::shared_ptr<Clock> clock_;
  std::atomic<bool> claim_reads_first_{false};  // how the next claim starts (docs/redis.md §5)
};

}  // namespace idem::redis
