// RedisIdempotencyRecorder: processed-event markers in Redis, shared by every process that
// reaches the server.
//
// Implements check/mark and claims (exclusive mode) of idem/recorder.hpp; there is no
// transactional mode (Redis has no transaction a handler's own writes could join).
//
// Keys (P = RedisOptions::key_prefix, C = the consumer with '\' and ':' escaped by a '\',
// E = the event id as given):
//   P m:{C:E}   marker: a string holding the mark time in ms since the epoch, written with
//               SET ... NX [PX marker_ttl]; is_processed() is EXISTS.
//   P c:{C:E}   claim: a hash {token, lease_until} (ms), with a Redis expiry at lease_until +
//               expiry_slack so a dead owner's claim does not stay forever.
//   P tokens    the token counter (INCR) of the recorder's claims (the store draws its tokens
//               without it).
// A record's two keys carry the same hash tag, so they live in one cluster slot and one Lua
// script can touch both. Keys and ids are never spliced into script source: they travel as
// KEYS/ARGV, and the escaping above makes (consumer, event id) → key one-to-one.
//
// claim/complete/release/renew are Lua scripts (EVALSHA, with the source sent once more when the
// server answers NOSCRIPT, e.g. after a restart), so each one is atomic on the server:
//   claim     marker exists → processed; a claim with lease_until > now → in_progress; else
//             INCR the counter and (re)write the claim → acquired (took_over when a claim whose
//             lease had passed was replaced).
//   complete  the claim's token matches → delete the claim, SET the marker NX; else false.
//   release   the claim's token matches → delete the claim; else false.
//   renew     the claim's token matches → lease_until = now + lease; else false.
// "now" is options.clock's wall time, passed to every script as an argument: Redis's own clock
// is never read, so a ManualClock drives expiry in tests and every backend decides leases the
// same way. The clocks of the processes sharing a server must agree (NTP) — a client whose clock
// runs ahead takes over leases early — exactly as for SQLite files shared between machines.
//
// Tokens come from one counter per prefix, so they grow per (consumer, event id) forever, also
// across a release or a purge. The counter is the one key outside a record's slot; see
// docs/redis.md for what that means on Redis Cluster.
//
// purge(older_than) SCANs the prefix and deletes markers whose time is older than now -
// older_than (and claims whose lease ended before that), with a compare-and-delete script per
// key. SCAN walks the whole database, so its cost grows with every key the server holds, not
// just idem's: for large marker sets prefer RedisOptions::marker_ttl and let Redis expire them.
//
// Errors: bad keys → InvalidKey (nothing sent); bad options → ConfigError; a server that is down
// → RedisError(connect), retryable, within connect_timeout; see redis_error.hpp for lost
// replies. A damaged claim hash → StoreError(store_corrupt_record).
//
// Thread-safety: one recorder may be shared by any number of threads (each call leases its own
// connection). Any number of processes may use the same server and prefix.
//
// fork(): an object made before fork() belongs to the parent. In a child its calls throw
// ConfigError, and it must not be destroyed there either (its destructor would join the parent's
// threads and close connections the parent still uses): leak it, e.g. end the child with _exit(),
// and make new objects in the child (docs/guarantees.md §9).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/recorder.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_options.hpp"

namespace idem::redis {

class RedisIdempotencyRecorder final : public IdempotencyRecorder {
 public:
  // Opens a pool of its own and checks the server with one PING, so a wrong host, port,
  // password or db fails here (RedisError) rather than at the first event. Throws ConfigError
  // for bad options.
  explicit RedisIdempotencyRecorder(RedisOptions options);
  // Shares `pool` (and its options: prefix, clock, TTLs) with other recorders or stores.
  explicit RedisIdempotencyRecorder(std::shared_ptr<ConnectionPool> pool);
  ~RedisIdempotencyRecorder() override;

  RedisIdempotencyRecorder(const RedisIdempotencyRecorder&) = delete;
  RedisIdempotencyRecorder& operator=(const RedisIdempotencyRecorder&) = delete;

  // Marks many events of one consumer with one pipelined round trip per 512 ids. Every id is
  // validated before anything is sent (InvalidKey marks nothing). Returns how many markers were
  // new. Marking an id twice is harmless, as with mark_processed().
  std::size_t mark_processed_batch(std::string_view consumer,
                                   std::span<const std::string> event_ids);
  std::size_t mark_processed_batch(std::string_view consumer,
                                   std::span<const std::string_view> event_ids);

  // The Redis keys of a marker and a claim (for operators and tests).
  std::string marker_key(std::string_view consumer, std::string_view event_id) const;
  std::string claim_key(std::string_view consumer, std::string_view event_id) const;

  const std::shared_ptr<ConnectionPool>& pool() const noexcept { return pool_; }

 private:
  // The protocol (the public calls of the base class check the arguments, then call these).
  RecorderCapabilities do_capabilities() const noexcept override { return {.claims = true}; }
  bool do_is_processed(std::string_view consumer, std::string_view event_id) override;
  void do_mark_processed(std::string_view consumer, std::string_view event_id) override;
  // One pipelined round trip of EXISTS (one per id) per 512 ids, on one pooled connection.
  std::vector<bool> do_is_processed_many(std::string_view consumer,
                                         std::span<const std::string> event_ids) override;
  // mark_processed_batch(): one pipelined round trip of SET NX per 512 ids.
  void do_mark_processed_many(std::string_view consumer,
                              std::span<const std::string> event_ids) override;
  Claim do_claim(std::string_view consumer, std::string_view event_id, Millis lease) override;
  bool do_complete(std::string_view consumer, std::string_view event_id,
                   std::uint64_t token) override;
  bool do_release(std::string_view consumer, std::string_view event_id,
                  std::uint64_t token) override;
  bool do_renew(std::string_view consumer, std::string_view event_id, std::uint64_t token,
                Millis lease) override;
  // See the top of this file for the cost.
  // One SCAN page per chunk; `progress` is called after each page that deleted markers.
  std::size_t do_purge(std::chrono::system_clock::duration older_than,
                       const PurgeProgress& progress) override;
  // These SCAN the prefix (cost as for purge). consumer_counts() reads the consumer from each
  // key's name and the lease of each claim; count_purgeable() reads every marker's time.
  std::vector<ConsumerCounts> do_consumer_counts() override;
  std::size_t do_count_purgeable(std::chrono::system_clock::duration older_than) override;
  PurgeableMarkers do_purgeable_markers(std::chrono::system_clock::duration older_than) override;
  MarkerInspection do_inspect(std::string_view consumer, std::string_view event_id) override;

  // mark_processed_batch without the argument checks (done by the caller).
  std::size_t mark_checked_batch(std::string_view consumer,
                                 std::span<const std::string_view> event_ids);

  std::shared_ptr<ConnectionPool> pool_;
  std::shared_ptr<Clock> clock_;
};

}  // namespace idem::redis
