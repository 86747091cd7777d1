// InMemoryIdempotencyStore: the IdempotencyStore for one process (and for tests).
//
// Records live in a sharded hash map; each shard has its own mutex, so callers with different
// keys rarely contend. Keys are hashed with a value drawn at random once per process, so nobody
// can choose keys that share a hash to pile them up in one bucket. Values are kept as the typed
// objects the caller passed (needs_bytes() == false): nothing is serialised, and a replay hands
// back the very same shared object. Every state transition follows the state machine in
// idempotency_store.hpp:
//   * claim() is one step under the shard lock: absent, expired (now >= expires_at) or
//     abandoned (now >= lease_until) records are (re)claimed with a new, larger token;
//   * tokens come from one store-wide counter, so they grow per key even across a release or
//     an expiry followed by a new claim;
//   * complete/release/renew compare the token only: an owner whose lease has passed but whom
//     nobody replaced still completes (its claim was never taken);
//   * expiry is decided on every read with the injected clock; expired completed records are
//     reported absent and dropped when met, and purge_expired() sweeps the rest.
//
// Capacity (optional): when a claim for a new key finds the store full, records that can no
// longer matter are dropped first (expired completed records and claims whose lease has
// passed). If the store is still full, InMemoryStoreOptions::when_full decides: `reject`
// (default) refuses the claim with a retryable StoreError, so no live result is ever forgotten;
// `evict_oldest_completed` drops the completed record that completed first, trading dedup of
// the oldest key for availability. Live claims (IN_PROGRESS) are never evicted. Finding the
// oldest record scans the store, so keep the bound well above the working set: it is a safety
// limit, not a cache policy.
//
// wait() is woken by complete()/release() on the key (no polling), and re-reads the clock at
// least every 20 ms of real time so that a ManualClock moved by a test is noticed.
//
// Thread-safety: every member is safe to call from any number of threads.
//
// fork(): the default store (default_idempotency_store) is per process; a child of fork() gets a
// new, empty one. An InMemoryIdempotencyStore made before fork() may be destroyed in the child.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"
#include "idem/idempotency_store.hpp"

namespace idem {

struct InMemoryStoreOptions {
  // What a claim for a new key does when the store holds `capacity` records even after the
  // expired ones went.
  enum class WhenFull {
    reject,                  // throw StoreError (retryable); nothing is forgotten
    evict_oldest_completed,  // forget the completed record that completed first
  };

  // Time source for leases and expiries. Default (null): the system clock.
  std::shared_ptr<Clock> clock{};
  // The most records the store holds. Default: no bound.
  std::optional<std::size_t> capacity{};
  // What happens at the bound. Default: reject.
  WhenFull when_full = WhenFull::reject;
  // Number of independently locked shards (at least 1). Default 16.
  std::size_t shards = 16;
};

class InMemoryIdempotencyStore final : public IdempotencyStore {
 public:
  // Throws ConfigError for shards == 0 or capacity == 0.
  explicit InMemoryIdempotencyStore(InMemoryStoreOptions options = {});
  ~InMemoryIdempotencyStore() override;

  InMemoryIdempotencyStore(const InMemoryIdempotencyStore&) = delete;
  InMemoryIdempotencyStore& operator=(const InMemoryIdempotencyStore&) = delete;

  // The clock that decides its leases and expiries (InMemoryStoreOptions::clock, or the system
  // clock): its coroutine face (idem::async::AsyncMemoryStore) waits on the same one.
  [[nodiscard]] const std::shared_ptr<Clock>& clock() const noexcept { return clock_; }

 private:
  struct Shard;

  bool do_needs_bytes() const noexcept override { return false; }
  ClaimOutcome do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                        Millis lease) override;
  bool do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                   const ExecutionReport& report, Millis ttl) override;
  bool do_release(std::string_view key, std::uint64_t token) override;
  bool do_renew(std::string_view key, std::uint64_t token, Millis lease) override;
  std::optional<IdempotencyRecord> do_lookup(std::string_view key) override;
  // One chunk per shard: progress is called after each shard that lost records.
  std::size_t do_purge_expired(const PurgeProgress& progress) override;
  std::size_t do_entry_count() override;
  StoreCounts do_counts() override;
  // Reads every shard and sorts what matches: O(records) per page.
  RecordPage do_list(std::string_view prefix, std::size_t limit, std::string_view cursor) override;
  bool do_remove(std::string_view key, std::uint64_t token) override;
  std::optional<IdempotencyRecord> do_wait(std::string_view key, SteadyTime deadline,
                                           std::stop_token stop) override;

  Shard& shard_for(std::string_view key);
  // Makes room for one new record (capacity bound). Called without any shard lock held.
  void make_room();
  std::size_t drop_dead_records();

  std::shared_ptr<Clock> clock_;
  std::optional<std::size_t> capacity_;
  InMemoryStoreOptions::WhenFull when_full_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<std::uint64_t> last_token_{0};
  std::atomic<std::size_t> count_{0};
};

// The process-wide store used when an IdempotencyPolicy names none: an InMemoryIdempotencyStore
// with default options, created on first use.
std::shared_ptr<IdempotencyStore> default_idempotency_store();

}  // namespace idem
