#include "idem/redis/async_redis_store.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <utility>

#include "async_operations.hpp"
#include "idem/detail/contract.hpp"
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
      clock_(pool_->options().clock ? pool_->options().clock : system_clock()) {
  wait_clock_ = clock_;
}

async::Task<void> AsyncRedisStore::ping() {
  co_await detail::ping_async(pool_->next());
}

std::string AsyncRedisStore::record_key(std::string_view key) const {
  return detail::record_key(pool_->options().key_prefix, key);
}

async::Task<ClaimOutcome> AsyncRedisStore::do_claim(std::string_view key,
                                                    std::optional<std::string_view> fingerprint,
                                                    Millis lease) {
  return claim_record(key, fingerprint, lease, /*with_report=*/true);
}

async::Task<ClaimOutcome> AsyncRedisStore::do_claim_without_report(
    std::string_view key, std::optional<std::string_view> fingerprint, Millis lease) {
  return claim_record(key, fingerprint, lease, /*with_report=*/false);
}

async::Task<ClaimOutcome> AsyncRedisStore::claim_record(std::string_view key,
                                                        std::optional<std::string_view> fingerprint,
                                                        Millis lease, bool with_report) {
  detail::StoreClaim claim(pool_->options(), detail::to_ms(clock_->wall_now()), key, fingerprint,
                           lease, claim_reads_first_.load(std::memory_order_relaxed), with_report);
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

async::Task<std::optional<IdempotencyRecord>> AsyncRedisStore::do_wait(std::string_view key,
                                                                       SteadyTime deadline,
                                                                       std::stop_token stop) {
  // A test clock's time is its own: the socket cannot wait on it. Poll as the base class does.
  if (pool_->options().clock) co_return co_await AsyncStore::do_wait(key, deadline, stop);
  // A connection of its own, subscribed before the first read, so that a completion between the
  // read and the wait is heard. (The pool's connections are shared by other calls.)
  const std::unique_ptr<AsyncConnection> connection = pool_->open_dedicated();
  AsyncConnection& subscriber = *connection;
  bool subscribed = false;
  try {
    const RedisReply reply = co_await subscriber.subscribe(detail::done_channel(record_key(key)));
    subscribed = !reply.is_error();  // an ACL without pub/sub: poll
  } catch (const RedisError&) {
  }
  if (!subscribed) co_return co_await AsyncStore::do_wait(key, deadline, stop);
  // Read again at least this often: a safety net for a message lost with its connection.
  constexpr std::chrono::milliseconds kReread{1000};
  // How often a wait for a message looks at `stop` (when it can be requested).
  constexpr std::chrono::milliseconds kStopCheck{50};
  for (;;) {
    auto record = co_await do_lookup(key);
    const WallTime now_wall = clock_->wall_now();
    if (!idem::detail::held_at(record, now_wall)) co_return record;
    const SteadyTime now = clock_->steady_now();
    if (now >= deadline || stop.stop_requested()) co_return record;
    // An owner that dies publishes nothing: its lease's end is the next moment to look.
    const auto lease_left =
        std::chrono::duration_cast<std::chrono::milliseconds>(record->lease_until - now_wall);
    const SteadyTime until = std::min({deadline, now + lease_left, now + kReread});
    for (;;) {
      const SteadyTime slice =
          stop.stop_possible() ? std::min(until, clock_->steady_now() + kStopCheck) : until;
      std::optional<RedisReply> message;
      bool gone = false;
      try {
        message = co_await subscriber.next_message(slice);
      } catch (const RedisError&) {
        gone = true;
      }
      // A cluster that moves the slot away ends the subscription ([s]unsubscribe).
      if (message && message->type == RedisReply::Type::array && !message->elements.empty() &&
          message->elements[0].str.find("unsubscribe") != std::string::npos) {
        gone = true;
      }
      // The subscription is gone: poll for the rest of the wait.
      if (gone) co_return co_await AsyncStore::do_wait(key, deadline, stop);
      if (message || stop.stop_requested() || clock_->steady_now() >= until) break;
    }
  }
}

}  // namespace idem::redis
