#include "idem/redis/redis_recorder.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "idem/error.hpp"
#include "idem/key.hpp"
#include "internal.hpp"
#include "operations.hpp"

namespace idem::redis {
namespace {

// Ids per pipelined round trip in mark_processed_batch (bounds the buffers of one batch).
constexpr std::size_t kBatchChunk = 512;

void ping(ConnectionPool& pool) {
  auto connection = pool.lease();
  const RedisReply reply = connection->command({"PING"}, CommandKind::read, "PING");
  if (reply.type != RedisReply::Type::status) {
    detail::throw_unexpected_reply(reply, "PING", connection->endpoint());
  }
}

using detail::flag_reply;

std::size_t mark_chunk(ConnectionPool& pool, std::string_view consumer,
                       std::span<const std::string_view> ids, const std::string& ts) {
  const RedisOptions& options = pool.options();
  auto connection = pool.lease();
  for (std::string_view id : ids) {
    const auto args =
        detail::mark_command(options, detail::marker_key(options.key_prefix, consumer, id), ts);
    const std::vector<std::string_view> views(args.begin(), args.end());
    connection->append(views);
  }
  const auto replies = connection->read_replies(CommandKind::idempotent_write, "mark_processed");
  std::size_t fresh = 0;
  for (const RedisReply& reply : replies) {
    if (detail::mark_reply(reply, connection->endpoint())) ++fresh;
  }
  return fresh;
}

}  // namespace

RedisIdempotencyRecorder::RedisIdempotencyRecorder(RedisOptions options)
    : RedisIdempotencyRecorder(std::make_shared<ConnectionPool>(std::move(options))) {}

RedisIdempotencyRecorder::RedisIdempotencyRecorder(std::shared_ptr<ConnectionPool> pool)
    : pool_(std::move(pool)) {
  if (!pool_) throw InvalidArgument("RedisIdempotencyRecorder: the connection pool is null");
  clock_ = pool_->options().clock ? pool_->options().clock : system_clock();
  ping(*pool_);
}

RedisIdempotencyRecorder::~RedisIdempotencyRecorder() = default;

std::string RedisIdempotencyRecorder::marker_key(std::string_view consumer,
                                                 std::string_view event_id) const {
  return detail::marker_key(pool_->options().key_prefix, consumer, event_id);
}

std::string RedisIdempotencyRecorder::claim_key(std::string_view consumer,
                                                std::string_view event_id) const {
  return detail::claim_key(pool_->options().key_prefix, consumer, event_id);
}

bool RedisIdempotencyRecorder::do_is_processed(std::string_view consumer,
                                               std::string_view event_id) {
  const std::string key = marker_key(consumer, event_id);
  auto connection = pool_->lease();
  const RedisReply reply = connection->command({"EXISTS", key}, CommandKind::read, "is_processed");
  return flag_reply(reply, "is_processed", connection->endpoint());
}

void RedisIdempotencyRecorder::do_mark_processed(std::string_view consumer,
                                                 std::string_view event_id) {
  const std::array<std::string_view, 1> ids = {event_id};
  mark_chunk(*pool_, consumer, ids, std::to_string(detail::to_ms(clock_->wall_now())));
}

std::vector<bool> RedisIdempotencyRecorder::do_is_processed_many(
    std::string_view consumer, std::span<const std::string> event_ids) {
  std::vector<bool> processed;
  processed.reserve(event_ids.size());
  if (event_ids.empty()) return processed;
  const std::string& prefix = pool_->options().key_prefix;
  auto connection = pool_->lease();
  std::vector<std::string> keys;
  for (std::size_t offset = 0; offset < event_ids.size(); offset += kBatchChunk) {
    const std::size_t n = std::min(kBatchChunk, event_ids.size() - offset);
    keys.clear();
    for (std::size_t i = 0; i < n; ++i)
      keys.push_back(detail::marker_key(prefix, consumer, event_ids[offset + i]));
    // One EXISTS per key (a multi-key EXISTS only counts them), pipelined: one round trip.
    for (const std::string& key : keys)
      connection->append({"EXISTS", key});
    const auto replies = connection->read_replies(CommandKind::read, "is_processed");
    for (const RedisReply& reply : replies)
      processed.push_back(flag_reply(reply, "is_processed", connection->endpoint()));
  }
  return processed;
}

void RedisIdempotencyRecorder::do_mark_processed_many(std::string_view consumer,
                                                      std::span<const std::string> event_ids) {
  std::vector<std::string_view> views(event_ids.begin(), event_ids.end());
  static_cast<void>(mark_checked_batch(consumer, views));
}

std::size_t RedisIdempotencyRecorder::mark_processed_batch(
    std::string_view consumer, std::span<const std::string_view> event_ids) {
  validate_key("consumer", consumer);
  for (std::string_view id : event_ids)
    validate_key("event id", id);
  return mark_checked_batch(consumer, event_ids);
}

std::size_t RedisIdempotencyRecorder::mark_checked_batch(
    std::string_view consumer, std::span<const std::string_view> event_ids) {
  const std::string ts = std::to_string(detail::to_ms(clock_->wall_now()));
  std::size_t fresh = 0;
  for (std::size_t offset = 0; offset < event_ids.size(); offset += kBatchChunk) {
    const std::size_t n = std::min(kBatchChunk, event_ids.size() - offset);
    fresh += mark_chunk(*pool_, consumer, event_ids.subspan(offset, n), ts);
  }
  return fresh;
}

std::size_t RedisIdempotencyRecorder::mark_processed_batch(std::string_view consumer,
                                                           std::span<const std::string> event_ids) {
  std::vector<std::string_view> views(event_ids.begin(), event_ids.end());
  return mark_processed_batch(consumer, std::span<const std::string_view>(views));
}

namespace {

RedisReply run(ConnectionPool& pool, const detail::ScriptInvocation& call, std::string_view what,
               std::string* endpoint = nullptr) {
  auto connection = pool.lease();
  if (endpoint != nullptr) *endpoint = connection->endpoint();
  return detail::run_script(*connection, *call.script, call.key_views(), call.arg_views(),
                            CommandKind::write, what);
}

}  // namespace

Claim RedisIdempotencyRecorder::do_claim(std::string_view consumer, std::string_view event_id,
                                         Millis lease) {
  const auto call = detail::recorder_claim_call(pool_->options(), detail::to_ms(clock_->wall_now()),
                                                consumer, event_id, lease);
  std::string endpoint;
  const RedisReply reply = run(*pool_, call, "claim", &endpoint);
  return detail::recorder_claim_reply(reply, consumer, event_id, call.keys[1], endpoint);
}

bool RedisIdempotencyRecorder::do_complete(std::string_view consumer, std::string_view event_id,
                                           std::uint64_t token) {
  const auto call = detail::recorder_complete_call(
      pool_->options(), detail::to_ms(clock_->wall_now()), consumer, event_id, token);
  std::string endpoint;
  const RedisReply reply = run(*pool_, call, "complete", &endpoint);
  return detail::flag_reply(reply, "complete", endpoint);
}

bool RedisIdempotencyRecorder::do_release(std::string_view consumer, std::string_view event_id,
                                          std::uint64_t token) {
  const auto call = detail::recorder_release_call(pool_->options(), consumer, event_id, token);
  std::string endpoint;
  const RedisReply reply = run(*pool_, call, "release", &endpoint);
  return detail::flag_reply(reply, "release", endpoint);
}

bool RedisIdempotencyRecorder::do_renew(std::string_view consumer, std::string_view event_id,
                                        std::uint64_t token, Millis lease) {
  const auto call = detail::recorder_renew_call(pool_->options(), detail::to_ms(clock_->wall_now()),
                                                consumer, event_id, token, lease);
  std::string endpoint;
  const RedisReply reply = run(*pool_, call, "renew", &endpoint);
  return detail::flag_reply(reply, "renew", endpoint);
}

namespace {

// The consumer of a marker or claim key "<prefix>m:{<escaped consumer>:<event id>}".
std::optional<std::string> consumer_of(std::string_view key, std::size_t prefix_size) {
  std::string consumer;
  for (std::size_t i = prefix_size + 3; i < key.size(); ++i) {
    if (key[i] == '\\' && i + 1 < key.size()) {
      consumer += key[++i];
    } else if (key[i] == ':') {
      return consumer;
    } else {
      consumer += key[i];
    }
  }
  return std::nullopt;  // not a key idem wrote
}

std::optional<std::int64_t> parse_ms(const RedisReply& field) {
  if (field.type != RedisReply::Type::string) return std::nullopt;
  std::int64_t value = 0;
  const char* end = field.str.data() + field.str.size();
  const auto [ptr, ec] = std::from_chars(field.str.data(), end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

}  // namespace

std::size_t RedisIdempotencyRecorder::do_purge(std::chrono::system_clock::duration older_than,
                                               const PurgeProgress& progress) {
  const RedisOptions& options = pool_->options();
  const std::int64_t cutoff_ms =
      detail::minus_ms(detail::to_ms(clock_->wall_now()),
                       std::chrono::duration_cast<std::chrono::milliseconds>(older_than));
  const std::string cutoff = std::to_string(cutoff_ms);
  // Markers and claims of this prefix: "<prefix>m:{..." and "<prefix>c:{...".
  const std::string pattern = detail::glob_escape(options.key_prefix) + "[mc]:{*";
  const std::size_t kind_at = options.key_prefix.size();

  auto connection = pool_->lease();
  const std::string& endpoint = connection->endpoint();
  detail::load_script(*connection, detail::recorder_purge_script(), "purge");
  // SCAN may return a key twice; the second compare-and-delete then finds nothing, so nothing
  // is counted twice. One SCAN page is one chunk.
  std::size_t purged_markers = 0;
  detail::scan_keys(
      *connection, pattern, options.scan_count, "purge", [&](const std::vector<RedisReply>& keys) {
        std::vector<bool> is_marker;
        std::vector<detail::ScriptCall> calls;
        for (const RedisReply& key : keys) {
          const bool marker = key.str[kind_at] == 'm';
          calls.push_back({{key.str}, {marker ? "m" : "c", cutoff}});
          is_marker.push_back(marker);
        }
        const auto replies = detail::run_script_pipelined(
            *connection, detail::recorder_purge_script(), calls, CommandKind::write, "purge");
        const std::size_t before = purged_markers;
        for (std::size_t i = 0; i < replies.size(); ++i) {
          if (flag_reply(replies[i], "purge", endpoint) && is_marker[i]) ++purged_markers;
        }
        if (purged_markers > before && progress) progress(purged_markers);
      });
  return purged_markers;
}

std::size_t RedisIdempotencyRecorder::do_count_purgeable(
    std::chrono::system_clock::duration older_than) {
  return static_cast<std::size_t>(do_purgeable_markers(older_than).old);
}

PurgeableMarkers RedisIdempotencyRecorder::do_purgeable_markers(
    std::chrono::system_clock::duration older_than) {
  const RedisOptions& options = pool_->options();
  const std::int64_t cutoff =
      detail::minus_ms(detail::to_ms(clock_->wall_now()),
                       std::chrono::duration_cast<std::chrono::milliseconds>(older_than));
  const std::string pattern = detail::glob_escape(options.key_prefix) + "m:{*";
  auto connection = pool_->lease();
  std::unordered_set<std::string> seen;  // SCAN may return a key more than once
  std::map<std::string, PurgeableMarkers::Consumer, std::less<>> by_name;
  detail::scan_keys(*connection, pattern, options.scan_count, "count_purgeable",
                    [&](const std::vector<RedisReply>& keys) {
                      std::vector<std::string> consumers;
                      for (const RedisReply& key : keys) {
                        if (!seen.insert(key.str).second) continue;
                        auto consumer = consumer_of(key.str, options.key_prefix.size());
                        if (!consumer) continue;
                        connection->append({"GET", key.str});
                        consumers.push_back(std::move(*consumer));
                      }
                      if (consumers.empty()) return;
                      const auto replies =
                          connection->read_replies(CommandKind::read, "count_purgeable");
                      for (std::size_t i = 0; i < replies.size() && i < consumers.size(); ++i) {
                        if (replies[i].is_nil()) continue;  // deleted since the SCAN
                        // The same test as the purge script: a time that does not parse is never
                        // purged.
                        const auto at = parse_ms(replies[i]);
                        if (at && *at >= cutoff) continue;
                        auto& entry = by_name[consumers[i]];
                        entry.consumer = consumers[i];
                        ++(at ? entry.old : entry.unreadable);
                      }
                    });
  PurgeableMarkers markers;
  for (auto& [name, entry] : by_name) {
    markers.old += entry.old;
    markers.unreadable += entry.unreadable;
    markers.consumers.push_back(std::move(entry));
  }
  return markers;
}

std::vector<ConsumerCounts> RedisIdempotencyRecorder::do_consumer_counts() {
  const RedisOptions& options = pool_->options();
  const std::int64_t now = detail::to_ms(clock_->wall_now());
  const std::string pattern = detail::glob_escape(options.key_prefix) + "[mc]:{*";
  const std::size_t kind_at = options.key_prefix.size();
  std::map<std::string, ConsumerCounts, std::less<>> by_name;
  const auto entry = [&](const std::string& name) -> ConsumerCounts& {
    auto& counts = by_name[name];
    counts.consumer = name;
    return counts;
  };
  auto connection = pool_->lease();
  std::unordered_set<std::string> seen;  // SCAN may return a key more than once
  detail::scan_keys(
      *connection, pattern, options.scan_count, "consumer_counts",
      [&](const std::vector<RedisReply>& keys) {
        std::vector<std::string> claim_consumers;
        for (const RedisReply& key : keys) {
          if (!seen.insert(key.str).second) continue;
          auto consumer = consumer_of(key.str, options.key_prefix.size());
          if (!consumer) continue;
          if (key.str[kind_at] == 'm') {
            ++entry(*consumer).processed;
          } else {
            connection->append({"HGET", key.str, "lease_until"});
            claim_consumers.push_back(std::move(*consumer));
          }
        }
        if (claim_consumers.empty()) return;
        const auto replies = connection->read_replies(CommandKind::read, "consumer_counts");
        for (std::size_t i = 0; i < replies.size() && i < claim_consumers.size(); ++i) {
          const auto lease_until = parse_ms(replies[i]);
          if (lease_until && *lease_until > now) ++entry(claim_consumers[i]).in_progress;
        }
      });
  std::vector<ConsumerCounts> result;
  for (auto& [name, counts] : by_name) {
    // A consumer whose only key is a lapsed claim has nothing to show.
    if (counts.processed > 0 || counts.in_progress > 0) result.push_back(std::move(counts));
  }
  return result;
}

MarkerInspection RedisIdempotencyRecorder::do_inspect(std::string_view consumer,
                                                      std::string_view event_id) {
  const RedisOptions& options = pool_->options();
  const std::string marker = detail::marker_key(options.key_prefix, consumer, event_id);
  const std::string claim = detail::claim_key(options.key_prefix, consumer, event_id);
  auto connection = pool_->lease();
  const std::string& endpoint = connection->endpoint();
  connection->append({"GET", marker});
  connection->append({"HMGET", claim, "token", "lease_until"});
  const auto replies = connection->read_replies(CommandKind::read, "inspect");
  if (replies.size() != 2)
    throw StoreError("idem redis: inspect on " + endpoint + ": lost replies");
  MarkerInspection result;
  if (replies[0].is_error()) detail::throw_reply_error(replies[0], "inspect", endpoint);
  if (!replies[0].is_nil()) {
    result.processed = true;
    if (auto at = parse_ms(replies[0])) result.processed_at = detail::from_ms(*at);
  }
  const RedisReply& fields = replies[1];
  if (fields.is_error()) detail::throw_reply_error(fields, "inspect", endpoint);
  if (fields.type == RedisReply::Type::array && fields.elements.size() == 2 &&
      !fields.elements[0].is_nil()) {
    const auto token = parse_ms(fields.elements[0]);
    const auto lease_until = parse_ms(fields.elements[1]);
    if (!token || *token < 0 || !lease_until) {
      throw StoreError(ErrorCode::store_corrupt_record,
                       "idem redis: inspect on " + endpoint + ": the claim of event '" +
                           std::string(event_id) + "' for consumer '" + std::string(consumer) +
                           "' (key " + claim + ") has no readable token and lease_until");
    }
    result.claim = MarkerInspection::OpenClaim{static_cast<std::uint64_t>(*token),
                                               detail::from_ms(*lease_until),
                                               *lease_until > detail::to_ms(clock_->wall_now())};
  }
  return result;
}

}  // namespace idem::redis
