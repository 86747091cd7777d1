#include "operations.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <random>
#include <utility>

#include "idem/detail/fork.hpp"
#include "idem/error.hpp"
#include "record_decoder.hpp"

namespace idem::redis::detail {

std::vector<std::string_view> script_argv(const ScriptInvocation& call, const std::string& numkeys,
                                          bool with_source) {
  std::vector<std::string_view> argv;
  argv.reserve(3 + call.keys.size() + call.args.size());
  argv.push_back(with_source ? "EVAL" : "EVALSHA");
  argv.push_back(with_source ? call.script->source : std::string_view(call.script->sha));
  argv.push_back(numkeys);
  argv.insert(argv.end(), call.keys.begin(), call.keys.end());
  argv.insert(argv.end(), call.args.begin(), call.args.end());
  return argv;
}

bool is_noscript(const RedisReply& reply) {
  return reply.is_error() && reply.str.rfind("NOSCRIPT", 0) == 0;
}

bool flag_reply(const RedisReply& reply, std::string_view what, const std::string& endpoint) {
  if (reply.is_error()) throw_reply_error(reply, what, endpoint);
  return reply_integer(reply, what, endpoint) == 1;
}

// ---- recorder ---------------------------------------------------------------------------------

std::vector<std::string> mark_command(const RedisOptions& options, const std::string& marker_key,
                                      const std::string& now_ms) {
  if (options.marker_ttl) {
    return {"SET", marker_key, now_ms, "NX", "PX", span_arg(0, *options.marker_ttl)};
  }
  return {"SET", marker_key, now_ms, "NX"};
}

bool mark_reply(const RedisReply& reply, const std::string& endpoint) {
  if (reply.is_error()) throw_reply_error(reply, "mark_processed", endpoint);
  return reply.type == RedisReply::Type::status;  // "OK"; nil: it already existed
}

ScriptInvocation recorder_claim_call(const RedisOptions& options, std::int64_t now_ms,
                                     std::string_view consumer, std::string_view event_id,
                                     Millis lease) {
  ScriptInvocation call;
  call.script = &recorder_claim_script();
  call.keys = {marker_key(options.key_prefix, consumer, event_id),
               claim_key(options.key_prefix, consumer, event_id)};
  call.args = {std::to_string(now_ms), span_arg(now_ms, lease), span_arg(0, options.expiry_slack),
               std::to_string(draw_token(0))};
  return call;
}

Claim recorder_claim_reply(const RedisReply& reply, std::string_view consumer,
                           std::string_view event_id, const std::string& claim,
                           const std::string& endpoint) {
  if (reply.is_error()) {
    if (reply.str.rfind("IDEMCORRUPT", 0) == 0) {
      throw StoreError(ErrorCode::store_corrupt_record,
                       "idem redis: claim on " + endpoint + ": the claim of event '" +
                           std::string(event_id) + "' for consumer '" + std::string(consumer) +
                           "' (key " + claim + ") is corrupt: " + reply.str.substr(12) +
                           "; delete the key to reset it");
    }
    throw_reply_error(reply, "claim", endpoint);
  }
  if (reply.type != RedisReply::Type::array || reply.elements.empty()) {
    throw_unexpected_reply(reply, "claim", endpoint);
  }
  const auto& e = reply.elements;
  Claim result;
  switch (reply_integer(e[0], "claim", endpoint)) {
    case 1:
      result.status = Claim::Status::processed;
      return result;
    case 2:
      if (e.size() != 3) throw_unexpected_reply(reply, "claim", endpoint);
      result.status = Claim::Status::in_progress;
      result.lease_until = from_ms(reply_integer(e[2], "claim", endpoint));
      return result;
    case 0: {
      if (e.size() != 4) throw_unexpected_reply(reply, "claim", endpoint);
      result.status = Claim::Status::acquired;
      // A decimal string: a drawn token is larger than a Lua number holds exactly.
      const long long token = reply_integer(e[1], "claim", endpoint);
      if (token <= 0) throw_unexpected_reply(reply, "claim", endpoint);
      result.token = static_cast<std::uint64_t>(token);
      result.lease_until = from_ms(reply_integer(e[2], "claim", endpoint));
      result.took_over = reply_integer(e[3], "claim", endpoint) == 1;
      return result;
    }
    default:
      throw_unexpected_reply(reply, "claim", endpoint);
  }
}

ScriptInvocation recorder_complete_call(const RedisOptions& options, std::int64_t now_ms,
                                        std::string_view consumer, std::string_view event_id,
                                        std::uint64_t token) {
  ScriptInvocation call;
  call.script = &recorder_complete_script();
  call.keys = {marker_key(options.key_prefix, consumer, event_id),
               claim_key(options.key_prefix, consumer, event_id)};
  call.args = {std::to_string(token), std::to_string(now_ms),
               options.marker_ttl ? span_arg(0, *options.marker_ttl) : "0"};
  return call;
}

ScriptInvocation recorder_release_call(const RedisOptions& options, std::string_view consumer,
                                       std::string_view event_id, std::uint64_t token) {
  ScriptInvocation call;
  call.script = &recorder_release_script();
  call.keys = {claim_key(options.key_prefix, consumer, event_id)};
  call.args = {std::to_string(token)};
  return call;
}

ScriptInvocation recorder_renew_call(const RedisOptions& options, std::int64_t now_ms,
                                     std::string_view consumer, std::string_view event_id,
                                     std::uint64_t token, Millis lease) {
  ScriptInvocation call;
  call.script = &recorder_renew_script();
  call.keys = {claim_key(options.key_prefix, consumer, event_id)};
  call.args = {std::to_string(token), std::to_string(now_ms), span_arg(now_ms, lease),
               span_arg(0, options.expiry_slack)};
  return call;
}

// ---- store ------------------------------------------------------------------------------------

namespace {

// A claim reads and tries again only when another client changed the record in between, which
// each time means a whole claim of someone else: this many rounds is contention beyond reason.
constexpr int kMaxClaimRounds = 64;

// Redis's expiry of a record whose own deadline is `deadline`: after the slack, and never <= 0
// (SET rejects that; a time in the past removes the key at once either way).
std::string pxat_arg(const RedisOptions& options, std::int64_t deadline) {
  return std::to_string(std::max<std::int64_t>(deadline + span_ms(0, options.expiry_slack), 1));
}

// (A script's error keeps the code of the command that failed in it, with the script named
// after it.)
bool is_wrongtype(const RedisReply& reply) {
  return reply.is_error() && reply.str.find("WRONGTYPE") != std::string::npos;
}

bool live(const IdempotencyRecord& record, WallTime now) {
  return record.state == IdempotencyRecord::State::in_progress ? now < record.lease_until
                                                               : now < record.expires_at;
}

// A token: the system clock's milliseconds above kTokenRandomBits random bits. 42 bits
// of milliseconds last until the year 2109 and keep tokens below 2^63.
constexpr int kTokenRandomBits = 21;

// Random bits from a per-thread generator seeded from std::random_device, seeded again in a
// forked child (which would otherwise repeat its parent's sequence). The fork generation, not
// getpid(), tells a child: glibc does not cache the pid, so that was a system call per token.
std::uint64_t token_random_bits() {
  thread_local bool seeded = false;
  thread_local std::uint64_t seeded_in = 0;  // the fork generation it was seeded in
  thread_local std::mt19937_64 random;
  const std::uint64_t generation = ::idem::detail::fork_generation();
  if (!seeded || generation != seeded_in) {
    std::random_device device;
    std::seed_seq seed{device(), device(), device(), device(), static_cast<unsigned>(::getpid())};
    random.seed(seed);
    seeded = true;
    seeded_in = generation;
  }
  return random() >> (64 - kTokenRandomBits);
}

}  // namespace

std::uint64_t draw_token(std::uint64_t above) {
  // Strictly increasing within the process, also when the clock steps back or many tokens are
  // drawn in one millisecond.
  static std::atomic<std::uint64_t> last{0};
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  const std::uint64_t drawn =
      (static_cast<std::uint64_t>(std::max<std::int64_t>(ms, 0)) << kTokenRandomBits) |
      token_random_bits();
  const std::uint64_t floor =
      above == std::numeric_limits<std::uint64_t>::max() ? above : above + 1;
  std::uint64_t previous = last.load(std::memory_order_relaxed);
  std::uint64_t token = 0;
  do {
    token = std::max({drawn, previous + 1, floor});
  } while (!last.compare_exchange_weak(previous, token, std::memory_order_relaxed));
  return token;
}

StoreClaim::StoreClaim(const RedisOptions& options, std::int64_t now_ms, std::string_view key,
                       std::optional<std::string_view> fingerprint, Millis lease, bool read_first,
                       bool with_report)
    : options_(options),
      now_ms_(now_ms),
      key_(key),
      fingerprint_(fingerprint),
      record_key_(detail::record_key(options.key_prefix, key)),
      with_report_(with_report) {
  const std::int64_t lease_until = now_ms + span_ms(now_ms, lease);
  tail_ = RecordText::claim_tail(lease_until, fingerprint);
  pxat_ = pxat_arg(options, lease_until);
  if (!read_first) {
    claim_absent(false);  // as if a GET had found the key absent
    return;
  }
  request_.kind = CommandKind::read;
  request_.command = {"GET", record_key_};
}

void StoreClaim::claim_absent(bool replaces_claim, std::uint64_t old_token) {
  step_ = Step::set;
  replaces_claim_ = replaces_claim;
  token_ = draw_token(old_token);
  request_.kind = CommandKind::write;
  request_.script = {};
  request_.command = {"SET", record_key_, "1i " + std::to_string(token_) + tail_, "NX", "PXAT",
                      pxat_, "GET"};
}

void StoreClaim::take_over(std::string expected, std::uint64_t old_token, bool replaces_claim) {
  step_ = Step::takeover;
  replaces_claim_ = replaces_claim;
  token_ = draw_token(old_token);
  request_.kind = CommandKind::write;
  request_.command.clear();
  request_.script.script = &store_takeover_script();
  request_.script.keys = {record_key_};
  request_.script.args = {std::move(expected), "1i " + std::to_string(token_) + tail_, pxat_};
}

bool StoreClaim::read(const RedisReply& reply, const std::string& endpoint) {
  if (++rounds_ > kMaxClaimRounds) {
    throw RedisError(RedisFailure::reply,
                     "idem redis: claim on " + endpoint + ": the record of idempotency key '" +
                         std::string(key_) + "' kept changing under the claim; try again",
                     /*retryable=*/true, /*in_doubt=*/false);
  }
  switch (step_) {
    case Step::get:
      return read_record(reply, endpoint);
    case Step::set:
      if (reply.is_nil()) return acquired();
      if (reply.is_error() && reply.str.find("syntax error") != std::string::npos) {
        throw RedisError(RedisFailure::reply,
                         "idem redis: claim on " + endpoint + ": the server rejected SET ... NX " +
                             "PXAT ... GET (" + reply.str +
                             "); the Redis store needs Redis 7.0 or later",
                         /*retryable=*/false, /*in_doubt=*/false);
      }
      return read_record(reply, endpoint);  // the record that holds the key
    case Step::takeover:
      if (reply.type == RedisReply::Type::integer) return acquired();
      return read_record(reply, endpoint);  // changed since it was read: what is there now
    case Step::legacy_get:
      return read_legacy(reply, endpoint);
    case Step::legacy_drop:
      if (flag_reply(reply, "claim", endpoint)) {
        claim_absent(legacy_claim_, legacy_token_);
      } else {
        step_ = Step::get;  // it changed: read it again
        request_.kind = CommandKind::read;
        request_.script = {};
        request_.command = {"GET", record_key_};
      }
      return false;
  }
  throw_unexpected_reply(reply, "claim", endpoint);
}

bool StoreClaim::acquired() {
  outcome_.status = ClaimOutcome::Status::acquired;
  outcome_.token = token_;
  outcome_.took_over = replaces_claim_;
  return true;
}

bool StoreClaim::read_record(const RedisReply& reply, const std::string& endpoint) {
  if (is_wrongtype(reply)) {
    // Not a string: the hash of an older idem (or something else, which HGETALL reports).
    step_ = Step::legacy_get;
    request_.kind = CommandKind::read;
    request_.script = {};
    request_.command = {"HGETALL", record_key_};
    return false;
  }
  if (reply.is_error()) throw_reply_error(reply, "claim", endpoint);
  if (reply.is_nil()) {
    claim_absent(false);
    return false;
  }
  if (reply.type != RedisReply::Type::string) throw_unexpected_reply(reply, "claim", endpoint);
  IdempotencyRecord record = decode_record_text(key_, record_key_, reply.str, with_report_);
  if (live(record, from_ms(now_ms_))) {
    outcome_ = ClaimOutcome::found(std::move(record), fingerprint_);
    return true;
  }
  take_over(reply.str, record.token, record.state == IdempotencyRecord::State::in_progress);
  return false;
}

bool StoreClaim::read_legacy(const RedisReply& reply, const std::string& endpoint) {
  if (reply.is_error()) throw_reply_error(reply, "claim", endpoint);
  if (reply.type == RedisReply::Type::array && reply.elements.empty()) {
    claim_absent(false);  // gone since the GET
    return false;
  }
  IdempotencyRecord record = RecordDecoder(key_, record_key_, reply).decode();
  if (live(record, from_ms(now_ms_))) {
    outcome_ = ClaimOutcome::found(std::move(record), fingerprint_);
    return true;
  }
  // Expired or abandoned: delete it if it is still what was read, then claim the absent key.
  std::string state;
  std::string token;
  std::string lease_until;
  for (std::size_t i = 0; i + 1 < reply.elements.size(); i += 2) {
    const std::string& field = reply.elements[i].str;
    if (field == "state") state = reply.elements[i + 1].str;
    if (field == "token") token = reply.elements[i + 1].str;
    if (field == "lease_until") lease_until = reply.elements[i + 1].str;
  }
  step_ = Step::legacy_drop;
  legacy_claim_ = record.state == IdempotencyRecord::State::in_progress;
  legacy_token_ = record.token;
  request_.kind = CommandKind::write;
  request_.command.clear();
  request_.script.script = &store_drop_legacy_script();
  request_.script.keys = {record_key_};
  request_.script.args = {std::move(state), std::move(token), std::move(lease_until)};
  return false;
}

StoreLookup::StoreLookup(const RedisOptions& options, WallTime now, std::string_view key)
    : now_(now), key_(key), record_key_(detail::record_key(options.key_prefix, key)) {
  request_.kind = CommandKind::read;
  request_.command = {"GET", record_key_};
}

bool StoreLookup::read(const RedisReply& reply, const std::string& endpoint) {
  if (legacy_) {
    outcome_ = lookup_reply(reply, key_, record_key_, now_, endpoint);
    return true;
  }
  if (is_wrongtype(reply)) {
    legacy_ = true;
    request_.command = {"HGETALL", record_key_};
    return false;
  }
  if (reply.is_error()) throw_reply_error(reply, "lookup", endpoint);
  if (reply.is_nil()) return true;
  if (reply.type != RedisReply::Type::string) throw_unexpected_reply(reply, "lookup", endpoint);
  IdempotencyRecord record = decode_record_text(key_, record_key_, reply.str);
  if (record.state == IdempotencyRecord::State::completed && now_ >= record.expires_at) {
    return true;  // expired: reported absent; purge_expired() or Redis removes it
  }
  outcome_ = std::move(record);
  return true;
}

ScriptInvocation store_complete_call(const RedisOptions& options, std::int64_t now_ms,
                                     std::string_view key, std::uint64_t token,
                                     const StoredValue& value, const ExecutionReport& report,
                                     Millis ttl) {
  if (ttl.count() <= 0) return store_release_call(options, key, token);  // expired at once
  const std::int64_t expires_at = now_ms + span_ms(now_ms, ttl);
  ScriptInvocation call;
  call.script = &store_complete_script();
  call.keys = {record_key(options.key_prefix, key)};
  call.args = {RecordText::fence(token),
               RecordText::completed_head(token, now_ms, expires_at,
                                          value.bytes ? std::string_view(*value.bytes) : "",
                                          report.to_json()),
               pxat_arg(options, expires_at)};
  add_done_notice(call, options);
  return call;
}

ScriptInvocation store_release_call(const RedisOptions& options, std::string_view key,
                                    std::uint64_t token) {
  ScriptInvocation call;
  call.script = &store_release_script();
  call.keys = {record_key(options.key_prefix, key)};
  call.args = {RecordText::fence(token)};
  add_done_notice(call, options);
  return call;
}

void add_done_notice(ScriptInvocation& call, const RedisOptions& options) {
  call.args.emplace_back(options.is_cluster() ? "SPUBLISH" : "PUBLISH");
  call.args.push_back(done_channel(call.keys.front()));
}

ScriptInvocation store_renew_call(const RedisOptions& options, std::int64_t now_ms,
                                  std::string_view key, std::uint64_t token, Millis lease) {
  const std::int64_t lease_until = now_ms + span_ms(now_ms, lease);
  ScriptInvocation call;
  call.script = &store_renew_script();
  call.keys = {record_key(options.key_prefix, key)};
  call.args = {RecordText::fence(token), std::to_string(lease_until),
               pxat_arg(options, lease_until)};
  return call;
}

std::optional<IdempotencyRecord> lookup_reply(const RedisReply& reply, std::string_view key,
                                              const std::string& record, WallTime now,
                                              const std::string& endpoint) {
  if (reply.is_error()) throw_reply_error(reply, "lookup", endpoint);
  if (reply.type == RedisReply::Type::array && reply.elements.empty()) return std::nullopt;
  IdempotencyRecord found = RecordDecoder(key, record, reply).decode();
  if (found.state == IdempotencyRecord::State::completed && now >= found.expires_at) {
    return std::nullopt;  // expired: reported absent; purge_expired() or Redis removes it
  }
  return found;
}

}  // namespace idem::redis::detail
