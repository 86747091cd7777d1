// Helpers shared by the Redis recorder and store (not installed).
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"

namespace idem::redis::detail {

// ---- keys ---------------------------------------------------------------------------------
// See redis_recorder.hpp / redis_store.hpp for the layout. The consumer is escaped ('\' and ':'
// get a '\' in front) so that "consumer:event" inside the hash tag can be split back in exactly
// one way: (consumer, event id) → key is one-to-one.
std::string escape_consumer(std::string_view consumer);
std::string marker_key(std::string_view prefix, std::string_view consumer,
                       std::string_view event_id);
std::string claim_key(std::string_view prefix, std::string_view consumer,
                      std::string_view event_id);
std::string record_key(std::string_view prefix, std::string_view key);
// The pub/sub channel a store record's complete, release and remove publish to: the record key
// and ":done", so it has the record's hash tag (and slot: SPUBLISH on a cluster).
std::string done_channel(std::string_view record_key);
// `text` with the glob characters of SCAN MATCH (* ? [ ] \) escaped.
std::string glob_escape(std::string_view text);

// ---- time ---------------------------------------------------------------------------------
// Stored times are milliseconds since the epoch. WallTime (nanoseconds in 64 bits) ends in 2262,
// so every time idem stores is kept within [-max_time_ms(), max_time_ms()]: a lease or TTL
// reaching beyond simply means "until then" (forever, for any practical purpose).
std::int64_t max_time_ms();
std::int64_t to_ms(WallTime t);
// Saturating: a stored time outside WallTime's range becomes WallTime::min()/max(), never UB.
WallTime from_ms(std::int64_t ms);
// `d` as the decimal argument of a script that adds it to `now_ms`: clamped to >= 0 and so that
// now_ms + d stays within max_time_ms().
std::string span_arg(std::int64_t now_ms, std::chrono::milliseconds d);
// The same span as a number.
std::int64_t span_ms(std::int64_t now_ms, std::chrono::milliseconds d);
// now_ms - d, saturating (purge cutoffs).
std::int64_t minus_ms(std::int64_t now_ms, std::chrono::milliseconds d);

// ---- scripts ------------------------------------------------------------------------------
struct Script {
  std::string_view name;    // for messages
  std::string_view source;  // Lua
  std::string sha;          // SHA-1 of source, lower-case hex (EVALSHA)
};

const Script& recorder_claim_script();
const Script& recorder_complete_script();
const Script& recorder_release_script();
const Script& recorder_renew_script();
const Script& recorder_purge_script();
const Script& store_takeover_script();
const Script& store_complete_script();
const Script& store_release_script();
const Script& store_renew_script();
const Script& store_drop_legacy_script();
const Script& store_purge_script();
const Script& store_remove_script();

// EVALSHA; when the server does not know the script (NOSCRIPT — a restart, SCRIPT FLUSH), EVAL
// with the source, which also caches it again. Error replies are returned, not thrown.
RedisReply run_script(RedisConnection& connection, const Script& script,
                      std::span<const std::string_view> keys,
                      std::span<const std::string_view> args, CommandKind kind,
                      std::string_view what);
// One run of a script in run_script_pipelined().
struct ScriptCall {
  std::vector<std::string_view> keys;
  std::vector<std::string_view> args;
};
// Runs `script` once per call with EVALSHA, all in one pipelined round trip; replies in call
// order. A call answered NOSCRIPT did not run (the script cache was flushed mid-pipeline, or the
// server restarted): it is sent again with the source. Error replies are returned, not thrown.
std::vector<RedisReply> run_script_pipelined(RedisConnection& connection, const Script& script,
                                             std::span<const ScriptCall> calls, CommandKind kind,
                                             std::string_view what);
// SCRIPT LOAD, so that pipelined EVALSHA calls usually find it.
void load_script(RedisConnection& connection, const Script& script, std::string_view what);

// ---- errors -------------------------------------------------------------------------------
// An error reply as a RedisError (reply, not retryable); WRONGTYPE → store_corrupt_record.
[[noreturn]] void throw_reply_error(const RedisReply& reply, std::string_view what,
                                    const std::string& endpoint);
// A connection that could not be made (RedisFailure::connect, retryable: the server may come
// up): code connection_refused for ECONNREFUSED (nothing listens there), connect_timeout for a
// timeout, store_error otherwise. `detail` says what failed.
RedisError connect_error(const std::string& endpoint, int error_number, const std::string& detail);

// min_replicas (RedisOptions): the reply to the WAIT sent after a call's writes. Throws RedisError
// (in doubt; retryable for an idempotent write) when fewer than `min_replicas` replicas confirmed
// them, unless every command of the call failed (`no_write`: nothing was written).
void check_wait(const RedisReply& wait, std::size_t min_replicas,
                std::chrono::milliseconds replica_timeout, bool no_write, CommandKind kind,
                std::string_view what, const std::string& endpoint);
// A host name that does not resolve: host_not_found, retryable only when the resolver could not
// answer now (net::ResolveError::temporary()).
RedisError resolve_error(const std::string& endpoint, const std::string& detail, bool temporary);
// The first bytes a server sent on a connection are not a Redis reply: something else listens
// there (wrong_protocol, not retryable).
RedisError not_redis_error(std::string_view what, const std::string& endpoint,
                           std::string_view first_bytes);
// A reply of an unexpected shape (a bug or a foreign script under our name).
[[noreturn]] void throw_unexpected_reply(const RedisReply& reply, std::string_view what,
                                         const std::string& endpoint);

// What cluster.cpp needs of a RedisConnection beyond its public calls.
struct ConnectionAccess {
  // Writes the queued commands without reading their replies.
  static void send(RedisConnection& connection, CommandKind kind, std::string_view what);
  // The nodes a whole-keyspace command (SCAN) runs on: every primary of a freshly read layout on
  // a cluster, else the connection itself. node(connection, i) is the connection to the i-th,
  // asked for anew before each use (a connection to it may be replaced in between).
  static std::size_t node_count(RedisConnection& connection);
  static RedisConnection& node(RedisConnection& connection, std::size_t i);
};

// Calls each_page(keys) for every page of SCAN MATCH `pattern` (COUNT `count`), on every primary
// of a cluster: the purges and operator views of the recorder and the store. A key may come in
// two pages (SCAN's rule). each_page may send commands on `connection` (routed by their keys).
template <class EachPage>
void scan_keys(RedisConnection& connection, const std::string& pattern, std::size_t count,
               std::string_view what, EachPage&& each_page) {
  const std::string count_text = std::to_string(count);
  const std::size_t nodes = ConnectionAccess::node_count(connection);
  for (std::size_t i = 0; i < nodes; ++i) {
    std::string cursor = "0";
    do {
      RedisConnection& node = ConnectionAccess::node(connection, i);
      const RedisReply page = node.command({"SCAN", cursor, "MATCH", pattern, "COUNT", count_text},
                                           CommandKind::read, what);
      if (page.type != RedisReply::Type::array || page.elements.size() != 2 ||
          page.elements[1].type != RedisReply::Type::array) {
        throw_unexpected_reply(page, what, node.endpoint());
      }
      cursor = page.elements[0].str;
      each_page(page.elements[1].elements);
    } while (cursor != "0");
  }
}
// An integer reply's value, or the integer a string reply holds; throws otherwise.
long long reply_integer(const RedisReply& reply, std::string_view what,
                        const std::string& endpoint);

}  // namespace idem::redis::detail
