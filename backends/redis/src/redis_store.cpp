#include "idem/redis/redis_store.hpp"

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
#include "record_decoder.hpp"

namespace idem::redis {
namespace {

bool flag_reply(const RedisReply& reply, std::string_view what, const std::string& endpoint) {
  if (reply.is_error()) detail::throw_reply_error(reply, what, endpoint);
  return detail::reply_integer(reply, what, endpoint) == 1;
}

}  // namespace

RedisIdempotencyStore::RedisIdempotencyStore(RedisOptions options)
    : RedisIdempotencyStore(std::make_shared<ConnectionPool>(std::move(options))) {}

RedisIdempotencyStore::RedisIdempotencyStore(std::shared_ptr<ConnectionPool> pool)
    : pool_(std::move(pool)) {
  if (!pool_) throw InvalidArgument("RedisIdempotencyStore: the connection pool is null");
  clock_ = pool_->options().clock ? pool_->options().clock : system_clock();
  wait_clock_ = clock_;
  auto connection = pool_->lease();
  const RedisReply reply = connection->command({"PING"}, CommandKind::read, "PING");
  if (reply.type != RedisReply::Type::status) {
    detail::throw_unexpected_reply(reply, "PING", connection->endpoint());
  }
}

RedisIdempotencyStore::~RedisIdempotencyStore() = default;

std::string RedisIdempotencyStore::record_key(std::string_view key) const {
  return detail::record_key(pool_->options().key_prefix, key);
}

ClaimOutcome RedisIdempotencyStore::do_claim(std::string_view key,
                                             std::optional<std::string_view> fingerprint,
                                             Millis lease) {
  const RedisOptions& options = pool_->options();
  const std::string record = record_key(key);
  const std::string counter = detail::token_counter_key(options.key_prefix);
  const std::int64_t now_ms = detail::to_ms(clock_->wall_now());
  const std::string now = std::to_string(now_ms);
  const std::string lease_ms = detail::span_arg(now_ms, lease);
  const std::string slack = detail::span_arg(0, options.expiry_slack);
  const std::array<std::string_view, 2> keys = {record, counter};
  const std::array<std::string_view, 5> args = {now, lease_ms, fingerprint ? "1" : "0",
                                                fingerprint.value_or(""), slack};
  auto connection = pool_->lease();
  const std::string& endpoint = connection->endpoint();
  const RedisReply reply = detail::run_script(*connection, detail::store_claim_script(), keys, args,
                                              CommandKind::write, "claim");
  if (reply.is_error()) detail::throw_reply_error(reply, "claim", endpoint);
  if (reply.type != RedisReply::Type::array || reply.elements.empty() ||
      reply.elements[0].type != RedisReply::Type::string) {
    detail::throw_unexpected_reply(reply, "claim", endpoint);
  }
  const std::string& status = reply.elements[0].str;
  ClaimOutcome outcome;
  if (status == "acquired") {
    if (reply.elements.size() != 3) detail::throw_unexpected_reply(reply, "claim", endpoint);
    outcome.status = ClaimOutcome::Status::acquired;
    outcome.token =
        static_cast<std::uint64_t>(detail::reply_integer(reply.elements[1], "claim", endpoint));
    outcome.took_over = detail::reply_integer(reply.elements[2], "claim", endpoint) == 1;
    return outcome;
  }
  if (reply.elements.size() != 2) detail::throw_unexpected_reply(reply, "claim", endpoint);
  IdempotencyRecord found = detail::RecordDecoder(key, record, reply.elements[1]).decode();
  if (status == "corrupt") {
    // The decoder found nothing wrong, but the script could not read the state's time either:
    // report it rather than act on a record two readers disagree about.
    throw StoreError(ErrorCode::store_corrupt_record,
                     "idem redis: the record of idempotency key '" + std::string(key) +
                         "' (redis key " + record + ") is corrupt; delete the key to reset it");
  }
  if (status == "completed") {
    outcome.status = ClaimOutcome::Status::completed;
  } else if (status == "in_progress") {
    outcome.status = ClaimOutcome::Status::in_progress;
  } else if (status == "mismatch") {
    outcome.status = ClaimOutcome::Status::mismatch;
  } else {
    detail::throw_unexpected_reply(reply, "claim", endpoint);
  }
  outcome.record = std::move(found);
  return outcome;
}

bool RedisIdempotencyStore::do_complete(std::string_view key, std::uint64_t token,
                                        StoredValue value, const ExecutionReport& report,
                                        Millis ttl) {
  const RedisOptions& options = pool_->options();
  const std::string record = record_key(key);
  const std::string token_text = std::to_string(token);
  const std::int64_t now_ms = detail::to_ms(clock_->wall_now());
  const std::string now = std::to_string(now_ms);
  const std::string ttl_ms = detail::span_arg(now_ms, ttl);
  const std::string report_json = report.to_json();
  const std::string slack = detail::span_arg(0, options.expiry_slack);
  const std::string empty;
  const std::array<std::string_view, 1> keys = {record};
  const std::array<std::string_view, 6> args = {
      token_text, now, ttl_ms, value.bytes ? *value.bytes : empty, report_json, slack};
  auto connection = pool_->lease();
  const RedisReply reply = detail::run_script(*connection, detail::store_complete_script(), keys,
                                              args, CommandKind::write, "complete");
  return flag_reply(reply, "complete", connection->endpoint());
}

bool RedisIdempotencyStore::do_release(std::string_view key, std::uint64_t token) {
  const std::string record = record_key(key);
  const std::string token_text = std::to_string(token);
  const std::array<std::string_view, 1> keys = {record};
  const std::array<std::string_view, 1> args = {token_text};
  auto connection = pool_->lease();
  const RedisReply reply = detail::run_script(*connection, detail::store_release_script(), keys,
                                              args, CommandKind::write, "release");
  return flag_reply(reply, "release", connection->endpoint());
}

bool RedisIdempotencyStore::do_renew(std::string_view key, std::uint64_t token, Millis lease) {
  const std::string record = record_key(key);
  const std::string token_text = std::to_string(token);
  const std::int64_t now_ms = detail::to_ms(clock_->wall_now());
  const std::string now = std::to_string(now_ms);
  const std::string lease_ms = detail::span_arg(now_ms, lease);
  const std::string slack = detail::span_arg(0, pool_->options().expiry_slack);
  const std::array<std::string_view, 1> keys = {record};
  const std::array<std::string_view, 4> args = {token_text, now, lease_ms, slack};
  auto connection = pool_->lease();
  const RedisReply reply = detail::run_script(*connection, detail::store_renew_script(), keys, args,
                                              CommandKind::write, "renew");
  return flag_reply(reply, "renew", connection->endpoint());
}

std::optional<IdempotencyRecord> RedisIdempotencyStore::do_lookup(std::string_view key) {
  const std::string record = record_key(key);
  auto connection = pool_->lease();
  const RedisReply reply = connection->command({"HGETALL", record}, CommandKind::read, "lookup");
  if (reply.is_error()) detail::throw_reply_error(reply, "lookup", connection->endpoint());
  if (reply.type == RedisReply::Type::array && reply.elements.empty()) return std::nullopt;
  IdempotencyRecord found = detail::RecordDecoder(key, record, reply).decode();
  if (found.state == IdempotencyRecord::State::completed &&
      clock_->wall_now() >= found.expires_at) {
    return std::nullopt;  // expired: reported absent; purge_expired() or Redis removes it
  }
  return found;
}

namespace {

// Calls `each_page(keys)` for every page of SCAN MATCH `pattern`.
template <class EachPage>
void scan(RedisConnection& connection, const std::string& pattern, std::size_t count,
          std::string_view what, EachPage&& each_page) {
  const std::string count_text = std::to_string(count);
  std::string cursor = "0";
  do {
    const RedisReply page = connection.command(
        {"SCAN", cursor, "MATCH", pattern, "COUNT", count_text}, CommandKind::read, what);
    if (page.type != RedisReply::Type::array || page.elements.size() != 2 ||
        page.elements[1].type != RedisReply::Type::array) {
      detail::throw_unexpected_reply(page, what, connection.endpoint());
    }
    cursor = page.elements[0].str;
    each_page(page.elements[1].elements);
  } while (cursor != "0");
}

}  // namespace

std::size_t RedisIdempotencyStore::do_purge_expired(const PurgeProgress& progress) {
  const RedisOptions& options = pool_->options();
  const std::string pattern = detail::glob_escape(options.key_prefix) + "s:{*";
  const std::string now = std::to_string(detail::to_ms(clock_->wall_now()));
  auto connection = pool_->lease();
  detail::load_script(*connection, detail::store_purge_script(), "purge_expired");
  std::size_t purged = 0;
  // One SCAN page is one chunk: a pipeline of compare-and-delete scripts, each atomic alone.
  scan(*connection, pattern, options.scan_count, "purge_expired",
       [&](const std::vector<RedisReply>& keys) {
         std::vector<detail::ScriptCall> calls;
         calls.reserve(keys.size());
         for (const RedisReply& key : keys)
           calls.push_back({{key.str}, {now}});
         // A key SCAN returned twice is found gone the second time: counted once.
         const std::size_t before = purged;
         for (const RedisReply& reply :
              detail::run_script_pipelined(*connection, detail::store_purge_script(), calls,
                                           CommandKind::write, "purge_expired")) {
           if (flag_reply(reply, "purge_expired", connection->endpoint())) ++purged;
         }
         if (purged > before && progress) progress(purged);
       });
  return purged;
}

StoreCounts RedisIdempotencyStore::do_counts() {
  const RedisOptions& options = pool_->options();
  const std::string pattern = detail::glob_escape(options.key_prefix) + "s:{*";
  const std::int64_t now = detail::to_ms(clock_->wall_now());
  auto connection = pool_->lease();
  const auto number = [](const RedisReply& field) -> std::optional<std::int64_t> {
    std::int64_t value = 0;
    if (field.type != RedisReply::Type::string) return std::nullopt;
    const char* end = field.str.data() + field.str.size();
    const auto [ptr, ec] = std::from_chars(field.str.data(), end, value);
    if (ec != std::errc() || ptr != end) return std::nullopt;
    return value;
  };
  StoreCounts counts;
  std::unordered_set<std::string> seen;  // SCAN may return a key more than once
  scan(*connection, pattern, options.scan_count, "counts",
       [&](const std::vector<RedisReply>& keys) {
         std::size_t sent = 0;
         for (const RedisReply& key : keys) {
           if (!seen.insert(key.str).second) continue;
           connection->append({"HMGET", key.str, "state", "lease_until", "expires_at"});
           ++sent;
         }
         if (sent == 0) return;
         for (const RedisReply& reply : connection->read_replies(CommandKind::read, "counts")) {
           // A key of another type (WRONGTYPE) or a field idem cannot read is counted nowhere,
           // as lookup() of it would fail; the key was deleted between SCAN and HMGET: all nil.
           if (reply.is_error() || reply.type != RedisReply::Type::array ||
               reply.elements.size() != 3) {
             continue;
           }
           const RedisReply& state = reply.elements[0];
           if (state.str == "in_progress") {
             if (auto lease_until = number(reply.elements[1])) {
               ++(*lease_until > now ? counts.in_progress : counts.abandoned);
             }
           } else if (state.str == "completed") {
             if (auto expires_at = number(reply.elements[2])) {
               ++(*expires_at > now ? counts.completed : counts.expired);
             }
           }
         }
       });
  return counts;
}

std::size_t RedisIdempotencyStore::do_entry_count() {
  const RedisOptions& options = pool_->options();
  const std::string pattern = detail::glob_escape(options.key_prefix) + "s:{*";
  auto connection = pool_->lease();
  std::unordered_set<std::string> seen;  // SCAN may return a key more than once
  scan(*connection, pattern, options.scan_count, "entry_count",
       [&](const std::vector<RedisReply>& keys) {
         for (const RedisReply& key : keys)
           seen.insert(key.str);
       });
  return seen.size();
}

}  // namespace idem::redis
