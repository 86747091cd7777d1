// The Lua scripts behind every atomic step of the Redis recorder and store.
//
// Conventions: keys arrive in KEYS, everything else (times, tokens, fingerprints, values) in
// ARGV — nothing from a caller is ever part of a script's source. Times are milliseconds since
// the epoch from the client's injected clock (ARGV), never redis TIME. Numbers Lua writes go
// through '%.0f', because Lua would print large numbers in exponent form. Tokens are compared as
// the decimal strings they were stored as.
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "idem/fingerprint.hpp"
#include "internal.hpp"
#include "operations.hpp"

namespace idem::redis::detail {
namespace {

// ---- recorder -------------------------------------------------------------------------------

// KEYS: marker, claim.  ARGV: now_ms, lease_ms, expiry_slack_ms, token (drawn by the client).
// Returns {1} processed | {2, token, lease_until} in progress |
//         {0, token, lease_until, took_over} acquired; tokens as decimal strings.
// Taking over a dead claim whose token is not below the drawn one (drawn on a machine whose
// clock is behind) gives the held token plus one instead: a claim's new token always exceeds the
// one it replaces. Tokens exceed what a Lua number holds exactly, so they stay strings here:
// compared by length, then as text, and incremented digit by digit. The first write is the HSET
// (a claim has no other fields to clear): over maxmemory Redis refuses a script's first write
// and lets later ones through, so it must be one Redis checks.
constexpr std::string_view kRecorderClaim = R"lua(
local function fmt(n) return string.format('%.0f', n) end
local function above(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local function plus_one(s)
  local i = #s
  while i > 0 and string.byte(s, i) == 57 do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #s) end
  return string.sub(s, 1, i - 1) .. string.char(string.byte(s, i) + 1) .. string.rep('0', #s - i)
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {1} end
local now = tonumber(ARGV[1])
local held = redis.call('HMGET', KEYS[2], 'token', 'lease_until')
local token = ARGV[4]
local took_over = 0
if held[1] or held[2] then
  local held_token, lease_until = held[1], tonumber(held[2])
  if not held_token or not string.match(held_token, '^[1-9]%d*$') or #held_token > 19
     or not lease_until then
    return redis.error_reply('IDEMCORRUPT claim ' .. KEYS[2] .. ' has no valid token/lease_until')
  end
  if now < lease_until then return {2, held_token, lease_until} end
  if not above(token, held_token) then token = plus_one(held_token) end
  took_over = 1
end
local lease_until = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[2], 'token', token, 'lease_until', fmt(lease_until))
redis.call('PEXPIREAT', KEYS[2], fmt(lease_until + tonumber(ARGV[3])))
return {0, token, lease_until, took_over}
)lua";

// KEYS: marker, claim.  ARGV: token, now_ms, marker_ttl_ms (0: none).  Returns 1 | 0 (fenced).
constexpr std::string_view kRecorderComplete = R"lua(
if redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[2], 'NX')
end
return 1
)lua";

// KEYS: claim.  ARGV: token.  Returns 1 | 0 (fenced).
constexpr std::string_view kRecorderRelease = R"lua(
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
)lua";

// KEYS: claim.  ARGV: token, now_ms, lease_ms, expiry_slack_ms.  Returns 1 | 0 (fenced).
constexpr std::string_view kRecorderRenew = R"lua(
local function fmt(n) return string.format('%.0f', n) end
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local lease_until = tonumber(ARGV[2]) + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'lease_until', fmt(lease_until))
redis.call('PEXPIREAT', KEYS[1], fmt(lease_until + tonumber(ARGV[4])))
return 1
)lua";

// One key found by purge's SCAN. KEYS: the key.  ARGV: 'm' (marker) | 'c' (claim), cutoff_ms.
// Deletes a marker whose time is before the cutoff, or a claim whose lease ended before it.
// Returns 1 when deleted. Values idem cannot read are kept (never lose what we do not own).
constexpr std::string_view kRecorderPurge = R"lua(
local cutoff = tonumber(ARGV[2])
local at
if ARGV[1] == 'm' then
  local value = redis.pcall('GET', KEYS[1])
  if type(value) ~= 'string' then return 0 end
  at = tonumber(value)
else
  local value = redis.pcall('HGET', KEYS[1], 'lease_until')
  if type(value) ~= 'string' then return 0 end
  at = tonumber(value)
end
if at and at < cutoff then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
)lua";

// ---- store ----------------------------------------------------------------------------------
// A record is one string (record_decoder.hpp's RecordText). Only the steps that must compare and
// write atomically are scripts; reading a record (lookup, the first look of a claim) is a plain
// GET. GET goes through pcall where a hash written by an older idem may sit under the key: it
// is then a table, never equal to a string, so a fenced step refuses it like a foreign record.

// KEYS: record.  ARGV: expected (the dead record the client read), the claim, PXAT.
// Replaces the record with the claim when it is still exactly what the client read (an expired
// result, an abandoned claim) and returns 1; otherwise returns what is there now (nil: absent).
// The only step of a claim that is a script: a new key is a plain SET NX GET, but replacing a
// record that exists needs a compare-and-set, which Redis 7.0 has no command for.
constexpr std::string_view kStoreTakeover = R"lua(
local cur = redis.call('GET', KEYS[1])
if cur ~= ARGV[1] then return cur end
redis.call('SET', KEYS[1], ARGV[2], 'PXAT', ARGV[3])
return 1
)lua";

// The store's complete, release and remove end a claim that callers in other processes may be
// waiting on (RedisIdempotencyStore::wait): each then publishes to the record's channel,
// ARGV[n] = 'PUBLISH' (or 'SPUBLISH' on a cluster, where the channel shares the record's slot)
// and ARGV[n + 1] = the channel. With pcall: a user whose ACL has no pub/sub still completes
// (its waiters poll).

// KEYS: record.  ARGV: fence ('1i <token> '), completed head, PXAT, publish, channel.
// Returns 1 | 0 (fenced). The completed record is the head followed by the claim's tail
// ('<lease_until> <fp>').
constexpr std::string_view kStoreComplete = R"lua(
local cur = redis.pcall('GET', KEYS[1])
if type(cur) ~= 'string' or string.sub(cur, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2] .. string.sub(cur, #ARGV[1] + 1), 'PXAT', ARGV[3])
redis.pcall(ARGV[4], ARGV[5], '1')
return 1
)lua";

// KEYS: record.  ARGV: fence, publish, channel.  Returns 1 | 0 (fenced).  (Also complete with a
// TTL of 0.)
constexpr std::string_view kStoreRelease = R"lua(
local cur = redis.pcall('GET', KEYS[1])
if type(cur) ~= 'string' or string.sub(cur, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.pcall(ARGV[2], ARGV[3], '1')
return 1
)lua";

// KEYS: record.  ARGV: fence, lease_until, PXAT.  Returns 1 | 0 (fenced).
// Rewrites the claim's lease_until, keeping its fingerprint (from the space after the lease).
constexpr std::string_view kStoreRenew = R"lua(
local cur = redis.pcall('GET', KEYS[1])
if type(cur) ~= 'string' or string.sub(cur, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
local fp = string.find(cur, ' ', #ARGV[1] + 1, true)
if not fp then return 0 end
redis.call('SET', KEYS[1], ARGV[1] .. ARGV[2] .. string.sub(cur, fp), 'PXAT', ARGV[3])
return 1
)lua";

// KEYS: a hash written by an older idem.  ARGV: its state, token and lease_until as read ('' for
// a missing field).  Deletes it when it still holds them, so a claim can replace it; returns 1 |
// 0 (it changed).
constexpr std::string_view kStoreDropLegacy = R"lua(
local r = redis.pcall('HMGET', KEYS[1], 'state', 'token', 'lease_until')
if type(r) ~= 'table' or r.err then return 0 end
if (r[1] or '') ~= ARGV[1] or (r[2] or '') ~= ARGV[2] or (r[3] or '') ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[1])
return 1
)lua";

// One key found by purge_expired's SCAN. KEYS: the record.  ARGV: now_ms.
// Deletes a completed record (a string, or the hash of an older idem) with expires_at <= now.
// Returns 1 when deleted.
constexpr std::string_view kStorePurge = R"lua(
local v = redis.pcall('GET', KEYS[1])
local expires_at
if type(v) == 'string' then
  expires_at = tonumber(string.match(v, '^1c %d+ %-?%d+ (%-?%d+) '))
else
  local r = redis.pcall('HMGET', KEYS[1], 'state', 'expires_at')
  if type(r) ~= 'table' or r.err or r[1] ~= 'completed' then return 0 end
  expires_at = tonumber(r[2])
end
if expires_at and expires_at <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
)lua";

// KEYS: the record.  ARGV: a token (decimal).  Deletes the record whatever its state (a string,
// or the hash of an older idem) when its token is ARGV[1]; returns 1 | 0.
constexpr std::string_view kStoreRemove = R"lua(
local v = redis.pcall('GET', KEYS[1])
local token
if type(v) == 'string' then
  token = string.match(v, '^1[ic] (%d+) ')
else
  token = redis.pcall('HGET', KEYS[1], 'token')
end
if type(token) ~= 'string' or token ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.pcall(ARGV[2], ARGV[3], '1')
return 1
)lua";

Script make_script(std::string_view name, std::string_view source) {
  return Script{name, source, idem::detail::sha1_hex(source)};
}

// EVALSHA/EVAL <sha|source> <numkeys> keys... args...
std::vector<std::string_view> script_command(std::string_view verb, std::string_view body,
                                             const std::string& numkeys,
                                             std::span<const std::string_view> keys,
                                             std::span<const std::string_view> args) {
  std::vector<std::string_view> argv;
  argv.reserve(3 + keys.size() + args.size());
  argv.push_back(verb);
  argv.push_back(body);
  argv.push_back(numkeys);
  argv.insert(argv.end(), keys.begin(), keys.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

}  // namespace

#define IDEM_REDIS_SCRIPT(function, name, source)           \
  const Script& function() {                                \
    static const Script script = make_script(name, source); \
    return script;                                          \
  }

IDEM_REDIS_SCRIPT(recorder_claim_script, "recorder claim", kRecorderClaim)
IDEM_REDIS_SCRIPT(recorder_complete_script, "recorder complete", kRecorderComplete)
IDEM_REDIS_SCRIPT(recorder_release_script, "recorder release", kRecorderRelease)
IDEM_REDIS_SCRIPT(recorder_renew_script, "recorder renew", kRecorderRenew)
IDEM_REDIS_SCRIPT(recorder_purge_script, "recorder purge", kRecorderPurge)
IDEM_REDIS_SCRIPT(store_takeover_script, "store takeover", kStoreTakeover)
IDEM_REDIS_SCRIPT(store_complete_script, "store complete", kStoreComplete)
IDEM_REDIS_SCRIPT(store_release_script, "store release", kStoreRelease)
IDEM_REDIS_SCRIPT(store_renew_script, "store renew", kStoreRenew)
IDEM_REDIS_SCRIPT(store_drop_legacy_script, "store drop legacy", kStoreDropLegacy)
IDEM_REDIS_SCRIPT(store_purge_script, "store purge", kStorePurge)
IDEM_REDIS_SCRIPT(store_remove_script, "store remove", kStoreRemove)

#undef IDEM_REDIS_SCRIPT

RedisReply run_script(RedisConnection& connection, const Script& script,
                      std::span<const std::string_view> keys,
                      std::span<const std::string_view> args, CommandKind kind,
                      std::string_view what) {
  const std::string numkeys = std::to_string(keys.size());
  RedisReply reply =
      connection.command(script_command("EVALSHA", script.sha, numkeys, keys, args), kind, what);
  if (!is_noscript(reply)) return reply;
  // Not run (the server does not know the script): send the source, which runs and caches it.
  return connection.command(script_command("EVAL", script.source, numkeys, keys, args), kind, what);
}

std::vector<RedisReply> run_script_pipelined(RedisConnection& connection, const Script& script,
                                             std::span<const ScriptCall> calls, CommandKind kind,
                                             std::string_view what) {
  if (calls.empty()) return {};
  for (const ScriptCall& call : calls) {
    connection.append(script_command("EVALSHA", script.sha, std::to_string(call.keys.size()),
                                     call.keys, call.args));
  }
  std::vector<RedisReply> replies = connection.read_replies(kind, what);
  for (std::size_t i = 0; i < replies.size(); ++i) {
    if (is_noscript(replies[i])) {
      replies[i] = run_script(connection, script, calls[i].keys, calls[i].args, kind, what);
    }
  }
  return replies;
}

void load_script(RedisConnection& connection, const Script& script, std::string_view what) {
  const RedisReply reply =
      connection.command({"SCRIPT", "LOAD", script.source}, CommandKind::read, what);
  if (reply.type != RedisReply::Type::string || reply.str != script.sha) {
    throw_unexpected_reply(reply, what, connection.endpoint());
  }
}

}  // namespace idem::redis::detail
