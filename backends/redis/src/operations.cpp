#include "operations.hpp"

#include <utility>

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
               claim_key(options.key_prefix, consumer, event_id),
               token_counter_key(options.key_prefix)};
  call.args = {std::to_string(now_ms), span_arg(now_ms, lease), span_arg(0, options.expiry_slack)};
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
    case 0:
      if (e.size() != 4) throw_unexpected_reply(reply, "claim", endpoint);
      result.status = Claim::Status::acquired;
      result.token = static_cast<std::uint64_t>(reply_integer(e[1], "claim", endpoint));
      result.lease_until = from_ms(reply_integer(e[2], "claim", endpoint));
      result.took_over = reply_integer(e[3], "claim", endpoint) == 1;
      return result;
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

ScriptInvocation store_claim_call(const RedisOptions& options, std::int64_t now_ms,
                                  std::string_view key, std::optional<std::string_view> fingerprint,
                                  Millis lease) {
  ScriptInvocation call;
  call.script = &store_claim_script();
  call.keys = {record_key(options.key_prefix, key), token_counter_key(options.key_prefix)};
  call.args = {std::to_string(now_ms), span_arg(now_ms, lease), fingerprint ? "1" : "0",
               std::string(fingerprint.value_or("")), span_arg(0, options.expiry_slack)};
  return call;
}

ClaimOutcome store_claim_reply(const RedisReply& reply, std::string_view key,
                               const std::string& record, const std::string& endpoint) {
  if (reply.is_error()) throw_reply_error(reply, "claim", endpoint);
  if (reply.type != RedisReply::Type::array || reply.elements.empty() ||
      reply.elements[0].type != RedisReply::Type::string) {
    throw_unexpected_reply(reply, "claim", endpoint);
  }
  const std::string& status = reply.elements[0].str;
  ClaimOutcome outcome;
  if (status == "acquired") {
    if (reply.elements.size() != 3) throw_unexpected_reply(reply, "claim", endpoint);
    outcome.status = ClaimOutcome::Status::acquired;
    outcome.token = static_cast<std::uint64_t>(reply_integer(reply.elements[1], "claim", endpoint));
    outcome.took_over = reply_integer(reply.elements[2], "claim", endpoint) == 1;
    return outcome;
  }
  if (reply.elements.size() != 2) throw_unexpected_reply(reply, "claim", endpoint);
  IdempotencyRecord found = RecordDecoder(key, record, reply.elements[1]).decode();
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
    throw_unexpected_reply(reply, "claim", endpoint);
  }
  outcome.record = std::move(found);
  return outcome;
}

ScriptInvocation store_complete_call(const RedisOptions& options, std::int64_t now_ms,
                                     std::string_view key, std::uint64_t token,
                                     const StoredValue& value, const ExecutionReport& report,
                                     Millis ttl) {
  ScriptInvocation call;
  call.script = &store_complete_script();
  call.keys = {record_key(options.key_prefix, key)};
  call.args = {std::to_string(token), std::to_string(now_ms),
               span_arg(now_ms, ttl), value.bytes ? *value.bytes : std::string(),
               report.to_json(),      span_arg(0, options.expiry_slack)};
  return call;
}

ScriptInvocation store_release_call(const RedisOptions& options, std::string_view key,
                                    std::uint64_t token) {
  ScriptInvocation call;
  call.script = &store_release_script();
  call.keys = {record_key(options.key_prefix, key)};
  call.args = {std::to_string(token)};
  return call;
}

ScriptInvocation store_renew_call(const RedisOptions& options, std::int64_t now_ms,
                                  std::string_view key, std::uint64_t token, Millis lease) {
  ScriptInvocation call;
  call.script = &store_renew_script();
  call.keys = {record_key(options.key_prefix, key)};
  call.args = {std::to_string(token), std::to_string(now_ms), span_arg(now_ms, lease),
               span_arg(0, options.expiry_slack)};
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
