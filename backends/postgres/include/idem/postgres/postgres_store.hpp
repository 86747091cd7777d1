// PostgresIdempotencyStore: the record-per-key IdempotencyStore in PostgreSQL, for operations
// whose callers run in many processes and machines.
//
// One table, <schema>.records (key text PRIMARY KEY, state, token, fingerprint, lease_until,
// took_over, completed_at, expires_at, value bytea, report text), follows the state machine of
// idem/idempotency_store.hpp:
//   * claim() is ONE statement: INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE <expired
//     completion or expired lease> RETURNING token, which reads the conflicting row in the same
//     statement (a CTE) so a losing claim learns completed / in_progress / mismatch without a
//     second round trip (a second read happens only when the row changed under the statement);
//   * tokens come from a sequence: they grow per key forever (also after a release, an expiry
//     or a purge) and are unique across keys;
//   * complete/release/renew are fenced by the token; complete() and release() also send
//     NOTIFY on options.notify_channel with the key as payload (pg_notify, the key bound as a
//     parameter), delivered when they commit — but only when some store's listener waits on
//     that key (it holds the key's interest lock, below): a NOTIFY makes every notifying commit
//     on the server wait for the one before it;
//   * values are stored as bytes (needs_bytes() == true: the coordinator encodes results with
//     idem::Codec<T>) and the original ExecutionReport as its JSON text (text rather than jsonb:
//     jsonb refuses the \u0000 escape an exception message may carry);
//   * every instant comes from options.clock and is sent as a parameter; expiry is decided on
//     every read (now >= expires_at is expired), purge_expired() reclaims space.
//
// wait() (WaitStrategy::notify, the default) LISTENs on the channel through one dedicated
// connection per store, held by a listener thread that is started by the first wait() or by
// listen(). While a key has waiters, that connection holds the key's interest lock: a
// session-level shared advisory lock in the two-int space, class 0x6964656d ("idem"), second key
// hashtext(channel || ':' || key); complete() and release() notify when they cannot take it
// exclusively. A waiter reads the record only once its key's lock is held, so a complete that
// committed earlier is read and a later one notifies. A waiter blocks until its key's
// notification arrives, its deadline passes, the owner's lease ends or its stop token fires —
// re-reading the record every wait_recheck_interval as a safety net, and polling while the
// listener is (re)connecting.
//
// Corrupt rows (an unknown state, a completed row without expiry or value, a report that is not
// valid JSON) throw StoreError with code store_corrupt_record naming the key and the table;
// never undefined behaviour. A value that its Codec cannot decode is the coordinator's
// DecodeError.
//
// Errors otherwise as for the recorder (postgres_error.hpp): bad keys → InvalidKey (keys must be
// valid UTF-8), bad lease/ttl → InvalidArgument, server failures → PostgresError.
//
// Thread-safety: one store may be shared by any number of threads; each call leases a pooled
// connection for its duration. Any number of processes may use the same table at once.
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
#include <optional>
#include <stop_token>
#include <string_view>

#include "idem/idempotency_store.hpp"
#include "idem/postgres/connection_pool.hpp"
#include "idem/postgres/postgres_error.hpp"
#include "idem/postgres/postgres_options.hpp"

namespace idem::postgres {

// Counters of one store (this process only), e.g. to check that waiters are woken by
// notifications rather than by polling.
struct PostgresStoreStats {
  std::uint64_t notifications_received = 0;   // NOTIFY messages the listener read (any key)
  std::uint64_t waits = 0;                    // wait() calls that had to block at least once
  std::uint64_t wakeups_by_notification = 0;  // a blocked waiter woken by its key's notification
  std::uint64_t rechecks = 0;       // a blocked waiter re-reading without one (safety net, polling,
                                    // listener state change)
  std::size_t blocked_waiters = 0;  // waiters blocked right now
  bool listening = false;           // the listener is connected and LISTENing
  std::uint64_t listener_connects = 0;  // times the listener (re)connected and LISTENed
  PoolStats pool;
};

class PostgresIdempotencyStore final : public IdempotencyStore {
 public:
  // The version of the store's table this idem writes.
  static constexpr int kSchemaVersion = 1;

  // Opens a pool for `options` and creates/migrates the table (unless options.create_schema is
  // false). Throws ConfigError for bad options, PostgresError when the server cannot be used.
  explicit PostgresIdempotencyStore(PostgresOptions options);
  // Shares `pool` (and its options) with other stores or recorders.
  explicit PostgresIdempotencyStore(std::shared_ptr<ConnectionPool> pool);
  ~PostgresIdempotencyStore() override;

  PostgresIdempotencyStore(const PostgresIdempotencyStore&) = delete;
  PostgresIdempotencyStore& operator=(const PostgresIdempotencyStore&) = delete;

  // Starts the listener (if the strategy is notify) and blocks until it is LISTENing, up to
  // `timeout`; returns whether it is. wait() starts it by itself; call this to have it ready
  // before the first waiter (or to check that notifications get through).
  bool listen(std::chrono::milliseconds timeout = std::chrono::seconds(5));

  PostgresStoreStats stats() const;
  const std::shared_ptr<ConnectionPool>& pool() const noexcept;

 private:
  // The protocol (the public calls of the base class check the arguments, then call these).
  bool do_needs_bytes() const noexcept override { return true; }
  // `fingerprint` must be valid UTF-8 without NUL bytes (InvalidArgument otherwise).
  ClaimOutcome do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                        Millis lease) override;
  // `value.bytes` must be set (InvalidArgument otherwise). A ttl of 0 drops the record at once.
  bool do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                   const ExecutionReport& report, Millis ttl) override;
  bool do_release(std::string_view key, std::uint64_t token) override;
  bool do_renew(std::string_view key, std::uint64_t token, Millis lease) override;
  std::optional<IdempotencyRecord> do_lookup(std::string_view key) override;
  // Deletes in transactions of at most 1,000 rows (oldest expiry first); `progress` is called
  // between them.
  std::size_t do_purge_expired(const PurgeProgress& progress) override;
  std::size_t do_entry_count() override;
  // One read (a scan of the table).
  StoreCounts do_counts() override;
  // One read in the keys' byte order (COLLATE "C"): unless the database's collation is C, each
  // page scans the table and sorts what matches.
  RecordPage do_list(std::string_view prefix, std::size_t limit, std::string_view cursor) override;
  bool do_remove(std::string_view key, std::uint64_t token) override;
  std::optional<IdempotencyRecord> do_wait(std::string_view key, SteadyTime deadline,
                                           std::stop_token stop) override;

  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::postgres
