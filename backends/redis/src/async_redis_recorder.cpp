#include "idem/redis/async_redis_recorder.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "async_operations.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"

namespace idem::redis {
namespace {

// Ids per pipelined round trip of the batch calls (bounds one batch's buffers), as the blocking
// recorder.
constexpr std::size_t kBatchChunk = 512;

std::shared_ptr<AsyncConnectionPool> checked(std::shared_ptr<AsyncConnectionPool> pool) {
  if (!pool) throw InvalidArgument("AsyncRedisRecorder: the connection pool is null");
  return pool;
}

}  // namespace

AsyncRedisRecorder::AsyncRedisRecorder(asio::any_io_executor executor, RedisOptions options)
    : AsyncRedisRecorder(
          std::make_shared<AsyncConnectionPool>(std::move(executor), std::move(options))) {}

AsyncRedisRecorder::AsyncRedisRecorder(std::shared_ptr<AsyncConnectionPool> pool)
    : pool_(checked(std::move(pool))),
      clock_(pool_->options().clock ? pool_->options().clock : system_clock()) {}

async::Task<void> AsyncRedisRecorder::ping() {
  co_await detail::ping_async(pool_->next());
}

std::string AsyncRedisRecorder::marker_key(std::string_view consumer,
                                           std::string_view event_id) const {
  return detail::marker_key(pool_->options().key_prefix, consumer, event_id);
}

std::string AsyncRedisRecorder::claim_key(std::string_view consumer,
                                          std::string_view event_id) const {
  return detail::claim_key(pool_->options().key_prefix, consumer, event_id);
}

async::Task<bool> AsyncRedisRecorder::do_is_processed(std::string_view consumer,
                                                      std::string_view event_id) {
  const std::string key = marker_key(consumer, event_id);
  AsyncConnection& connection = pool_->next();
  const std::array<std::string_view, 2> args = {"EXISTS", key};
  const RedisReply reply = co_await connection.command(args, CommandKind::read, "is_processed");
  co_return detail::flag_reply(reply, "is_processed", connection.endpoint());
}

async::Task<void> AsyncRedisRecorder::do_mark_processed(std::string_view consumer,
                                                        std::string_view event_id) {
  const auto args = detail::mark_command(pool_->options(), marker_key(consumer, event_id),
                                         std::to_string(detail::to_ms(clock_->wall_now())));
  const std::vector<std::string_view> views(args.begin(), args.end());
  AsyncConnection& connection = pool_->next();
  const RedisReply reply =
      co_await connection.command(views, CommandKind::idempotent_write, "mark_processed");
  (void)detail::mark_reply(reply, connection.endpoint());
}

async::Task<std::vector<bool>> AsyncRedisRecorder::do_is_processed_many(
    std::string_view consumer, std::span<const std::string> event_ids) {
  std::vector<bool> processed;
  processed.reserve(event_ids.size());
  AsyncConnection& connection = pool_->next();
  for (std::size_t offset = 0; offset < event_ids.size(); offset += kBatchChunk) {
    const std::size_t n = std::min(kBatchChunk, event_ids.size() - offset);
    CommandBatch batch;
    for (std::size_t i = 0; i < n; ++i) {
      // One EXISTS per key (a multi-key EXISTS only counts them).
      const std::string key = marker_key(consumer, event_ids[offset + i]);
      const std::array<std::string_view, 2> args = {"EXISTS", key};
      batch.add(args);
    }
    const auto replies =
        co_await connection.pipeline(std::move(batch), CommandKind::read, "is_processed");
    for (const RedisReply& reply : replies)
      processed.push_back(detail::flag_reply(reply, "is_processed", connection.endpoint()));
  }
  co_return processed;
}

async::Task<std::size_t> AsyncRedisRecorder::mark_processed_batch(
    std::string_view consumer, std::span<const std::string> event_ids) {
  validate_key("consumer", consumer);
  for (const std::string& id : event_ids)
    validate_key("event id", id);
  const std::string ts = std::to_string(detail::to_ms(clock_->wall_now()));
  AsyncConnection& connection = pool_->next();
  std::size_t fresh = 0;
  for (std::size_t offset = 0; offset < event_ids.size(); offset += kBatchChunk) {
    const std::size_t n = std::min(kBatchChunk, event_ids.size() - offset);
    CommandBatch batch;
    for (std::size_t i = 0; i < n; ++i) {
      const auto args =
          detail::mark_command(pool_->options(), marker_key(consumer, event_ids[offset + i]), ts);
      const std::vector<std::string_view> views(args.begin(), args.end());
      batch.add(views);
    }
    const auto replies = co_await connection.pipeline(
        std::move(batch), CommandKind::idempotent_write, "mark_processed");
    for (const RedisReply& reply : replies)
      if (detail::mark_reply(reply, connection.endpoint())) ++fresh;
  }
  co_return fresh;
}

async::Task<void> AsyncRedisRecorder::do_mark_processed_many(
    std::string_view consumer, std::span<const std::string> event_ids) {
  (void)co_await mark_processed_batch(consumer, event_ids);
}

async::Task<Claim> AsyncRedisRecorder::do_claim(std::string_view consumer,
                                                std::string_view event_id, Millis lease) {
  const auto call = detail::recorder_claim_call(pool_->options(), detail::to_ms(clock_->wall_now()),
                                                consumer, event_id, lease);
  AsyncConnection& connection = pool_->next();
  const RedisReply reply =
      co_await detail::run_script_async(connection, call, CommandKind::write, "claim");
  co_return detail::recorder_claim_reply(reply, consumer, event_id, call.keys[1],
                                         connection.endpoint());
}

async::Task<bool> AsyncRedisRecorder::do_complete(std::string_view consumer,
                                                  std::string_view event_id, std::uint64_t token) {
  const auto call = detail::recorder_complete_call(
      pool_->options(), detail::to_ms(clock_->wall_now()), consumer, event_id, token);
  AsyncConnection& connection = pool_->next();
  const RedisReply reply =
      co_await detail::run_script_async(connection, call, CommandKind::write, "complete");
  co_return detail::flag_reply(reply, "complete", connection.endpoint());
}

async::Task<bool> AsyncRedisRecorder::do_release(std::string_view consumer,
                                                 std::string_view event_id, std::uint64_t token) {
  const auto call = detail::recorder_release_call(pool_->options(), consumer, event_id, token);
  AsyncConnection& connection = pool_->next();
  const RedisReply reply =
      co_await detail::run_script_async(connection, call, CommandKind::write, "release");
  co_return detail::flag_reply(reply, "release", connection.endpoint());
}

async::Task<bool> AsyncRedisRecorder::do_renew(std::string_view consumer, std::string_view event_id,
                                               std::uint64_t token, Millis lease) {
  const auto call = detail::recorder_renew_call(pool_->options(), detail::to_ms(clock_->wall_now()),
                                                consumer, event_id, token, lease);
  AsyncConnection& connection = pool_->next();
  const RedisReply reply =
      co_await detail::run_script_async(connection, call, CommandKind::write, "renew");
  co_return detail::flag_reply(reply, "renew", connection.endpoint());
}

}  // namespace idem::redis
