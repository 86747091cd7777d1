// The Redis recorder's and store's operations as data (not installed): what each call sends
// (the script, its KEYS and ARGV, or the command) and what its reply means. The blocking
// RedisIdempotencyRecorder/Store and the coroutine AsyncRedisRecorder/Store both build their
// requests and read their replies here, so the two faces write the same keys with the same
// scripts and agree on every outcome.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/recorder.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_options.hpp"
#include "idem/report.hpp"
#include "internal.hpp"

namespace idem::redis::detail {

// One run of a script, owning its KEYS and ARGV.
struct ScriptInvocation {
  const Script* script = nullptr;
  std::vector<std::string> keys;
  std::vector<std::string> args;

  std::vector<std::string_view> key_views() const { return {keys.begin(), keys.end()}; }
  std::vector<std::string_view> arg_views() const { return {args.begin(), args.end()}; }
};

// EVALSHA sha numkeys KEYS... ARGV... (or EVAL with the source when `with_source`).
std::vector<std::string_view> script_argv(const ScriptInvocation& call, const std::string& numkeys,
                                          bool with_source);
// A -NOSCRIPT reply: the script did not run; send it again with its source.
bool is_noscript(const RedisReply& reply);

// 1 → true, 0 → false; an error reply or another shape throws.
bool flag_reply(const RedisReply& reply, std::string_view what, const std::string& endpoint);

// ---- recorder ---------------------------------------------------------------------------------

// SET marker ts NX [PX marker_ttl]: the arguments of one mark.
std::vector<std::string> mark_command(const RedisOptions& options, const std::string& marker_key,
                                      const std::string& now_ms);
// "OK" when the marker is new, nil when it existed; an error reply throws.
bool mark_reply(const RedisReply& reply, const std::string& endpoint);

ScriptInvocation recorder_claim_call(const RedisOptions& options, std::int64_t now_ms,
                                     std::string_view consumer, std::string_view event_id,
                                     Millis lease);
Claim recorder_claim_reply(const RedisReply& reply, std::string_view consumer,
                           std::string_view event_id, const std::string& claim_key,
                           const std::string& endpoint);
ScriptInvocation recorder_complete_call(const RedisOptions& options, std::int64_t now_ms,
                                        std::string_view consumer, std::string_view event_id,
                                        std::uint64_t token);
ScriptInvocation recorder_release_call(const RedisOptions& options, std::string_view consumer,
                                       std::string_view event_id, std::uint64_t token);
ScriptInvocation recorder_renew_call(const RedisOptions& options, std::int64_t now_ms,
                                     std::string_view consumer, std::string_view event_id,
                                     std::uint64_t token, Millis lease);

// ---- store ------------------------------------------------------------------------------------

ScriptInvocation store_claim_call(const RedisOptions& options, std::int64_t now_ms,
                                  std::string_view key, std::optional<std::string_view> fingerprint,
                                  Millis lease);
ClaimOutcome store_claim_reply(const RedisReply& reply, std::string_view key,
                               const std::string& record_key, const std::string& endpoint);
ScriptInvocation store_complete_call(const RedisOptions& options, std::int64_t now_ms,
                                     std::string_view key, std::uint64_t token,
                                     const StoredValue& value, const ExecutionReport& report,
                                     Millis ttl);
ScriptInvocation store_release_call(const RedisOptions& options, std::string_view key,
                                    std::uint64_t token);
ScriptInvocation store_renew_call(const RedisOptions& options, std::int64_t now_ms,
                                  std::string_view key, std::uint64_t token, Millis lease);
// HGETALL's reply: the record, or nullopt when absent or expired at `now`.
std::optional<IdempotencyRecord> lookup_reply(const RedisReply& reply, std::string_view key,
                                              const std::string& record_key, WallTime now,
                                              const std::string& endpoint);

}  // namespace idem::redis::detail
