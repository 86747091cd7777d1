#include "idem/memory_recorder.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <sys/mman.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "idem/error.hpp"
#include "idem/key.hpp"
#include "keyed_hash.hpp"

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

// Event ids of the two common shapes are packed into 16 bytes: 32 lowercase hex digits (what
// new_event_id() makes) and the dashed 8-4-4-4-12 form of the same digits (a textual UUID). Only
// lowercase hex is packed, so each packing is one-to-one; the shape is part of the key, so
// "0123...ef" and "01234567-...-ef" stay distinct, as their texts are. Any other id of up to 16
// bytes is kept as it is in the same 16 bytes, zero-padded (short_text: the slot keeps the
// length too, so "ab" and "ab\0" would differ, though a valid id has no NUL byte); longer ones go
// to the shard's arena (text).
enum class IdKind : std::uint8_t { hex32 = 0, uuid36 = 1, text = 2, short_text = 3 };
constexpr std::size_t kShortText = 16;

struct PackedId {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;
};

// 4 characters at p and 4 at q as one word.
inline std::uint64_t load4x2(const char* p, const char* q) noexcept {
  std::uint32_t a;
  std::uint32_t b;
  std::memcpy(&a, p, 4);
  std::memcpy(&b, q, 4);
  return std::uint64_t{a} | (std::uint64_t{b} << 32);
}

#if defined(__SSE2__)
// 16 characters (the first 8 in `first`, the next 8 in `second`, each loaded little-endian) that
// must all be lowercase hex digits, turned into 64 bits with SSE2: two range compares, a
// nibble fix-up, pairs of nibbles shifted together, packed to bytes. Bytes of 0x80 and above
// are negative to the signed compares and fail both ranges.
inline bool hex16(std::uint64_t first, std::uint64_t second, std::uint64_t& out) noexcept {
  const __m128i x = _mm_set_epi64x(static_cast<long long>(second), static_cast<long long>(first));
  const __m128i digit = _mm_and_si128(_mm_cmpgt_epi8(x, _mm_set1_epi8('0' - 1)),
                                      _mm_cmplt_epi8(x, _mm_set1_epi8('9' + 1)));
  const __m128i letter = _mm_and_si128(_mm_cmpgt_epi8(x, _mm_set1_epi8('a' - 1)),
                                       _mm_cmplt_epi8(x, _mm_set1_epi8('f' + 1)));
  const int valid = _mm_movemask_epi8(_mm_or_si128(digit, letter));
  const __m128i nibbles =
      _mm_add_epi8(_mm_and_si128(x, _mm_set1_epi8(0x0f)), _mm_and_si128(letter, _mm_set1_epi8(9)));
  // Each 16-bit lane holds two nibbles (n0 low, n1 high): n0 << 4 | n1 in its low byte.
  const __m128i pairs = _mm_and_si128(
      _mm_or_si128(_mm_slli_epi16(nibbles, 4), _mm_srli_epi16(nibbles, 8)), _mm_set1_epi16(0xff));
  out = static_cast<std::uint64_t>(_mm_cvtsi128_si64(_mm_packus_epi16(pairs, pairs)));
  return valid == 0xffff;
}
#else
constexpr std::uint64_t kOnes = 0x0101010101010101ull;
constexpr std::uint64_t kHighs = 0x8080808080808080ull;

// 8 characters (loaded little-endian into `word`) that must all be lowercase hex digits, turned
// into their 32 bits without a branch or a table: each byte is compared against the bounds of
// '0'-'9' and 'a'-'f' by adding a bias that sets its high bit; a byte of 0x80 or above fails
// (its sums may carry into the next byte, but the result is then thrown away). False when any
// byte is not a lowercase digit; `out` is then meaningless.
inline bool hex8(std::uint64_t word, std::uint32_t& out) noexcept {
  const std::uint64_t ascii = ~word & kHighs;  // high bit set where the byte is below 0x80
  const std::uint64_t ge_0 = word + (0x80 - '0') * kOnes;
  const std::uint64_t gt_9 = word + (0x80 - '9' - 1) * kOnes;
  const std::uint64_t ge_a = word + (0x80 - 'a') * kOnes;
  const std::uint64_t gt_f = word + (0x80 - 'f' - 1) * kOnes;
  const std::uint64_t digit = ge_0 & ~gt_9 & ascii;
  const std::uint64_t letter = ge_a & ~gt_f & ascii;
  // '0'-'9' → low nibble as is; 'a'-'f' → low nibble (1..6) + 9.
  const std::uint64_t nibbles = (word & (0x0f * kOnes)) + (letter >> 7) * 9;
  // Pairs of nibbles into bytes, then the four bytes into 32 bits (any fixed one-to-one order
  // will do: packed ids are never turned back into text).
  std::uint64_t v = ((nibbles << 4) | (nibbles >> 8)) & 0x00ff00ff00ff00ffull;
  v = (v | (v >> 8)) & 0x0000ffff0000ffffull;
  v = (v | (v >> 16)) & 0x00000000ffffffffull;
  out = static_cast<std::uint32_t>(v);
  return (digit | letter) == kHighs;
}

inline bool hex16(std::uint64_t first, std::uint64_t second, std::uint64_t& out) noexcept {
  std::uint32_t a;
  std::uint32_t b;
  // Not &&: both are computed anyway (int operands: clang warns on & between bools).
  const bool ok = (static_cast<int>(hex8(first, a)) & static_cast<int>(hex8(second, b))) != 0;
  out = (std::uint64_t{a} << 32) | b;
  return ok;
}
#endif

inline bool pack_words(std::uint64_t w0, std::uint64_t w1, std::uint64_t w2, std::uint64_t w3,
                       PackedId& out) noexcept {
  // Non-short-circuit &: both halves are checked in parallel (int operands: clang warns on &
  // between bools).
  return (static_cast<int>(hex16(w0, w1, out.hi)) & static_cast<int>(hex16(w2, w3, out.lo))) != 0;
}

inline bool pack_hex32(std::string_view id, PackedId& out) noexcept {
  const char* p = id.data();
  return pack_words(load8(p), load8(p + 8), load8(p + 16), load8(p + 24), out);
}

// xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
inline bool pack_uuid36(std::string_view id, PackedId& out) noexcept {
  const char* p = id.data();
  if (p[8] != '-' || p[13] != '-' || p[18] != '-' || p[23] != '-') return false;
  return pack_words(load8(p), load4x2(p + 9, p + 14), load4x2(p + 19, p + 24), load8(p + 28), out);
}

// The last n < 8 bytes at p as one little-endian word (byte i of the text in byte i), without a
// variable-length memcpy (which is a library call).
inline std::uint64_t load_tail(const char* p, std::size_t n) noexcept {
  std::uint64_t word = 0;
  unsigned shift = 0;
  if ((n & 4) != 0) {
    std::uint32_t part;
    std::memcpy(&part, p, 4);
    word = part;
    p += 4;
    shift = 32;
  }
  if ((n & 2) != 0) {
    std::uint16_t part;
    std::memcpy(&part, p, 2);
    word |= std::uint64_t{part} << shift;
    p += 2;
    shift += 16;
  }
  if ((n & 1) != 0) word |= std::uint64_t{static_cast<unsigned char>(*p)} << shift;
  return word;
}

// Up to 8 bytes at p as one little-endian word, zero-padded.
inline std::uint64_t load_upto8(const char* p, std::size_t n) noexcept {
  return n >= 8 ? load8(p) : load_tail(p, n);
}

// An id of 1..kShortText bytes as two zero-padded words.
inline PackedId pack_short_text(std::string_view id) noexcept {
  const std::size_t n = id.size();
  return PackedId{load_upto8(id.data(), n), n > 8 ? load_upto8(id.data() + 8, n - 8) : 0};
}

// Whether n bytes at x and at y are the same: up to 32 bytes in word compares (overlapping at
// the end), without memcmp's call.
inline bool same_bytes(const char* x, const char* y, std::size_t n) noexcept {
  if (n > 32) return std::memcmp(x, y, n) == 0;
  if (n >= 8) {
    std::uint64_t differ = (load8(x) ^ load8(y)) | (load8(x + n - 8) ^ load8(y + n - 8));
    if (n > 16) {
      differ |= (load8(x + 8) ^ load8(y + 8)) | (load8(x + n - 16) ^ load8(y + n - 16));
    }
    return differ == 0;
  }
  return load_tail(x, n) == load_tail(y, n);
}

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return static_cast<std::size_t>(hash_bytes(s));
  }
};

// Claims are keyed by the consumer's index in the shard and the id's text: few, short-lived, a
// node map is fine. The text determines the packed form, so both kinds of key agree.
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
    return static_cast<std::size_t>(hash_bytes(k.id) ^
                                    (std::uint64_t{k.consumer} * 0x9e3779b97f4a7c15ull));
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

struct ClaimState {
  std::uint64_t token;
  Ticks lease_until;
};

// One parsed event id: its kind, its packed bits (hex32/uuid36) and the hash of the id alone.
struct IdKey {
  IdKind kind;
  PackedId bits;          // packed kinds
  std::string_view text;  // the id as given
  std::uint64_t hash;
};

// A lookup inside one shard: the id and the consumer's index there.
struct SlotKey {
  const IdKey* id;
  std::uint32_t consumer;
};

constexpr std::size_t kHugePage = std::size_t{2} << 20;

// `bytes` (a multiple of kHugePage) of fresh memory, aligned to kHugePage and asked to be backed
// by transparent huge pages, its pages populated in one call. One huge page instead of 512 small
// ones means one fault and one TLB entry instead of 512 of each; on a virtual machine that
// shadows the guest's page tables, the first write to each small page costs a trap of several
// microseconds even after MAP_POPULATE, which huge pages take out. Where THP is off, or no huge
// page is free, this is populated small pages, as below.
char* map_huge(std::size_t bytes) {
  void* memory = ::mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<std::uintptr_t>(memory);
  const std::uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) ::munmap(memory, aligned - start);
  const std::uintptr_t tail = start + bytes + kHugePage - (aligned + bytes);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  char* data = reinterpret_cast<char*>(aligned);
  ::madvise(data, bytes, MADV_HUGEPAGE);
#if defined(MADV_POPULATE_WRITE)
  if (::madvise(data, bytes, MADV_POPULATE_WRITE) == 0) return data;
  if (errno == ENOMEM) {
    ::munmap(data, bytes);
    throw std::bad_alloc();
  }
#endif
  // A kernel before 5.14: one write per small page (a huge page takes the first).
  for (std::size_t i = 0; i < bytes; i += 4096)
    static_cast<volatile char*>(data)[i] = 0;
  return data;
}

// One kHugePage mapping that pieces of several shards' arenas share (PagePool), unmapped by
// whichever piece, or the pool, lets go of it last. The count is atomic and the release takes no
// lock, so a recorder destroyed in a child of fork() cannot block on a lock a parent's thread
// held.
struct SharedPage {
  char* data;
  std::atomic<std::size_t> references;
};

void let_go(SharedPage* page) noexcept {
  if (page->references.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    ::munmap(page->data, kHugePage);
    delete page;
  }
}

// A block of memory for a shard's tables and text ids, cache-line aligned. Small blocks come
// from the heap, so a process with many small recorders spends no memory mapping on them. From
// kMapped on a block is a mapping of its own with its pages populated in one call: a page
// faulted in on first write, one at a time, costs over ten times as much on a virtual machine
// (255-byte ids fill a page every 16 marks). A multiple of kHugePage is mapped for huge pages
// (map_huge); so is a piece of a shared page (PagePool).
class Block {
 public:
  static constexpr std::size_t kMapped = std::size_t{256} << 10;

  Block() = default;
  explicit Block(std::size_t bytes) {
    if (bytes == 0) return;
    if (bytes < kMapped) {
      data_ = static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
      if (data_ == nullptr) throw std::bad_alloc();
      kind_ = Kind::heap;
    } else if (bytes % kHugePage == 0) {
      data_ = map_huge(bytes);
      kind_ = Kind::mapped;
    } else {
      void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      if (memory == MAP_FAILED) throw std::bad_alloc();
      data_ = static_cast<char*>(memory);
      kind_ = Kind::mapped;
    }
    size_ = bytes;
  }
  // `bytes` at `offset` of a shared page, holding one of its references (the caller took it).
  static Block piece_of(SharedPage* page, std::size_t offset, std::size_t bytes) noexcept {
    Block block;
    block.data_ = page->data + offset;
    block.size_ = bytes;
    block.kind_ = Kind::piece;
    block.page_ = page;
    return block;
  }
  Block(Block&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        kind_(std::exchange(other.kind_, Kind::none)),
        page_(std::exchange(other.page_, nullptr)) {}
  Block& operator=(Block&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      kind_ = std::exchange(other.kind_, Kind::none);
      page_ = std::exchange(other.page_, nullptr);
    }
    return *this;
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  ~Block() { release(); }

  char* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  enum class Kind : std::uint8_t { none, heap, mapped, piece };

  void release() noexcept {
    switch (kind_) {
      case Kind::none:
        break;
      case Kind::heap:
        std::free(data_);
        break;
      case Kind::mapped:
        ::munmap(data_, size_);
        break;
      case Kind::piece:
        let_go(page_);
        break;
    }
    data_ = nullptr;
    size_ = 0;
    kind_ = Kind::none;
    page_ = nullptr;
  }

  char* data_ = nullptr;
  std::size_t size_ = 0;
  Kind kind_ = Kind::none;
  SharedPage* page_ = nullptr;  // Kind::piece: the page the piece belongs to
};

}  // namespace

// Where a recorder's shards take arena chunks of kMapped and more: pieces cut in turn from one
// huge page at a time, so a shard holding a few hundred KiB of text ids gets huge pages too
// (with 64 shards, each one's own 2 MiB chunk would cost 128 MiB). A piece is what was asked for
// or what is left of the page, whichever is less, but never under kMapped: at most kMapped of a
// page goes unused. Taking a piece locks the pool; a shard does that once per chunk, under its
// own lock (the pool never takes a shard's). Giving one back does not lock (SharedPage).
class PagePool {
 public:
  PagePool() = default;
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;
  ~PagePool() {
    if (current_ != nullptr) let_go(current_);
  }

  // A piece of kMapped to `bytes` bytes (kMapped <= bytes <= kHugePage).
  Block take(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    if (current_ == nullptr || kHugePage - used_ < Block::kMapped) {
      // The pool's own reference: the page stays while pieces may still be cut from it. (If
      // map_huge throws, new frees what it allocated.)
      auto* page = new SharedPage{map_huge(kHugePage), 1};
      if (current_ != nullptr) let_go(current_);
      current_ = page;
      used_ = 0;
    }
    const std::size_t size = std::min(bytes, kHugePage - used_);
    current_->references.fetch_add(1, std::memory_order_relaxed);
    Block piece = Block::piece_of(current_, used_, size);
    used_ += size;
    return piece;
  }

 private:
  std::mutex mutex_;
  SharedPage* current_ = nullptr;
  std::size_t used_ = 0;
};

namespace {

// A fixed array of trivially copyable T in one Block, without std::vector's bookkeeping.
template <class T>
class SlotArray {
 public:
  SlotArray() = default;
  SlotArray(SlotArray&& other) noexcept
      : block_(std::move(other.block_)), size_(std::exchange(other.size_, 0)) {}
  SlotArray& operator=(SlotArray&& other) noexcept {
    block_ = std::move(other.block_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }
  SlotArray(const SlotArray&) = delete;
  SlotArray& operator=(const SlotArray&) = delete;
  ~SlotArray() = default;

  // Replaces the contents with `count` copies of `value`.
  void assign(std::size_t count, const T& value) {
    block_ = Block();
    size_ = 0;
    if (count == 0) return;
    block_ = Block(count * sizeof(T));
    size_ = count;
    std::uninitialized_fill_n(data(), count, value);
  }

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  T& operator[](std::size_t i) noexcept { return data()[i]; }
  const T& operator[](std::size_t i) const noexcept { return data()[i]; }
  const T* begin() const noexcept { return data(); }
  const T* end() const noexcept { return data() + size_; }

 private:
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
  static_assert(alignof(T) <= 64);
  T* data() const noexcept { return reinterpret_cast<T*>(block_.data()); }
  Block block_;
  std::size_t size_ = 0;
};

// The bytes of a shard's text ids: chunks filled in turn, never moved (growing copies nothing,
// and a 255-byte id never straddles two chunks). A position is (chunk << 32) | offset.
class Arena {
 public:
  explicit Arena(PagePool* pages = nullptr) noexcept : pages_(pages) {}

  std::uint64_t add(std::string_view text) {
    if (chunks_.empty() || used_ + text.size() > chunks_.back().size()) {
      // Chunks double from 64 KiB to 2 MiB: few mappings for many ids, little for few. From
      // kMapped on they are pieces of the recorder's huge pages, when it has a pool.
      next_ = chunks_.empty() ? kFirstChunk : std::min(next_ * 2, kLastChunk);
      chunks_.push_back(pages_ != nullptr && next_ >= Block::kMapped ? pages_->take(next_)
                                                                     : Block(next_));
      used_ = 0;
    }
    const std::uint64_t position = (std::uint64_t{chunks_.size() - 1} << 32) | used_;
    std::memcpy(chunks_.back().data() + used_, text.data(), text.size());
    used_ += text.size();
    return position;
  }
  const char* at(std::uint64_t position) const noexcept {
    return chunks_[position >> 32].data() + (position & 0xffffffffu);
  }
  // An empty arena taking its chunks where this one does.
  Arena empty_like() const noexcept { return Arena(pages_); }

 private:
  static constexpr std::size_t kFirstChunk = std::size_t{64} << 10;
  static constexpr std::size_t kLastChunk = kHugePage;
  static_assert(kMaxKeyLength <= kFirstChunk && kMaxKeyLength <= Block::kMapped);
  std::size_t used_ = 0;  // first: Markers keeps it in the line every mark writes
  std::vector<Block> chunks_;
  std::size_t next_ = 0;  // the size asked for last (a piece may be smaller)
  PagePool* pages_;
};

// Every marker of one shard, whatever its id's shape: an open-addressing table (linear probing)
// of 32-byte slots, with one control byte per slot in an array of its own. Packed ids (and ids
// of up to 16 bytes) live in the slot; longer ids' bytes live in an arena the slot points into
// (offset, length) next to the id's 64-bit hash, so a probe compares the text only when the
// hashes agree.
//
// The control byte is "free" or 7 bits of the slot's hash. A lookup reads control bytes and
// opens a slot only when its 7 bits agree (one in 128 for another id), so the check of a new id
// reads one line of the control array (1 byte a slot: it stays in the CPU's cache when the slots
// do not) and no slot. A new marker's control byte is set at once, but its slot is written
// later: the mark prefetches the slot's line and parks the slot, which is written out at the
// shard's next mark, or before anything reads slots. So the cache miss a new marker costs
// overlaps the calls that follow instead of stalling the shard's unlock (a locked instruction
// waits for every earlier store to reach the cache; a prefetch it does not wait for).
class Markers {
 public:
  std::optional<Ticks> marked_at(const SlotKey& key) noexcept {
    if (slots_.empty()) return std::nullopt;
    const std::uint64_t h = slot_hash(key.id->hash, key.consumer);
    const std::uint8_t tag = tag_of(h);
    for (std::size_t i = index_of(h);; i = (i + 1) & mask_) {
      const std::uint8_t c = ctrl_[i];
      if (c == kEmpty) return std::nullopt;
      if (c == tag && matches(slot_at(i), key)) return slots_[i].marked_at;
    }
  }
  bool contains(const SlotKey& key) noexcept { return marked_at(key).has_value(); }

  // Calls fn(consumer index) once per marker.
  template <class Fn>
  void for_each_consumer(Fn&& fn) {
    flush();
    for (const Slot& slot : slots_) {
      if (slot.consumer != kFree) fn(slot.consumer);
    }
  }

  // Inserts unless present; a present marker keeps its first timestamp. now() is called only
  // when a marker is added (a repeated mark reads no clock).
  template <class Now>
  void insert(const SlotKey& key, Now&& now) {
    if ((size_ + 1) * kMaxLoadDen > slots_.size() * kMaxLoadNum) {
      relocate(std::max<std::size_t>(kMinCapacity, slots_.size() * 2),
               [](const Slot&) { return true; });
    }
    const std::uint64_t h = slot_hash(key.id->hash, key.consumer);
    const std::uint8_t tag = tag_of(h);
    std::size_t i = index_of(h);
    for (;; i = (i + 1) & mask_) {
      const std::uint8_t c = ctrl_[i];
      if (c == kEmpty) break;
      if (c == tag && matches(slot_at(i), key)) return;
    }
    const IdKey& id = *key.id;
    Slot slot{};
    slot.consumer = key.consumer;
    slot.kind = static_cast<std::uint8_t>(id.kind);
    slot.length = static_cast<std::uint8_t>(id.text.size());
    if (id.kind == IdKind::text) {
      slot.a = arena_.add(id.text);
      slot.b = id.hash;
    } else {
      slot.a = id.bits.hi;
      slot.b = id.bits.lo;
    }
    slot.marked_at = now();
    flush();
    pending_ = i;
    pending_slot_ = slot;
    __builtin_prefetch(&slots_[i], 1);
    ctrl_[i] = tag;
    ++size_;
  }

  // Sizes the table for `markers` markers now, and never shrinks it below that: no growth (and
  // no rehash of every marker) until it holds more.
  // Arena chunks of Block::kMapped and more come from `pages` (the recorder's), from now on.
  void use_pages(PagePool* pages) noexcept { arena_ = Arena(pages); }

  void reserve(std::size_t markers) {
    std::size_t capacity = kMinCapacity;
    while (markers * kMaxLoadDen > capacity * kMaxLoadNum)
      capacity *= 2;
    min_capacity_ = capacity;
    if (capacity > slots_.size()) relocate(capacity, [](const Slot&) { return true; });
  }

  // Removes markers older than `cutoff`; returns how many. Rebuilds the table and the arena
  // (linear probing has no cheap single delete), shrinking them when most markers went (not
  // below what reserve() asked for).
  std::size_t erase_older(Ticks cutoff) {
    const std::size_t survivors = size_ - count_older(cutoff);
    const std::size_t removed = size_ - survivors;
    if (removed == 0) return 0;
    std::size_t capacity = std::max(kMinCapacity, min_capacity_);
    while (survivors * kMaxLoadDen > capacity * kMaxLoadNum / 2)
      capacity *= 2;
    relocate(survivors == 0 && min_capacity_ == 0 ? 0 : capacity,
             [cutoff](const Slot& s) { return s.marked_at >= cutoff; });
    return removed;
  }

  std::size_t size() const noexcept { return size_; }

  std::size_t count_older(Ticks cutoff) noexcept {
    flush();
    std::size_t n = 0;
    for (const Slot& slot : slots_) {
      if (slot.consumer != kFree && slot.marked_at < cutoff) ++n;
    }
    return n;
  }

  static std::uint64_t packed_hash(const PackedId& bits, IdKind kind) noexcept {
    // Keyed as hash_bytes() is: both words and the shape go through the multiplies.
    return hash_finish(bits.hi, bits.lo, hash_key(), static_cast<std::uint64_t>(kind));
  }

 private:
  struct Slot {
    std::uint64_t a;  // packed: high word; text: where the arena keeps it
    std::uint64_t b;  // packed: low word; text: hash of the id
    Ticks marked_at;
    std::uint32_t consumer;  // kFree: a free slot
    std::uint8_t kind;       // IdKind
    std::uint8_t length;     // the id's length (1..255)
    std::uint16_t unused;
  };
  static_assert(sizeof(Slot) == 32);
  static_assert(kMaxKeyLength <= 255, "text slots store the length in one byte");
  static constexpr std::uint32_t kFree = std::numeric_limits<std::uint32_t>::max();
  static constexpr std::uint8_t kEmpty = 0x80;  // control byte of a free slot; a tag is 0..127
  static constexpr std::size_t kMinCapacity = 16;
  static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  static constexpr std::size_t kMaxLoadNum = 7;  // grow past 70% full
  static constexpr std::size_t kMaxLoadDen = 10;

  static std::uint64_t slot_hash(std::uint64_t id_hash, std::uint32_t consumer) noexcept {
    return id_hash ^ (std::uint64_t{consumer} * 0x9e3779b97f4a7c15ull);
  }
  // 7 bits of the hash that index_of() does not use.
  static std::uint8_t tag_of(std::uint64_t h) noexcept {
    return static_cast<std::uint8_t>(h & 0x7f);
  }
  std::size_t index_of(std::uint64_t h) const noexcept { return index_at(h, shift_); }
  static std::size_t index_at(std::uint64_t h, int shift) noexcept {
    // Fibonacci hashing: the top bits of the product index a power-of-two table.
    return static_cast<std::size_t>((h * 0x9e3779b97f4a7c15ull) >> shift);
  }
  // The id hash a stored slot was placed by (the same function IdKey::hash is).
  static std::uint64_t stored_id_hash(const Slot& slot) noexcept {
    if (slot.kind == static_cast<std::uint8_t>(IdKind::text)) return slot.b;
    return packed_hash(PackedId{slot.a, slot.b}, static_cast<IdKind>(slot.kind));
  }

  // Slot i, once the pending slots are written (a lookup opens a slot only when its tag agrees).
  const Slot& slot_at(std::size_t i) noexcept {
    flush();
    return slots_[i];
  }
  void flush() noexcept {
    if (pending_ == kNone) return;
    slots_[pending_] = pending_slot_;
    pending_ = kNone;
  }

  bool matches(const Slot& slot, const SlotKey& key) const noexcept {
    const IdKey& id = *key.id;
    if (slot.consumer != key.consumer || slot.kind != static_cast<std::uint8_t>(id.kind)) {
      return false;
    }
    if (slot.length != id.text.size()) return false;
    if (id.kind != IdKind::text) return slot.a == id.bits.hi && slot.b == id.bits.lo;
    return slot.b == id.hash && same_bytes(arena_.at(slot.a), id.text.data(), id.text.size());
  }

  // Moves the slots that `keep` accepts into a table of `capacity` (a power of two, or 0), with
  // the arena compacted when anything was dropped. Everything new is built aside and swapped in
  // at the end, so running out of memory (std::bad_alloc) leaves the markers as they were.
  template <class Keep>
  void relocate(std::size_t capacity, Keep&& keep) {
    flush();
    // Growing keeps every marker and so the arena as it is; dropping any compacts the arena.
    const bool compact = count_kept(slots_, keep) != size_;
    SlotArray<Slot> slots;
    SlotArray<std::uint8_t> ctrl;
    slots.assign(capacity, Slot{0, 0, 0, kFree, 0, 0, 0});
    ctrl.assign(capacity, kEmpty);
    Arena arena = arena_.empty_like();
    const std::size_t mask = capacity == 0 ? 0 : capacity - 1;
    const int shift = capacity == 0 ? 63 : 64 - std::countr_zero(capacity);
    std::size_t size = 0;
    for (Slot slot : slots_) {
      if (slot.consumer == kFree || !keep(slot)) continue;
      if (compact && slot.kind == static_cast<std::uint8_t>(IdKind::text)) {
        slot.a = arena.add(std::string_view(arena_.at(slot.a), slot.length));
      }
      const std::uint64_t h = slot_hash(stored_id_hash(slot), slot.consumer);
      std::size_t i = index_at(h, shift);
      while (ctrl[i] != kEmpty)
        i = (i + 1) & mask;
      ctrl[i] = tag_of(h);
      slots[i] = slot;
      ++size;
    }
    slots_ = std::move(slots);
    ctrl_ = std::move(ctrl);
    if (compact) arena_ = std::move(arena);
    mask_ = mask;
    shift_ = shift;
    size_ = size;
  }

  template <class Keep>
  static std::size_t count_kept(const SlotArray<Slot>& slots, Keep& keep) {
    std::size_t n = 0;
    for (const Slot& slot : slots) {
      if (slot.consumer != kFree && keep(slot)) ++n;
    }
    return n;
  }

  // Written by every mark, so first: with the shard's lock they fill one cache line, the only one
  // of the shard's own that a check or a mark writes (MemoryRecorderShard).
  std::size_t size_ = 0;
  std::size_t pending_ = kNone;  // the slot a new marker is parked for, if any
  Slot pending_slot_{};
  Arena arena_;  // bytes of text ids, in the order they were marked (its write offset first)
  // Read by every call, written only when the table is rebuilt.
  SlotArray<Slot> slots_;
  SlotArray<std::uint8_t> ctrl_;  // one per slot: kEmpty or the slot's tag
  std::size_t mask_ = 0;
  int shift_ = 63;
  std::size_t min_capacity_ = 0;  // reserve()'s: the table never shrinks below it
};

}  // namespace

// A shard's lock: 4 bytes where std::mutex takes 40, so that it shares one cache line with the
// fields every mark writes (Markers). Threads on different cores take turns at a shard, and each
// turn moves the lines it writes from the other core's cache: one line instead of three or four
// is what lets a second thread add throughput. Uncontended, it costs what std::mutex does (one
// locked instruction to take, one to release); contended, it spins briefly, then sleeps in the
// futex behind std::atomic::wait (state 2 says someone may sleep, so release must wake).
class ShardLock {
 public:
  void lock() noexcept {
    std::uint32_t expected = 0;
    if (state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) return;
    for (int spin = 0; spin < 100; ++spin) {
#if defined(__SSE2__)
      _mm_pause();
#endif
      expected = 0;
      if (state_.load(std::memory_order_relaxed) == 0 &&
          state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
        return;
      }
    }
    while (state_.exchange(2, std::memory_order_seq_cst) != 0)
      state_.wait(2, std::memory_order_relaxed);
  }
  // seq_cst, not just release: notify_one() skips the futex call when it reads no registered
  // sleeper, and that read must not be ordered before this store (a sleeper registering at that
  // moment would then see the lock still held and sleep with nobody to wake it). On x86 both are
  // the same one locked instruction.
  void unlock() noexcept {
    if (state_.exchange(0, std::memory_order_seq_cst) == 2) state_.notify_one();
  }

 private:
  std::atomic<std::uint32_t> state_{0};  // 0 free, 1 held, 2 held and maybe waited for
};

struct alignas(64) MemoryRecorderShard {
  // First, in one cache line: the lock and what a mark writes (Markers puts those fields first).
  ShardLock mutex;
  Markers markers;
  std::unordered_map<std::string, std::uint32_t, StringHash, std::equal_to<>> consumers;
  std::unordered_map<TextKey, ClaimState, TextKeyHash, TextKeyEq> claims;

  // The consumer looked up last: most shards serve one consumer, or a few in turn, so this
  // saves a second hash of the name. Points into `consumers` (nodes never move).
  const std::pair<const std::string, std::uint32_t>* last = nullptr;

  // The consumer's index in this shard, or nullptr when it never wrote here.
  const std::uint32_t* find_consumer(std::string_view consumer) {
    if (last != nullptr && last->first.size() == consumer.size() &&
        same_bytes(last->first.data(), consumer.data(), consumer.size())) {
      return &last->second;
    }
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

  // The claim on (consumer, event_id) while `token` still holds it, with the consumer's index;
  // nullopt when another token holds it or there is none.
  struct HeldClaim {
    std::uint32_t index;
    decltype(claims)::iterator claim;
  };
  std::optional<HeldClaim> held_claim(std::string_view consumer, std::string_view event_id,
                                      std::uint64_t token) {
    const std::uint32_t* index = find_consumer(consumer);
    if (index == nullptr) return std::nullopt;
    auto it = claims.find(TextKeyView{*index, event_id});
    if (it == claims.end() || it->second.token != token) return std::nullopt;
    return HeldClaim{*index, it};
  }
};

namespace {

// One parsed (consumer, event_id) pair (already checked by the public call): packed when it has
// one of the packed shapes, hashed once; `hash` picks the shard.
struct Address {
  std::string_view consumer;
  IdKey id;
  std::size_t hash;
};

Address address(std::string_view consumer, std::string_view event_id) {
  Address a;
  a.consumer = consumer;
  // The public call has checked both keys.
  const std::uint64_t consumer_hash = hash_bytes(consumer);
  a.id.text = event_id;
  a.id.kind = IdKind::text;
  if (event_id.size() == 32 && pack_hex32(event_id, a.id.bits)) {
    a.id.kind = IdKind::hex32;
  } else if (event_id.size() == 36 && pack_uuid36(event_id, a.id.bits)) {
    a.id.kind = IdKind::uuid36;
  } else if (event_id.size() <= kShortText) {
    a.id.bits = pack_short_text(event_id);
    a.id.kind = IdKind::short_text;
  }
  if (a.id.kind == IdKind::text) {
    a.id.hash = hash_bytes(event_id);
  } else {
    a.id.hash = Markers::packed_hash(a.id.bits, a.id.kind);
  }
  a.hash = static_cast<std::size_t>(a.id.hash ^ std::rotl(consumer_hash, 23));
  return a;
}

// The sum of `count(shard)` over the shards 0..mask, each read under its lock.
template <class Count>
std::size_t sum_over_shards(MemoryRecorderShard* shards, std::size_t mask, Count count) {
  std::size_t n = 0;
  for (std::size_t i = 0; i <= mask; ++i) {
    std::lock_guard lock(shards[i].mutex);
    n += count(shards[i]);
  }
  return n;
}

}  // namespace
}  // namespace detail

using detail::Address;
using detail::ClaimState;
using detail::MemoryRecorderShard;
using detail::SlotKey;
using detail::TextKey;
using detail::TextKeyView;
using detail::Ticks;

InMemoryIdempotencyRecorder::InMemoryIdempotencyRecorder(InMemoryRecorderOptions options)
    : clock_(options.clock ? std::move(options.clock) : system_clock()) {
  if (options.shards == 0) throw ConfigError("InMemoryRecorderOptions::shards must be at least 1");
  if (options.shards > (std::size_t{1} << 16)) {
    throw ConfigError("InMemoryRecorderOptions::shards must be at most 65536");
  }
  if (options.expected_markers > (std::size_t{1} << 36)) {
    throw ConfigError("InMemoryRecorderOptions::expected_markers must be at most 2^36, got " +
                      std::to_string(options.expected_markers));
  }
  detail::hash_key();  // drawn now, not inside the first call under a shard's lock
  const std::size_t count = std::bit_ceil(options.shards);
  shard_mask_ = count - 1;
  pages_ = std::make_unique<detail::PagePool>();
  shards_ = std::make_unique<MemoryRecorderShard[]>(count);
  for (std::size_t i = 0; i < count; ++i)
    shards_[i].markers.use_pages(pages_.get());
  if (options.expected_markers > 0) {
    // Each shard's share, with room for the spread of a hash over the shards (a few standard
    // deviations of a share of thousands is well under an eighth of it).
    const std::size_t share = options.expected_markers / count;
    const std::size_t per_shard = share + share / 8 + 64;
    for (std::size_t i = 0; i < count; ++i)
      shards_[i].markers.reserve(per_shard);
  }
}

InMemoryIdempotencyRecorder::~InMemoryIdempotencyRecorder() = default;

MemoryRecorderShard& InMemoryIdempotencyRecorder::shard_for(std::size_t hash) const noexcept {
  // The high bits: the in-shard table's index comes from a product of its own.
  return shards_[(hash >> 48) & shard_mask_];
}

bool InMemoryIdempotencyRecorder::do_is_processed(std::string_view consumer,
                                                  std::string_view event_id) {
  const Address a = detail::address(consumer, event_id);
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  const std::uint32_t* index = shard.find_consumer(consumer);
  if (index == nullptr) return false;
  return shard.markers.contains(SlotKey{&a.id, *index});
}

void InMemoryIdempotencyRecorder::do_mark_processed(std::string_view consumer,
                                                    std::string_view event_id) {
  const Address a = detail::address(consumer, event_id);
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  const std::uint32_t index = shard.intern_consumer(consumer);
  // The first marker wins: a repeated mark must not make an old event look new to purge(), and
  // it reads no clock.
  shard.markers.insert(SlotKey{&a.id, index},
                       [this] { return detail::to_ticks(clock_->wall_now()); });
}

Claim InMemoryIdempotencyRecorder::do_claim(std::string_view consumer, std::string_view event_id,
                                            Millis lease) {
  const Address a = detail::address(consumer, event_id);
  const Ticks now = detail::to_ticks(clock_->wall_now());
  const Ticks lease_until = detail::add_saturating(now, lease);
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  const std::uint32_t index = shard.intern_consumer(consumer);
  Claim result;
  if (shard.markers.contains(SlotKey{&a.id, index})) {
    result.status = Claim::Status::processed;
    return result;
  }
  auto it = shard.claims.find(TextKeyView{index, event_id});
  if (it != shard.claims.end() && it->second.lease_until > now) {
    result.status = Claim::Status::in_progress;
    result.lease_until = detail::from_ticks(it->second.lease_until);
    return result;
  }
  // Taken under the shard lock, so for this key tokens are handed out in increasing order.
  const std::uint64_t token = next_token_.fetch_add(1, std::memory_order_relaxed);
  if (it != shard.claims.end()) {
    it->second = ClaimState{token, lease_until};
    result.took_over = true;
  } else {
    shard.claims.emplace(TextKey{index, std::string(event_id)}, ClaimState{token, lease_until});
  }
  result.status = Claim::Status::acquired;
  result.token = token;
  result.lease_until = detail::from_ticks(lease_until);
  return result;
}

bool InMemoryIdempotencyRecorder::do_complete(std::string_view consumer, std::string_view event_id,
                                              std::uint64_t token) {
  const Address a = detail::address(consumer, event_id);
  const Ticks now = detail::to_ticks(clock_->wall_now());
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  const auto held = shard.held_claim(consumer, event_id, token);
  if (!held) return false;
  shard.claims.erase(held->claim);
  shard.markers.insert(SlotKey{&a.id, held->index}, [now] { return now; });
  return true;
}

bool InMemoryIdempotencyRecorder::do_release(std::string_view consumer, std::string_view event_id,
                                             std::uint64_t token) {
  const Address a = detail::address(consumer, event_id);
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  const auto held = shard.held_claim(consumer, event_id, token);
  if (!held) return false;
  shard.claims.erase(held->claim);
  return true;
}

bool InMemoryIdempotencyRecorder::do_renew(std::string_view consumer, std::string_view event_id,
                                           std::uint64_t token, Millis lease) {
  const Address a = detail::address(consumer, event_id);
  const Ticks now = detail::to_ticks(clock_->wall_now());
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  const auto held = shard.held_claim(consumer, event_id, token);
  if (!held) return false;
  held->claim->second.lease_until = detail::add_saturating(now, lease);
  return true;
}

std::size_t InMemoryIdempotencyRecorder::do_purge(std::chrono::system_clock::duration older_than,
                                                  const PurgeProgress& progress) {
  const Ticks now = detail::to_ticks(clock_->wall_now());
  const Ticks cutoff = detail::add_saturating(now, -older_than);
  std::size_t removed = 0;
  // One shard is one chunk: each is locked only while it is swept.
  for (std::size_t i = 0; i <= shard_mask_; ++i) {
    auto& shard = shards_[i];
    std::size_t in_shard = 0;
    {
      std::lock_guard lock(shard.mutex);
      in_shard += shard.markers.erase_older(cutoff);
      std::erase_if(shard.claims, [&](const auto& c) { return c.second.lease_until < cutoff; });
    }
    removed += in_shard;
    if (in_shard > 0 && progress) progress(removed);
  }
  return removed;
}

std::vector<ConsumerCounts> InMemoryIdempotencyRecorder::do_consumer_counts() {
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
    shard.markers.for_each_consumer([&](std::uint32_t index) { ++counts[index]->processed; });
    for (const auto& [key, claim] : shard.claims) {
      if (claim.lease_until > now) ++counts[key.consumer]->in_progress;
    }
  }
  std::vector<ConsumerCounts> result;
  for (auto& [name, counts] : by_name) {
    // Interned by a claim that was then released, with nothing left: not worth a line.
    if (counts.processed > 0 || counts.in_progress > 0) result.push_back(std::move(counts));
  }
  return result;
}

std::size_t InMemoryIdempotencyRecorder::do_count_purgeable(
    std::chrono::system_clock::duration older_than) {
  const Ticks cutoff = detail::add_saturating(detail::to_ticks(clock_->wall_now()), -older_than);
  return detail::sum_over_shards(shards_.get(), shard_mask_, [&](MemoryRecorderShard& shard) {
    return shard.markers.count_older(cutoff);
  });
}

MarkerInspection InMemoryIdempotencyRecorder::do_inspect(std::string_view consumer,
                                                         std::string_view event_id) {
  const Address a = detail::address(consumer, event_id);
  const Ticks now = detail::to_ticks(clock_->wall_now());
  auto& shard = shard_for(a.hash);
  std::lock_guard lock(shard.mutex);
  MarkerInspection result;
  const std::uint32_t* index = shard.find_consumer(consumer);
  if (index == nullptr) return result;
  if (auto at = shard.markers.marked_at(SlotKey{&a.id, *index})) {
    result.processed = true;
    result.processed_at = detail::from_ticks(*at);
  }
  auto it = shard.claims.find(TextKeyView{*index, event_id});
  if (it != shard.claims.end()) {
    result.claim = MarkerInspection::OpenClaim{
        it->second.token, detail::from_ticks(it->second.lease_until), it->second.lease_until > now};
  }
  return result;
}

std::size_t InMemoryIdempotencyRecorder::marker_count() const {
  return detail::sum_over_shards(shards_.get(), shard_mask_,
                                 [](MemoryRecorderShard& shard) { return shard.markers.size(); });
}

std::size_t InMemoryIdempotencyRecorder::claim_count() const {
  return detail::sum_over_shards(shards_.get(), shard_mask_,
                                 [](MemoryRecorderShard& shard) { return shard.claims.size(); });
}

}  // namespace idem
