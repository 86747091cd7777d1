#include "idem/memory_store.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "idem/detail/fork.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "keyed_hash.hpp"

namespace idem {
namespace {

// A key with its hash, for a lookup that has hashed the key already (to pick its shard).
struct HashedKey {
  std::string_view text;
  std::size_t hash;
};

struct KeyHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view key) const noexcept {
    return static_cast<std::size_t>(detail::hash_bytes(key));
  }
  std::size_t operator()(const HashedKey& key) const noexcept { return key.hash; }
};

struct KeyEqual {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const noexcept { return a == b; }
  bool operator()(const HashedKey& a, std::string_view b) const noexcept { return a.text == b; }
  bool operator()(std::string_view a, const HashedKey& b) const noexcept { return a == b.text; }
};

using RecordMap = std::unordered_map<std::string, IdempotencyRecord, KeyHash, KeyEqual>;

// wait() re-reads the clock at least this often, so a ManualClock moved by a test (which no
// condition variable can observe) is noticed promptly.
constexpr auto kWaitSlice = std::chrono::milliseconds(20);

// A shard sweeps its expired records when it has grown to this many since the last sweep
// (then doubles the threshold), so a store nobody purges stays bounded by its live records
// at an amortised O(1) per insert.
constexpr std::size_t kMinSweepThreshold = 64;

bool is_expired(const IdempotencyRecord& record, WallTime now) {
  return record.state == IdempotencyRecord::State::completed && now >= record.expires_at;
}

// Neither a completed record that can be replayed nor a claim whose owner may still renew.
bool is_dead(const IdempotencyRecord& record, WallTime now) {
  return record.state == IdempotencyRecord::State::completed ? now >= record.expires_at
                                                             : now >= record.lease_until;
}

}  // namespace

struct InMemoryIdempotencyStore::Shard {
  std::mutex mutex;
  RecordMap records;
  // Signalled when a record of this shard completes, is released or dropped; `generation`
  // tells a waiter that something changed (the condition variable alone cannot).
  std::condition_variable_any changed;
  std::uint64_t generation = 0;
  std::size_t waiters = 0;
  std::size_t sweep_at = kMinSweepThreshold;

  void notify_locked() {
    if (waiters == 0) return;
    ++generation;
    changed.notify_all();
  }

  // The record of `key` while `token`'s claim on it is in progress, or records.end(). Under the
  // lock.
  RecordMap::iterator held(std::string_view key, std::uint64_t token) {
    auto it = records.find(key);
    if (it == records.end()) return it;
    const IdempotencyRecord& record = it->second;
    if (record.state != IdempotencyRecord::State::in_progress || record.token != token) {
      return records.end();
    }
    return it;
  }
};

InMemoryIdempotencyStore::InMemoryIdempotencyStore(InMemoryStoreOptions options)
    : clock_(options.clock ? std::move(options.clock) : system_clock()),
      capacity_(options.capacity),
      when_full_(options.when_full) {
  if (options.shards == 0) throw ConfigError("InMemoryStoreOptions::shards must be at least 1");
  if (capacity_ && *capacity_ == 0) {
    throw ConfigError("InMemoryStoreOptions::capacity must be at least 1 (or unset: no bound)");
  }
  shards_.reserve(options.shards);
  for (std::size_t i = 0; i < options.shards; ++i)
    shards_.push_back(std::make_unique<Shard>());
  wait_clock_ = clock_;
}

InMemoryIdempotencyStore::~InMemoryIdempotencyStore() = default;

InMemoryIdempotencyStore::Shard& InMemoryIdempotencyStore::shard_for(std::string_view key) {
  return *shards_[KeyHash{}(key) % shards_.size()];
}

ClaimOutcome InMemoryIdempotencyStore::do_claim(std::string_view key,
                                                std::optional<std::string_view> fingerprint,
                                                Millis lease) {
  // The shard shard_for(key) picks, with the hash kept for the lookup.
  const HashedKey hashed{key, KeyHash{}(key)};
  Shard& shard = *shards_[hashed.hash % shards_.size()];
  for (;;) {
    {
      std::lock_guard lock(shard.mutex);
      const WallTime now = clock_->wall_now();
      auto it = shard.records.find(hashed);
      if (it != shard.records.end()) {
        IdempotencyRecord& record = it->second;
        if (!is_dead(record, now)) {
          return ClaimOutcome::found(record, fingerprint);
        }
        // A dead record is reclaimed in place: an abandoned lease is a takeover (the old
        // owner's token is fenced off), an expired result simply starts over.
        ClaimOutcome outcome;
        outcome.status = ClaimOutcome::Status::acquired;
        outcome.took_over = record.state == IdempotencyRecord::State::in_progress;
        outcome.token = ++last_token_;
        record = IdempotencyRecord{};
        record.key = it->first;
        record.token = outcome.token;
        if (fingerprint) record.fingerprint = std::string(*fingerprint);
        record.lease_until = now + lease;
        return outcome;
      }
      if (!capacity_ || count_.fetch_add(1) < *capacity_) {
        if (shard.records.size() >= shard.sweep_at) {
          std::size_t swept = std::erase_if(
              shard.records, [now](const auto& entry) { return is_expired(entry.second, now); });
          if (capacity_) count_ -= swept;
          shard.sweep_at = std::max(kMinSweepThreshold, 2 * shard.records.size());
        }
        ClaimOutcome outcome;
        outcome.status = ClaimOutcome::Status::acquired;
        outcome.token = ++last_token_;
        IdempotencyRecord record;
        record.key = std::string(key);
        record.token = outcome.token;
        if (fingerprint) record.fingerprint = std::string(*fingerprint);
        record.lease_until = now + lease;
        shard.records.emplace(record.key, std::move(record));
        return outcome;
      }
      --count_;  // the reservation above failed: the store is full
    }
    make_room();
  }
}

std::size_t InMemoryIdempotencyStore::drop_dead_records() {
  std::size_t dropped = 0;
  for (auto& shard : shards_) {
    std::lock_guard lock(shard->mutex);
    const WallTime now = clock_->wall_now();
    const std::size_t n = std::erase_if(
        shard->records, [now](const auto& entry) { return is_dead(entry.second, now); });
    if (n > 0) {
      if (capacity_) count_ -= n;
      shard->notify_locked();
      dropped += n;
    }
  }
  return dropped;
}

void InMemoryIdempotencyStore::make_room() {
  if (drop_dead_records() > 0 || count_.load() < *capacity_) return;
  if (when_full_ == InMemoryStoreOptions::WhenFull::reject) {
    throw StoreError("in-memory idempotency store is full (capacity " + std::to_string(*capacity_) +
                         " records, none expired); raise InMemoryStoreOptions::capacity or "
                         "choose WhenFull::evict_oldest_completed",
                     /*retryable=*/true);
  }
  // Find the completed record that completed first, then remove it if it is still the same
  // record (token unchanged) once its shard is locked again.
  Shard* oldest_shard = nullptr;
  std::string oldest_key;
  std::uint64_t oldest_token = 0;
  WallTime oldest_at = WallTime::max();
  for (auto& shard : shards_) {
    std::lock_guard lock(shard->mutex);
    for (const auto& [key, record] : shard->records) {
      if (record.state == IdempotencyRecord::State::completed && record.completed_at < oldest_at) {
        oldest_at = record.completed_at;
        oldest_shard = shard.get();
        oldest_key = key;
        oldest_token = record.token;
      }
    }
  }
  if (oldest_shard == nullptr) {
    throw StoreError("in-memory idempotency store is full (capacity " + std::to_string(*capacity_) +
                         " records, all of them claims in progress); raise "
                         "InMemoryStoreOptions::capacity",
                     /*retryable=*/true);
  }
  std::lock_guard lock(oldest_shard->mutex);
  auto it = oldest_shard->records.find(oldest_key);
  if (it != oldest_shard->records.end() && it->second.token == oldest_token &&
      it->second.state == IdempotencyRecord::State::completed) {
    oldest_shard->records.erase(it);
    --count_;
    oldest_shard->notify_locked();
  }
}

bool InMemoryIdempotencyStore::do_complete(std::string_view key, std::uint64_t token,
                                           StoredValue value, const ExecutionReport& report,
                                           Millis ttl) {
  Shard& shard = shard_for(key);
  std::lock_guard lock(shard.mutex);
  const auto it = shard.held(key, token);
  if (it == shard.records.end()) return false;
  IdempotencyRecord& record = it->second;
  if (ttl == Millis::zero()) {
    // Expired at the instant it completes: nothing to keep.
    shard.records.erase(it);
    if (capacity_) --count_;
  } else {
    const WallTime now = clock_->wall_now();
    record.state = IdempotencyRecord::State::completed;
    record.completed_at = now;
    record.expires_at = now + ttl;
    record.value = std::move(value);
    record.report = report;
  }
  shard.notify_locked();
  return true;
}

bool InMemoryIdempotencyStore::do_release(std::string_view key, std::uint64_t token) {
  Shard& shard = shard_for(key);
  std::lock_guard lock(shard.mutex);
  const auto it = shard.held(key, token);
  if (it == shard.records.end()) return false;
  shard.records.erase(it);
  if (capacity_) --count_;
  shard.notify_locked();
  return true;
}

bool InMemoryIdempotencyStore::do_renew(std::string_view key, std::uint64_t token, Millis lease) {
  Shard& shard = shard_for(key);
  std::lock_guard lock(shard.mutex);
  const auto it = shard.held(key, token);
  if (it == shard.records.end()) return false;
  it->second.lease_until = clock_->wall_now() + lease;
  return true;
}

std::optional<IdempotencyRecord> InMemoryIdempotencyStore::do_lookup(std::string_view key) {
  Shard& shard = shard_for(key);
  std::lock_guard lock(shard.mutex);
  auto it = shard.records.find(key);
  if (it == shard.records.end()) return std::nullopt;
  if (is_expired(it->second, clock_->wall_now())) {
    shard.records.erase(it);
    if (capacity_) --count_;
    return std::nullopt;
  }
  return it->second;
}

std::size_t InMemoryIdempotencyStore::do_purge_expired(const PurgeProgress& progress) {
  std::size_t purged = 0;
  // One shard is one chunk: each is locked only while it is swept.
  for (auto& shard : shards_) {
    std::size_t n = 0;
    {
      std::lock_guard lock(shard->mutex);
      const WallTime now = clock_->wall_now();
      n = std::erase_if(shard->records,
                        [now](const auto& entry) { return is_expired(entry.second, now); });
      if (capacity_) count_ -= n;
    }
    purged += n;
    if (n > 0 && progress) progress(purged);
  }
  return purged;
}

StoreCounts InMemoryIdempotencyStore::do_counts() {
  StoreCounts counts;
  for (auto& shard : shards_) {
    std::lock_guard lock(shard->mutex);
    const WallTime now = clock_->wall_now();
    for (const auto& [key, record] : shard->records) {
      if (record.state == IdempotencyRecord::State::completed) {
        ++(now >= record.expires_at ? counts.expired : counts.completed);
      } else {
        ++(now >= record.lease_until ? counts.abandoned : counts.in_progress);
      }
    }
  }
  return counts;
}

RecordPage InMemoryIdempotencyStore::do_list(std::string_view prefix, std::size_t limit,
                                             std::string_view cursor) {
  std::vector<IdempotencyRecord> found;
  for (auto& shard : shards_) {
    std::lock_guard lock(shard->mutex);
    for (const auto& [key, record] : shard->records) {
      if (!key.starts_with(prefix) || std::string_view(key) <= cursor) continue;
      IdempotencyRecord summary = record;
      summary.key = key;
      summary.value = {};
      summary.report.reset();
      found.push_back(std::move(summary));
    }
  }
  const auto by_key = [](const IdempotencyRecord& a, const IdempotencyRecord& b) {
    return a.key < b.key;
  };
  RecordPage page;
  if (found.size() > limit) {
    std::partial_sort(found.begin(), found.begin() + static_cast<std::ptrdiff_t>(limit),
                      found.end(), by_key);
    found.resize(limit);
    page.next = found.back().key;
  } else {
    std::sort(found.begin(), found.end(), by_key);
  }
  page.records = std::move(found);
  return page;
}

bool InMemoryIdempotencyStore::do_remove(std::string_view key, std::uint64_t token) {
  Shard& shard = shard_for(key);
  std::lock_guard lock(shard.mutex);
  auto it = shard.records.find(key);
  if (it == shard.records.end() || it->second.token != token) return false;
  shard.records.erase(it);
  if (capacity_) --count_;
  shard.notify_locked();
  return true;
}

std::size_t InMemoryIdempotencyStore::do_entry_count() {
  std::size_t total = 0;
  for (auto& shard : shards_) {
    std::lock_guard lock(shard->mutex);
    total += shard->records.size();
  }
  return total;
}

std::optional<IdempotencyRecord> InMemoryIdempotencyStore::do_wait(std::string_view key,
                                                                   SteadyTime deadline,
                                                                   std::stop_token stop) {
  Shard& shard = shard_for(key);
  std::unique_lock lock(shard.mutex);
  ++shard.waiters;
  struct WaiterCount {
    Shard& shard;
    ~WaiterCount() { --shard.waiters; }
  } waiter_count{shard};
  for (;;) {
    const WallTime now = clock_->wall_now();
    auto it = shard.records.find(key);
    if (it == shard.records.end()) return std::nullopt;
    const IdempotencyRecord& record = it->second;
    if (record.state == IdempotencyRecord::State::completed) {
      if (now >= record.expires_at) return std::nullopt;
      return record;
    }
    if (now >= record.lease_until || stop.stop_requested()) return record;
    const SteadyTime steady_now = clock_->steady_now();
    if (steady_now >= deadline) return record;
    const auto slice = std::min<std::chrono::nanoseconds>(
        {deadline - steady_now, record.lease_until - now, kWaitSlice});
    const std::uint64_t seen = shard.generation;
    shard.changed.wait_for(lock, stop, slice, [&] { return shard.generation != seen; });
  }
}

std::shared_ptr<IdempotencyStore> default_idempotency_store() {
  // One per process: a child of fork() gets a new, empty store, and the parent's copy (whose
  // locks a parent thread may have held at the fork) is abandoned, never destroyed or used. The
  // swap is lock-free for the same reason. Never destroyed itself: calls may still run while
  // static objects are torn down.
  struct Default {
    std::shared_ptr<IdempotencyStore> store;
    std::uint64_t generation;
  };
  static std::atomic<Default*> current{
      new Default{std::make_shared<InMemoryIdempotencyStore>(), detail::fork_generation()}};
  const std::uint64_t generation = detail::fork_generation();
  Default* d = current.load(std::memory_order_acquire);
  while (d->generation != generation) {
    auto* fresh = new Default{std::make_shared<InMemoryIdempotencyStore>(), generation};
    if (current.compare_exchange_strong(d, fresh, std::memory_order_acq_rel)) {
      detail::abandon(std::shared_ptr<const Default>(d));
      d = fresh;
    } else {
      delete fresh;  // another thread of this child swapped first
    }
  }
  return d->store;
}

}  // namespace idem
