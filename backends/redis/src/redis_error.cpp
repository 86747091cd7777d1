// The one place where Redis error replies and unexpected replies become idem errors. (Connection
// failures are classified where they happen, in connection_pool.cpp, which knows whether the
// command had been sent.)
#include "idem/redis/redis_error.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <string>

#include "idem/detail/printable.hpp"
#include "internal.hpp"

namespace idem::redis {

std::string_view to_string(RedisFailure failure) noexcept {
  switch (failure) {
    case RedisFailure::connect:
      return "connect";
    case RedisFailure::pool_exhausted:
      return "pool_exhausted";
    case RedisFailure::io:
      return "io";
    case RedisFailure::auth:
      return "auth";
    case RedisFailure::tls:
      return "tls";
    case RedisFailure::protocol:
      return "protocol";
    case RedisFailure::reply:
      return "reply";
  }
  return "unknown";
}

namespace detail {

namespace {

// Error replies that mean "not now": the server did not run the command and will accept it
// later (LOADING: still reading its data after a restart; BUSY: a script is running; TRYAGAIN,
// CLUSTERDOWN, MASTERDOWN: a cluster or replication in transition; NOREPLICAS: min-replicas not
// met; READONLY: a replica answered, e.g. mid-failover; OOM: maxmemory reached; MOVED, ASK: a
// cluster redirection still there after the routing's bounded number of them — slots moving).
bool is_transient(std::string_view error) {
  const std::string_view code = error.substr(0, error.find(' '));
  for (std::string_view transient : {"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN",
                                     "NOREPLICAS", "READONLY", "OOM", "MOVED", "ASK"}) {
    if (code == transient) return true;
  }
  return false;
}

}  // namespace

void throw_reply_error(const RedisReply& reply, std::string_view what,
                       const std::string& endpoint) {
  // WRONGTYPE: something else lives under one of idem's keys — the record cannot be read.
  const bool wrong_type = reply.str.find("WRONGTYPE") != std::string::npos;
  throw RedisError(RedisFailure::reply,
                   "idem redis: " + std::string(what) + " on " + endpoint +
                       ": the server answered: " + reply.str,
                   /*retryable=*/is_transient(reply.str), /*in_doubt=*/false,
                   /*timed_out=*/false,
                   wrong_type ? ErrorCode::store_corrupt_record : ErrorCode::store_error);
}

RedisError connect_error(const std::string& endpoint, int error_number, const std::string& detail) {
  const bool timed_out =
      error_number == ETIMEDOUT || error_number == EAGAIN || error_number == EWOULDBLOCK;
  ErrorCode code = ErrorCode::store_error;
  std::string message = "idem redis: connect to " + endpoint + ": " + detail;
  if (error_number == ECONNREFUSED) {
    code = ErrorCode::connection_refused;
    message += " (nothing listens there: is the server running, on this port?)";
  } else if (timed_out) {
    code = ErrorCode::connect_timeout;
  }
  return RedisError(RedisFailure::connect, message, /*retryable=*/true, /*in_doubt=*/false,
                    timed_out, code);
}

RedisError resolve_error(const std::string& endpoint, const std::string& detail, bool temporary) {
  return RedisError(RedisFailure::connect, "idem redis: connect to " + endpoint + ": " + detail,
                    /*retryable=*/temporary, /*in_doubt=*/false, /*timed_out=*/false,
                    ErrorCode::host_not_found);
}

RedisError not_redis_error(std::string_view what, const std::string& endpoint,
                           std::string_view first_bytes) {
  return RedisError(
      RedisFailure::protocol,
      "idem redis: " + std::string(what) + " on " + endpoint +
          ": the server does not speak the Redis protocol (its first reply begins "
          "'" +
          idem::detail::printable(first_bytes.substr(0, 16), 16) + "'): is this a Redis port?",
      /*retryable=*/false, /*in_doubt=*/false, /*timed_out=*/false, ErrorCode::wrong_protocol);
}

void throw_unexpected_reply(const RedisReply& reply, std::string_view what,
                            const std::string& endpoint) {
  if (reply.is_error()) throw_reply_error(reply, what, endpoint);
  static constexpr const char* kTypes[] = {"nil", "status", "error", "integer", "string", "array"};
  throw RedisError(RedisFailure::protocol,
                   "idem redis: " + std::string(what) + " on " + endpoint +
                       ": unexpected reply of type " + kTypes[static_cast<int>(reply.type)],
                   /*retryable=*/false, /*in_doubt=*/false);
}

long long reply_integer(const RedisReply& reply, std::string_view what,
                        const std::string& endpoint) {
  if (reply.type == RedisReply::Type::integer) return reply.integer;
  if (reply.type == RedisReply::Type::string || reply.type == RedisReply::Type::status) {
    long long value = 0;
    const char* first = reply.str.data();
    const char* last = first + reply.str.size();
    const auto [end, ec] = std::from_chars(first, last, value);
    if (ec == std::errc() && end == last && first != last) return value;
  }
  throw_unexpected_reply(reply, what, endpoint);
}

// ---- keys ---------------------------------------------------------------------------------

std::string escape_consumer(std::string_view consumer) {
  std::string out;
  out.reserve(consumer.size() + 4);
  for (char c : consumer) {
    if (c == '\\' || c == ':') out += '\\';
    out += c;
  }
  return out;
}

namespace {
std::string record_pair_key(std::string_view prefix, char kind, std::string_view consumer,
                            std::string_view event_id) {
  std::string key;
  key.reserve(prefix.size() + consumer.size() + event_id.size() + 8);
  key.append(prefix);
  key += kind;
  key += ":{";
  key += escape_consumer(consumer);
  key += ':';
  key.append(event_id);
  key += '}';
  return key;
}
}  // namespace

std::string marker_key(std::string_view prefix, std::string_view consumer,
                       std::string_view event_id) {
  return record_pair_key(prefix, 'm', consumer, event_id);
}

std::string claim_key(std::string_view prefix, std::string_view consumer,
                      std::string_view event_id) {
  return record_pair_key(prefix, 'c', consumer, event_id);
}

std::string record_key(std::string_view prefix, std::string_view key) {
  std::string out;
  out.reserve(prefix.size() + key.size() + 4);
  out.append(prefix);
  out += "s:{";
  out.append(key);
  out += '}';
  return out;
}

std::string done_channel(std::string_view record_key) {
  std::string out(record_key);
  out += ":done";
  return out;
}

std::string glob_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// ---- time ---------------------------------------------------------------------------------

std::int64_t max_time_ms() {
  return std::chrono::floor<std::chrono::milliseconds>(WallTime::duration::max()).count();
}

std::int64_t to_ms(WallTime t) {
  return std::chrono::floor<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

WallTime from_ms(std::int64_t ms) {
  if (ms >= max_time_ms()) return WallTime::max();
  if (ms <= -max_time_ms()) return WallTime::min();
  return WallTime(std::chrono::milliseconds(ms));
}

std::int64_t span_ms(std::int64_t now_ms, std::chrono::milliseconds d) {
  const std::int64_t room =
      now_ms >= max_time_ms() ? 0 : max_time_ms() - std::max<std::int64_t>(now_ms, 0);
  return std::clamp<std::int64_t>(d.count(), 0, room);
}

std::string span_arg(std::int64_t now_ms, std::chrono::milliseconds d) {
  return std::to_string(span_ms(now_ms, d));
}

std::int64_t minus_ms(std::int64_t now_ms, std::chrono::milliseconds d) {
  const std::int64_t span = std::clamp<std::int64_t>(d.count(), 0, max_time_ms());
  return std::max(now_ms - span, -max_time_ms());
}

void check_wait(const RedisReply& wait, std::size_t min_replicas,
                std::chrono::milliseconds replica_timeout, bool no_write, CommandKind kind,
                std::string_view what, const std::string& endpoint) {
  if (no_write) return;  // the caller reports the error replies
  const bool refused = wait.is_error();
  if (!refused && wait.type == RedisReply::Type::integer &&
      wait.integer >= static_cast<long long>(min_replicas)) {
    return;
  }
  const std::string detail =
      refused ? "WAIT was refused (" + wait.str + ")"
              : "only " + std::to_string(wait.integer) + " of the " + std::to_string(min_replicas) +
                    " replicas asked for (min_replicas) confirmed it within replica_timeout " +
                    std::to_string(replica_timeout.count()) + " ms";
  throw RedisError(RedisFailure::reply,
                   "idem redis: " + std::string(what) + " on " + endpoint +
                       ": written on the primary, but " + detail +
                       "; a failover may lose it: it may or may not survive",
                   /*retryable=*/kind == CommandKind::idempotent_write, /*in_doubt=*/true);
}

}  // namespace detail
}  // namespace idem::redis
