#include "idem/memory_recorder.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "idem/error.hpp"
#include "idem/key.hpp"

namespace idem {
namespace detail {
namespace {

// Times are kept as system_clock ticks since the epoch: 8 bytes, trivially comparable.
using Ticks = std::int64_t;

Ticks to_ticks(WallTime t) {
  return t.time_since_epoch().count();
}
WallTime from_ticks(Ticks t) {
  return WallTime(WallTime::duration(t));
}

// now + d without overflowing on absurd durations (Millis::max() means "forever").
template <class Duration>
Ticks add_saturating(Ticks now, Duration d) {
  using Tick = WallTime::duration;
  constexpr Ticks kMax = std::numeric_limits<Ticks>::max();
  constexpr Ticks kMin = std::numeric_limits<Ticks>::min();
  const auto max_d = std::chrono::duration_cast<Duration>(Tick(kMax));
  if (d >= max_d) return kMax;
  const auto min_d = std::chrono::duration_cast<Duration>(Tick(kMin));
  if (d <= min_d) return kMin;
  const Ticks delta = std::chrono::duration_cast<Tick>(d).count();
  if (delta > 0 && now > kMax - delta) return kMax;
  if (delta < 0 && now < kMin - delta) return kMin;
  return now + delta;
}

inline std::uint64_t mix(std::uint64_t x) noexcept {
  // splitmix64 finaliser: spreads every input bit over the whole word.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// An event id of the shape new_event_id() makes, packed into 16 bytes. Only lowercase hex is
// packed, so the packing is one-to-one and an uppercase id stays a distinct (text) key.
struct PackedId {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;
};

constexpr std::array<std::int8_t, 256> make_nibbles() {
  std::array<std::int8_t, 256> table{};
  for (auto& v : table)
    v = -1;
  for (int c = '0'; c <= '9'; ++c)
    table[static_cast<std::size_t>(c)] = static_cast<std::int8_t>(c - '0');
  for (int c = 'a'; c <= 'f'; ++c)
    table[static_cast<std::size_t>(c)] = static_cast<std::int8_t>(c - 'a' + 10);
  return table;
}
constexpr auto kNibbles = make_nibbles();

bool pack_id(std::string_view id, PackedId& out) noexcept {
  if (id.size() != 32) return false;
  std::uint64_t words[2] = {0, 0};
  for (std::size_t i = 0; i < 32; ++i) {
    const std::int8_t nibble = kNibbles[static_cast<unsigned char>(id[i])];
    if (nibble < 0) return false;
    words[i / 16] = (words[i / 16] << 4) | static_cast<std::uint64_t>(nibble);
  }
  out.hi = words[0];
  out.lo = words[1];
  return true;
}

// A small inlined hash (8 bytes per step, splitmix finish). Consumer names and ids are short,
// and the library's std::hash is an out-of-line call that costs more than the rest of a lookup.
std::size_t hash_text(std::string_view text) noexcept {
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ text.size();
  const char* p = text.data();
  std::size_t n = text.size();
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    h = (h ^ word) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  if (n > 0) {
    std::uint64_t word = 0;
    std::memcpy(&word, p, n);
    h = (h ^ word) * 0x94d049bb133111ebull;
  }
  return static_cast<std::size_t>(mix(h));
}

// Keys inside one shard. The consumer name is interned per shard into a small integer, so a
// marker does not repeat it.
struct UuidKey {
  std::uint64_t hi;
  std::uint64_t lo;
  std::uint32_t consumer;
  bool operator==(const UuidKey&) const = default;
};
struct UuidKeyHash {
  std::size_t operator()(const UuidKey& k) const noexcept {
    // The id bits are random already; the consumer index only has to perturb them.
    return static_cast<std::size_t>(k.lo ^ std::rotl(k.hi, 17) ^
                                    (std::uint64_t{k.consumer} * 0x9e3779b97f4a7c15ull));
  }
};

struct TextKey {
  std::uint32_t consumer;
  std::string id;
};
struct TextKeyView {
  std::uint32_t consumer;
  std::string_view id;
};
struct TextKeyHash {
  using is_transparent = void;
  std::size_t operator()(const TextKeyView& k) const noexcept {
    return hash_text(k.id) ^ (std::size_t{k.consumer} * 0x9e3779b97f4a7c15ull);
  }
  std::size_t operator()(const TextKey& k) const noexcept {
    return (*this)(TextKeyView{k.consumer, k.id});
  }
};
struct TextKeyEq {
  using is_transparent = void;
  static TextKeyView view(const TextKey& k) noexcept { return {k.consumer, k.id}; }
  static TextKeyView view(const TextKeyView& k) noexcept { return k; }
  template <class A, class B>
  bool operator()(const A& a, const B& b) const noexcept {
    const TextKeyView x = view(a);
    const TextKeyView y = view(b);
    return x.consumer == y.consumer && x.id == y.id;
  }
};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return hash_text(s); }
};

struct ClaimState {
  std::uint64_t token;
  Ticks lease_until;
};

// Markers of packed ids: an open-addressing table (linear probing) of 32-byte slots in one
// array. The hot path — check, then mark — touches one or two adjacent cache lines and allocates
// only when the table doubles.
class PackedMarkers {
 public:
  bool contains(const UuidKey& key) const noexcept { return marked_at(key).has_value(); }

  std::optional<Ticks> marked_at(const UuidKey& key) const noexcept {
    if (slots_.empty()) return std::nullopt;
    for (std::size_t i = index(key);; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.consumer == kEmpty) return std::nullopt;
      if (slot.hi == key.hi && slot.lo == key.lo && slot.consumer == key.consumer) {
        return slot.marked_at;
      }
    }
  }

  // Calls fn(consumer index) once per marker.
  template <class Fn>
  void for_each_consumer(Fn&& fn) const {
    for (const Slot& slot : slots_) {
      if (slot.consumer != kEmpty) fn(slot.consumer);
    }
  }

  // Inserts unless present (a present marker keeps its first timestamp).
  void insert(const UuidKey& key, Ticks marked_at) {
    if ((size_ + 1) * kMaxLoadDen > slots_.size() * kMaxLoadNum) {
      rebuild(std::max<std::size_t>(kMinCapacity, slots_.size() * 2));
    }
    for (std::size_t i = index(key);; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.consumer == kEmpty) {
        slot = Slot{key.hi, key.lo, marked_at, key.consumer};
        ++size_;
        return;
      }
      if (slot.hi == key.hi && slot.lo == key.lo && slot.consumer == key.consumer) return;
    }
  }

  // Removes markers older than `cutoff`; returns how many. Rebuilds the table (linear probing
  // has no cheap single delete), shrinking it when most markers went.
  std::size_t erase_older(Ticks cutoff) {
    std::vector<Slot> survivors;
    for (const Slot& slot : slots_) {
      if (slot.consumer != kEmpty && slot.marked_at >= cutoff) survivors.push_back(slot);
    }
    const std::size_t removed = size_ - survivors.size();
    if (removed == 0) return 0;
    std::size_t capacity = kMinCapacity;
    while (survivors.size() * kMaxLoadDen > capacity * kMaxLoadNum / 2)
      capacity *= 2;
    reset(survivors.empty() ? 0 : capacity);
    for (const Slot& slot : survivors)
      place(slot);
    size_ = survivors.size();
    return removed;
  }

  std::size_t size() const noexcept { return size_; }

  std::size_t count_older(Ticks cutoff) const noexcept {
    std::size_t n = 0;
    for (const Slot& slot : slots_) {
      if (slot.consumer != kEmpty && slot.marked_at < cutoff) ++n;
    }
    return n;
  }

 private:
  struct Slot {
    std::uint64_t hi;
    std::uint64_t lo;
    Ticks marked_at;
    std::uint32_t consumer;  // kEmpty: a free slot
  };
  static constexpr std::uint32_t kEmpty = std::numeric_limits<std::uint32_t>::max();
  static constexpr std::size_t kMinCapacity = 16;
  static constexpr std::size_t kMaxLoadNum = 7;  // grow past 70% full
  static constexpr std::size_t kMaxLoadDen = 10;

  std::size_t index(const UuidKey& key) const noexcept {
    // Fibonacci hashing: the top bits of the product index a power-of-two table.
    return static_cast<std::size_t>((UuidKeyHash{}(key)*0x9e3779b97f4a7c15ull) >> shift_);
  }

  void reset(std::size_t capacity) {
    slots_.assign(capacity, Slot{0, 0, 0, kEmpty});
    mask_ = capacity == 0 ? 0 : capacity - 1;
    shift_ = capacity == 0 ? 63 : 64 - std::countr_zero(capacity);
  }

  void place(const Slot& moved) {
    const UuidKey key{moved.hi, moved.lo, moved.consumer};
    std::size_t i = index(key);
    while (slots_[i].consumer != kEmpty)
      i = (i + 1) & mask_;
    slots_[i] = moved;
  }

  void rebuild(std::size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    reset(capacity);
    for (const Slot& slot : old) {
      if (slot.consumer != kEmpty) place(slot);
    }
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  int shift_ = 63;
  std::size_t size_ = 0;
};

// Markers of text ids: a node map with allocation-free lookups by TextKeyView.
class TextMarkers {
 public:
  bool contains(const TextKeyView& key) const { return map_.find(key) != map_.end(); }
  std::optional<Ticks> marked_at(const TextKeyView& key) const {
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  template <class Fn>
  void for_each_consumer(Fn&& fn) const {
    for (const auto& entry : map_)
      fn(entry.first.consumer);
  }
  void insert(const TextKeyView& key, Ticks marked_at) {
    if (map_.find(key) == map_.end())
      map_.emplace(TextKey{key.consumer, std::string(key.id)}, marked_at);
  }
  std::size_t erase_older(Ticks cutoff) {
    return std::erase_if(map_, [&](const auto& m) { return m.second < cutoff; });
  }
  std::size_t size() const noexcept { return map_.size(); }
  std::size_t count_older(Ticks cutoff) const {
    return static_cast<std::size_t>(
        std::count_if(map_.begin(), map_.end(), [&](const auto& m) { return m.second < cutoff; }));
  }

 private:
  std::unordered_map<TextKey, Ticks, TextKeyHash, TextKeyEq> map_;
};

// Markers and claims for one kind of key. Claims are few and short-lived: a node map is fine.
template <class Markers, class Key, class Hash, class Eq>
struct Table {
  Markers markers;
  std::unordered_map<Key, ClaimState, Hash, Eq> claims;
};

using UuidTable = Table<PackedMarkers, UuidKey, UuidKeyHash, std::equal_to<UuidKey>>;
using TextTable = Table<TextMarkers, TextKey, TextKeyHash, TextKeyEq>;

}  // namespace

struct alignas(64) MemoryRecorderShard {
  std::mutex mutex;
  std::unordered_map<std::string, std::uint32_t, StringHash, std::equal_to<>> consumers;
  UuidTable uuids;
  TextTable texts;

  // The consumer looked up last: most shards serve one consumer, or a few in turn, so this
  // saves a second hash of the name. Points into `consumers` (nodes never move).
  const std::pair<const std::string, std::uint32_t>* last = nullptr;

  // The consumer's index in this shard, or nullptr when it never wrote here.
  const std::uint32_t* find_consumer(std::string_view consumer) {
    if (last != nullptr && last->first == consumer) return &last->second;
    auto it = consumers.find(consumer);
    if (it == consumers.end()) return nullptr;
    last = &*it;
    return &it->second;
  }
  std::uint32_t intern_consumer(std::string_view consumer) {
    if (const std::uint32_t* index = find_consumer(consumer)) return *index;
    // Markers reserve the largest index to mean "free slot".
    if (consumers.size() >= std::numeric_limits<std::uint32_t>::max() - 1) {
      throw StoreError("in-memory recorder: too many consumer names");
    }
    const auto index = static_cast<std::uint32_t>(consumers.size());
    last = &*consumers.emplace(std::string(consumer), index).first;
    return index;
  }
};

namespace {

// One parsed (consumer, event_id) pair: validated, packed when possible, hashed to its shard.
struct Address {
  std::string_view consumer;
  std::string_view id;
  bool packed;
  PackedId bits;
  std::size_t hash;
};

Address address(std::string_view consumer, std::string_view event_id) {
  validate_key("consumer", consumer);
  Address a{consumer, event_id, false, {}, 0};
  a.packed = pack_id(event_id, a.bits);
  // 32 hex digits are a valid key by construction; anything else gets the full check.
  if (!a.packed) validate_key("event id", event_id);
  const std::uint64_t id_hash = a.packed ? (a.bits.hi ^ a.bits.lo) : hash_text(event_id);
  a.hash = static_cast<std::size_t>(mix(id_hash ^ (hash_text(consumer) * 0x9e3779b97f4a7c15ull)));
  return a;
}

// Calls fn(table, key) with the key kind the address needs. Key is a lookup key (no
// allocation); make_owned(key) turns it into a storable one.
template <class Fn>
decltype(auto) with_key(MemoryRecorderShard& shard, const Address& a, std::uint32_t consumer,
                        Fn&& fn) {
  if (a.packed) return fn(shard.uuids, UuidKey{a.bits.hi, a.bits.lo, consumer});
  return fn(shard.texts, TextKeyView{consumer, a.id});
}

UuidKey make_owned(const UuidKey& k) {
  return k;
}
TextKey make_owned(const TextKeyView& k) {
  return TextKey{k.consumer, std::string(k.id)};
}

void require_positive_lease(Millis lease) {
  if (lease <= Millis::zero()) {
    throw InvalidArgument("lease must be positive (got " + std::to_string(lease.count()) + " ms)");
  }
}

}  // namespace
}  // namespace detail

using detail::Address;
using detail::ClaimState;
using detail::MemoryRecorderShard;
using detail::Ticks;

InMemoryIdempotencyRecorder::InMemoryIdempotencyRecorder(InMemoryRecorderOptions options)
    : clock_(options.clock ? std::move(options.clock) : system_clock()) {
  if (options.shards == 0) throw ConfigError("InMemoryRecorderOptions::shards must be at least 1");
  if (options.shards > (std::size_t{1} << 16)) {
    throw ConfigError("InMemoryRecorderOptions::shards must be at most 65536");
  }
  const std::size_t count = std::bit_ceil(options.shards);
  shard_mask_ = count - 1;
  shards_ = std::make_unique<MemoryRecorderShard[]>(count);
}

InMemoryIdempotencyRecorder::~InMemoryIdempotencyRecorder() = default;

MemoryRecorderShard& InMemoryIdempotencyRecorder::shard_for(std::size_t hash) const noexcept {
  // The high bits: the in-shard maps use the low ones.
  return shards_[(hash >> 48) & shard_mask_];
}

bool InMemoryIdempotencyRecorder::is_processed(std::string_view consumer,
                                               std::string_view event_id) {
  const Address a = detail::address(consumer, event_id);
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  const std::uint32_t* index = shard.find_consumer(consumer);
  if (index == nullptr) return false;
  return detail::with_key(shard, a, *index,
                          [](auto& table, const auto& key) { return table.markers.contains(key); });
}

void InMemoryIdempotencyRecorder::mark_processed(std::string_view consumer,
                                                 std::string_view event_id) {
  const Address a = detail::address(consumer, event_id);
  const Ticks now = detail::to_ticks(clock_->wall_now());
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  const std::uint32_t index = shard.intern_consumer(consumer);
  detail::with_key(shard, a, index, [now](auto& table, const auto& key) {
    // The first marker wins: a repeated mark must not make an old event look new to purge().
    table.markers.insert(key, now);
  });
}

Claim InMemoryIdempotencyRecorder::claim(std::string_view consumer, std::string_view event_id,
                                         Millis lease) {
  const Address a = detail::address(consumer, event_id);
  detail::require_positive_lease(lease);
  const Ticks now = detail::to_ticks(clock_->wall_now());
  const Ticks lease_until = detail::add_saturating(now, lease);
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  const std::uint32_t index = shard.intern_consumer(consumer);
  return detail::with_key(shard, a, index, [&](auto& table, const auto& key) {
    Claim result;
    if (table.markers.contains(key)) {
      result.status = Claim::Status::processed;
      return result;
    }
    auto it = table.claims.find(key);
    if (it != table.claims.end() && it->second.lease_until > now) {
      result.status = Claim::Status::in_progress;
      result.lease_until = detail::from_ticks(it->second.lease_until);
      return result;
    }
    // Taken under the shard lock, so for this key tokens are handed out in increasing order.
    const std::uint64_t token = next_token_.fetch_add(1, std::memory_order_relaxed);
    if (it != table.claims.end()) {
      it->second = ClaimState{token, lease_until};
      result.took_over = true;
    } else {
      table.claims.emplace(detail::make_owned(key), ClaimState{token, lease_until});
    }
    result.status = Claim::Status::acquired;
    result.token = token;
    result.lease_until = detail::from_ticks(lease_until);
    return result;
  });
}

bool InMemoryIdempotencyRecorder::complete(std::string_view consumer, std::string_view event_id,
                                           std::uint64_t token) {
  const Address a = detail::address(consumer, event_id);
  const Ticks now = detail::to_ticks(clock_->wall_now());
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  const std::uint32_t* index = shard.find_consumer(consumer);
  if (index == nullptr) return false;
  return detail::with_key(shard, a, *index, [&](auto& table, const auto& key) {
    auto it = table.claims.find(key);
    if (it == table.claims.end() || it->second.token != token) return false;
    table.claims.erase(it);
    table.markers.insert(key, now);
    return true;
  });
}

bool InMemoryIdempotencyRecorder::release(std::string_view consumer, std::string_view event_id,
                                          std::uint64_t token) {
  const Address a = detail::address(consumer, event_id);
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  const std::uint32_t* index = shard.find_consumer(consumer);
  if (index == nullptr) return false;
  return detail::with_key(shard, a, *index, [&](auto& table, const auto& key) {
    auto it = table.claims.find(key);
    if (it == table.claims.end() || it->second.token != token) return false;
    table.claims.erase(it);
    return true;
  });
}

bool InMemoryIdempotencyRecorder::renew(std::string_view consumer, std::string_view event_id,
                                        std::uint64_t token, Millis lease) {
  const Address a = detail::address(consumer, event_id);
  detail::require_positive_lease(lease);
  const Ticks now = detail::to_ticks(clock_->wall_now());
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  const std::uint32_t* index = shard.find_consumer(consumer);
  if (index == nullptr) return false;
  return detail::with_key(shard, a, *index, [&](auto& table, const auto& key) {
    auto it = table.claims.find(key);
    if (it == table.claims.end() || it->second.token != token) return false;
    it->second.lease_until = detail::add_saturating(now, lease);
    return true;
  });
}

std::size_t InMemoryIdempotencyRecorder::purge(std::chrono::system_clock::duration older_than) {
  return purge(older_than, PurgeProgress{});
}

std::size_t InMemoryIdempotencyRecorder::purge(std::chrono::system_clock::duration older_than,
                                               const PurgeProgress& progress) {
  if (older_than < std::chrono::system_clock::duration::zero()) {
    throw InvalidArgument("purge: older_than must not be negative");
  }
  const Ticks now = detail::to_ticks(clock_->wall_now());
  const Ticks cutoff = detail::add_saturating(now, -older_than);
  std::size_t removed = 0;
  // One shard is one chunk: each is locked only while it is swept.
  for (std::size_t i = 0; i <= shard_mask_; ++i) {
    auto& shard = shards_[i];
    std::size_t in_shard = 0;
    {
      std::lock_guard lock(shard.mutex);
      const auto sweep = [&](auto& table) {
        in_shard += table.markers.erase_older(cutoff);
        std::erase_if(table.claims, [&](const auto& c) { return c.second.lease_until < cutoff; });
      };
      sweep(shard.uuids);
      sweep(shard.texts);
    }
    removed += in_shard;
    if (in_shard > 0 && progress) progress(removed);
  }
  return removed;
}

std::vector<ConsumerCounts> InMemoryIdempotencyRecorder::consumer_counts() {
  const Ticks now = detail::to_ticks(clock_->wall_now());
  std::map<std::string, ConsumerCounts, std::less<>> by_name;
  for (std::size_t i = 0; i <= shard_mask_; ++i) {
    auto& shard = shards_[i];
    std::lock_guard lock(shard.mutex);
    std::vector<ConsumerCounts*> counts(shard.consumers.size(), nullptr);
    for (const auto& [name, index] : shard.consumers) {
      auto it = by_name.try_emplace(name).first;
      it->second.consumer = name;
      counts[index] = &it->second;
    }
    const auto add = [&](const auto& table) {
      table.markers.for_each_consumer([&](std::uint32_t index) { ++counts[index]->processed; });
      for (const auto& [key, claim] : table.claims) {
        if (claim.lease_until > now) ++counts[key.consumer]->in_progress;
      }
    };
    add(shard.uuids);
    add(shard.texts);
  }
  std::vector<ConsumerCounts> result;
  for (auto& [name, counts] : by_name) {
    // Interned by a claim that was then released, with nothing left: not worth a line.
    if (counts.processed > 0 || counts.in_progress > 0) result.push_back(std::move(counts));
  }
  return result;
}

std::size_t InMemoryIdempotencyRecorder::count_purgeable(
    std::chrono::system_clock::duration older_than) {
  if (older_than < std::chrono::system_clock::duration::zero()) {
    throw InvalidArgument("count_purgeable: older_than must not be negative");
  }
  const Ticks cutoff = detail::add_saturating(detail::to_ticks(clock_->wall_now()), -older_than);
  std::size_t n = 0;
  for (std::size_t i = 0; i <= shard_mask_; ++i) {
    std::lock_guard lock(shards_[i].mutex);
    n +=
        shards_[i].uuids.markers.count_older(cutoff) + shards_[i].texts.markers.count_older(cutoff);
  }
  return n;
}

MarkerInspection InMemoryIdempotencyRecorder::inspect(std::string_view consumer,
                                                      std::string_view event_id) {
  const Address a = detail::address(consumer, event_id);
  const Ticks now = detail::to_ticks(clock_->wall_now());
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  MarkerInspection result;
  const std::uint32_t* index = shard.find_consumer(consumer);
  if (index == nullptr) return result;
  detail::with_key(shard, a, *index, [&](auto& table, const auto& key) {
    if (auto at = table.markers.marked_at(key)) {
      result.processed = true;
      result.processed_at = detail::from_ticks(*at);
    }
    auto it = table.claims.find(key);
    if (it != table.claims.end()) {
      result.claim =
          MarkerInspection::OpenClaim{it->second.token, detail::from_ticks(it->second.lease_until),
                                      it->second.lease_until > now};
    }
  });
  return result;
}

std::size_t InMemoryIdempotencyRecorder::marker_count() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i <= shard_mask_; ++i) {
    std::lock_guard lock(shards_[i].mutex);
    n += shards_[i].uuids.markers.size() + shards_[i].texts.markers.size();
  }
  return n;
}

std::size_t InMemoryIdempotencyRecorder::claim_count() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i <= shard_mask_; ++i) {
    std::lock_guard lock(shards_[i].mutex);
    n += shards_[i].uuids.claims.size() + shards_[i].texts.claims.size();
  }
  return n;
}

}  // namespace idem
