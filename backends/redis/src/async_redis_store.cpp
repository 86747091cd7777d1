#include "idem/redis/async_redis_store.hpp"

#include <array>
#include <utility>

#include "async_operations.hpp"
#include "idem/error.hpp"

namespace idem::redis {
namespace {

std::shared_ptr<AsyncConnectionPool> checked(std::shared_ptr<AsyncConnectionPool> pool) {
  if (!pool) throw InvalidArgument("AsyncRedisStore: the connection pool is null");
  return pool;
}

}  // namespace

AsyncRedisStore::AsyncRedisStore(asio::any_io_executor executor, RedisOptions options)
    : AsyncRedisStore(
          std::make_shared<AsyncConnectionPool>(std::move(executor), std::move(options))) {}

AsyncRedisStore::AsyncRedisStore(std::shared_ptr<AsyncConnectionPool> pool)
    : pool_(checked(std::move(pool))),
      clock_(pool_->options().clock ? pool_->options().clock : system_clock()) {}

async::Task<void> AsyncRedisStore::ping() {
  co_await detail::ping_async(pool_->next());
}

std::string AsyncRedisStore::record_key(std::string_view key) const {
  return detail::record_key(pool_->options().key_prefix, key);
}

async::Task<ClaimOutcome> AsyncRedisStore::do_claim(std::string_view key,
                                                    std::optional<std::string_view> fingerprint,
                                                    Millis lease) {
  detail::StoreClaim claim(pool_->options(), detail::to_ms(clock_->wall_now()), key, fingerprint,
                           lease, claim_reads_first_.load(std::memory_order_relaxed));
  AsyncConnection& connection = pool_->next();
  for (;;) {
    const RedisReply reply = co_await detail::send_async(connection, claim.request(), "claim");
    if (claim.read(reply, connection.endpoint())) break;
  }
  claim_reads_first_.store(detail::next_claim_reads_first(claim.outcome()),
                           std::memory_order_relaxed);
  co_return std::move(claim.outcome());
}

async::Task<bool> AsyncRedisStore::do_complete(std::string_view key, std::uint64_t token,
                                               StoredValue value, const ExecutionReport& report,
                                               Millis ttl) {
  const auto call = detail::store_complete_call(pool_->options(), detail::to_ms(clock_->wall_now()),
                                                key, token, value, report, ttl);
  AsyncConnection& connection = pool_->next();
  const RedisReply reply =
      co_await detail::run_script_async(connection, call, CommandKind::write, "complete");
  co_return detail::flag_reply(reply, "complete", connection.endpoint());
}

async::Task<bool> AsyncRedisStore::do_release(std::string_view key, std::uint64_t token) {
  const auto call = detail::store_release_call(pool_->options(), key, token);
  AsyncConnection& connection = pool_->next();
  const RedisReply reply =
      co_await detail::run_script_async(connection, call, CommandKind::write, "release");
  co_return detail::flag_reply(reply, "release", connection.endpoint());
}

async::Task<bool> AsyncRedisStore::do_renew(std::string_view key, std::uint64_t token,
                                            Millis lease) {
  const auto call = detail::store_renew_call(pool_->options(), detail::to_ms(clock_->wall_now()),
                                             key, token, lease);
  AsyncConnection& connection = pool_->next();
  const RedisReply reply =
      co_await detail::run_script_async(connection, call, CommandKind::write, "renew");
  co_return detail::flag_reply(reply, "renew", connection.endpoint());
}

async::Task<std::optional<IdempotencyRecord>> AsyncRedisStore::do_lookup(std::string_view key) {
  detail::StoreLookup lookup(pool_->options(), clock_->wall_now(), key);
  AsyncConnection& connection = pool_->next();
  for (;;) {
    const RedisReply reply = co_await detail::send_async(connection, lookup.request(), "lookup");
    if (lookup.read(reply, connection.endpoint())) co_return std::move(lookup.outcome());
  }
}

}  // namespace idem::redis
