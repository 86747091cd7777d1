// AsyncRedisRecorder: the Redis recorder (redis_recorder.hpp) for coroutines.
//
// The same keys, the same Lua scripts and the same meaning call for call as the blocking
// RedisIdempotencyRecorder — a blocking and a coroutine user of one server and prefix see each
// other's markers and claims, and fence each other's tokens. Check/mark and claims (exclusive
// mode); no transactional mode. The batch calls are one pipelined round trip per 512 ids.
//
// Every call goes over an AsyncConnectionPool (async_connection.hpp): RedisOptions::
// async_connections pipelined connections (default 1) carry any number of concurrent coroutines.
// Nothing is opened by the constructor: the first call connects (use ping() to check the server
// up front). Errors are those of the blocking recorder (redis_error.hpp), plus cancellation:
// a call cancelled through its coroutine's cancellation slot before its command was written ends
// with asio::system_error(operation_aborted) and nothing happened; after, a read still ends with
// operation_aborted, and a write with an in-doubt RedisError (a mark may or may not be stored; a
// claim may be held until its lease ends, a complete may have happened: see the lookup/lease
// rules in docs/redis.md).
//
// Thread safety: any number of coroutines on any executors may use one recorder at once; each
// resumes on its own executor. The executor given to the constructor (or the pool's) runs the
// socket I/O; its execution context must outlive the recorder.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <asio/any_io_executor.hpp>

#include "idem/async/recorder.hpp"
#include "idem/clock.hpp"
#include "idem/redis/async_connection.hpp"
#include "idem/redis/redis_options.hpp"

namespace idem::redis {

class AsyncRedisRecorder final : public async::AsyncRecorder {
 public:
  // Validates the options (ConfigError) and makes a pool on `executor`.
  AsyncRedisRecorder(asio::any_io_executor executor, RedisOptions options);
  // Shares `pool` (e.g. with an AsyncRedisStore). Throws InvalidArgument when it is null.
  explicit AsyncRedisRecorder(std::shared_ptr<AsyncConnectionPool> pool);

  // PING on one connection: throws RedisError when the server cannot be reached.
  async::Task<void> ping();
  // Marks every id in one pipelined round trip per 512; returns how many were new.
  async::Task<std::size_t> mark_processed_batch(std::string_view consumer,
                                                std::span<const std::string> event_ids);

  using executor_type = asio::any_io_executor;
  // The executor its connections run on (the pool's).
  executor_type get_executor() const noexcept { return pool_->get_executor(); }
  const std::shared_ptr<AsyncConnectionPool>& pool() const noexcept { return pool_; }
  // The Redis key of a marker / claim (the blocking recorder's layout).
  std::string marker_key(std::string_view consumer, std::string_view event_id) const;
  std::string claim_key(std::string_view consumer, std::string_view event_id) const;

 private:
  async::Task<bool> do_is_processed(std::string_view consumer, std::string_view event_id) override;
  async::Task<void> do_mark_processed(std::string_view consumer,
                                      std::string_view event_id) override;
  async::Task<std::vector<bool>> do_is_processed_many(
      std::string_view consumer, std::span<const std::string> event_ids) override;
  async::Task<void> do_mark_processed_many(std::string_view consumer,
                                           std::span<const std::string> event_ids) override;
  async::RecorderCapabilities do_capabilities() const noexcept override {
    return {.claims = true, .transactions = false};
  }
  async::Task<Claim> do_claim(std::string_view consumer, std::string_view event_id,
                              Millis lease) override;
  async::Task<bool> do_complete(std::string_view consumer, std::string_view event_id,
                                std::uint64_t token) override;
  async::Task<bool> do_release(std::string_view consumer, std::string_view event_id,
                               std::uint64_t token) override;
  async::Task<bool> do_renew(std::string_view consumer, std::string_view event_id,
                             std::uint64_t token, Millis lease) override;

  std::shared_ptr<AsyncConnectionPool> pool_;
  std::shared_ptr<Clock> clock_;
};

}  // namespace idem::redis
