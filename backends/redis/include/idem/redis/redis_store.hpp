// RedisIdempotencyStore: the record-per-key protocol of idem/idempotency_store.hpp in Redis, for
// idempotent operations shared by many processes and machines.
//
// One string per idempotency key K, at P s:{K} (P = RedisOptions::key_prefix), decoded by the
// client (docs/redis.md §5 has the byte layout):
//   in progress  "1i <token> <lease_until> <fp>"
//   completed    "1c <token> <completed_at> <expires_at> <value size> <report size> "
//                "<value><report><lease_until> <fp>"
// token is the fencing token, times are ms since the epoch, <fp> the claiming call's fingerprint
// ("-" when it had none, else "=" and its bytes), value the result's bytes as encoded by
// idem::Codec<T> (needs_bytes() == true), report the original ExecutionReport as JSON. Tokens
// need no shared key: each claim draws one (the clock's milliseconds above random bits, growing
// within a process and always larger than the token of the record it replaces), so a failover
// that lost writes cannot hand one out twice. Records whose tokens came from the counter
// P tokens (an earlier idem) are read and replaced the same way.
//
// What each call sends (docs/redis.md §5 says why):
//   lookup    GET.
//   claim     SET <claim> NX PXAT <expiry> GET: nil → the key is ours. A record in the reply
//             (or from a GET, below) that is live (in_progress with lease_until > now, completed
//             with expires_at > now) is returned as completed / in_progress / mismatch (both
//             fingerprints set and different), unchanged. An expired or abandoned one is
//             replaced by the takeover script: if the record is still what the client read, SET
//             the claim (took_over for an abandoned claim); if it changed, the script returns it
//             and the claim reads it like the SET's reply.
//             A claim that follows a claim which found a live record starts with a GET instead
//             (a replay is one GET; a new key then takes a SET NX GET more); one that follows a
//             claim which took its key starts with the SET (a new key in two round trips with
//             complete). Same outcomes either way (docs/redis.md §5).
//   complete  script: the record starts with "1i <token> " → SET completed, completed_at = now,
//             expires_at = now + ttl (ttl 0: the record is deleted — expired at once).
//   release   script: the same check → DEL.
//   renew     script: the same check → lease_until = now + lease (may also shorten it).
// A hash under the key is a record written by an older idem: read with HGETALL (completed
// results replay, live claims hold the key), replaced only once dead, and never changed by the
// token steps, which refuse it like a foreign record.
// "now" is options.clock's wall time passed as an argument (never the server's clock), so expiry
// at the boundary instant agrees with every other backend: a result is expired when now >=
// expires_at, a lease has ended when now >= lease_until. Every record also gets a Redis expiry
// (SET ... PXAT) at expires_at or lease_until plus RedisOptions::expiry_slack, only so Redis
// reclaims the space; idem never relies on it.
//
// list() and remove() are operator calls (idem list, idem release): list SCANs the prefix with
// MATCH (never KEYS) and reads the page's records; remove is a script that deletes the record
// when its token is the one given.
// purge_expired() and entry_count() SCAN the prefix (their cost grows with the whole database —
// see docs/redis.md). wait() is woken, not polling: complete(), release() and remove() publish
// to the record's channel (SPUBLISH on a cluster), and a waiter subscribes on a connection of its
// own before it reads the record, then reads it again on each message, at the claim's
// lease_until (an owner that died publishes nothing) and at least every second (a lost
// message). With options.clock set (a test clock), or when the server refuses the subscription
// (an ACL without pub/sub), it polls lookup() with capped backoff instead, as IdempotencyStore
// does.
//
// Errors: bad keys → InvalidKey; lease <= 0 or ttl < 0 → InvalidArgument; bad options →
// ConfigError; server down → RedisError(connect), retryable; lost replies → redis_error.hpp. A
// record idem cannot read (a string not in the layout, a malformed number or size, a report that
// is not valid JSON, an older idem's hash with an unknown state or a missing or malformed field,
// a key of another type) → StoreError with code store_corrupt_record naming the key and what is
// wrong; delete the key to reset it.
//
// Thread-safety: one store may be shared by any number of threads (each call leases its own
// connection); any number of processes may share a server and prefix.
//
// fork(): an object made before fork() belongs to the parent. In a child its calls throw
// ConfigError, and it must not be destroyed there either (its destructor would join the parent's
// threads and close connections the parent still uses): leak it, e.g. end the child with _exit(),
// and make new objects in the child (docs/guarantees.md §9).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/idempotency_store.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_options.hpp"

namespace idem::redis {

class RedisIdempotencyStore final : public IdempotencyStore {
 public:
  // Opens a pool of its own and checks the server with one PING (RedisError when it cannot be
  // reached or refuses AUTH/SELECT). Throws ConfigError for bad options.
  explicit RedisIdempotencyStore(RedisOptions options);
  // Shares `pool` (and its options) with recorders or other stores.
  explicit RedisIdempotencyStore(std::shared_ptr<ConnectionPool> pool);
  ~RedisIdempotencyStore() override;

  RedisIdempotencyStore(const RedisIdempotencyStore&) = delete;
  RedisIdempotencyStore& operator=(const RedisIdempotencyStore&) = delete;

  // The Redis key of the record for `key` (for operators and tests).
  std::string record_key(std::string_view key) const;

  const std::shared_ptr<ConnectionPool>& pool() const noexcept { return pool_; }

 private:
  // The protocol (the public calls of the base class check the arguments, then call these).
  bool do_needs_bytes() const noexcept override { return true; }
  ClaimOutcome do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                        Millis lease) override;
  // value.bytes is stored (an absent bytes is stored as "", a void result).
  bool do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                   const ExecutionReport& report, Millis ttl) override;
  bool do_release(std::string_view key, std::uint64_t token) override;
  bool do_renew(std::string_view key, std::uint64_t token, Millis lease) override;
  std::optional<IdempotencyRecord> do_lookup(std::string_view key) override;
  // One SCAN page per chunk; `progress` is called after each page that deleted records.
  std::size_t do_purge_expired(const PurgeProgress& progress) override;
  std::size_t do_entry_count() override;
  // SCANs the prefix and reads the start of every record (GETRANGE; HMGET of three fields for an
  // older idem's hash), pipelined per page. Keys idem cannot read (another type, a start not in
  // the layout) are counted in no state.
  StoreCounts do_counts() override;
  // SCAN MATCH <prefix>s:{<key prefix>* (never KEYS), at most kListScanCalls SCAN calls per
  // page, then one pipelined GET of the page's keys. The cursor is the SCAN cursor, followed by
  // the last key returned when a SCAN batch held more keys than the page had room for (the
  // batch is then read again and continued after that key, in byte order).
  RecordPage do_list(std::string_view prefix, std::size_t limit, std::string_view cursor) override;
  // A script: DEL when the record's token is `token`.
  bool do_remove(std::string_view key, std::uint64_t token) override;
  // Subscribes to the record's channel, then reads the record on each message (see above).
  std::optional<IdempotencyRecord> do_wait(std::string_view key, SteadyTime deadline,
                                           std::stop_token stop) override;

  std::shared_ptr<ConnectionPool> pool_;
  std::shared_ptr<Clock> clock_;
  std::atomic<bool> claim_reads_first_{false};  // how the next claim starts (docs/redis.md §5)
};

}  // namespace idem::redis
