// InMemoryIdempotencyRecorder: an IdempotencyRecorder that lives in one process's memory.
//
// For a single process (and tests). Markers survive as long as the recorder object does; a
// restart forgets everything, so pair it with a transport that does not redeliver across
// restarts, or use a durable recorder (SQLite) instead.
//
// Guarantees:
//   * check/mark as in recorder.hpp; marking twice keeps the first marker and its timestamp.
//   * claims (supports_claims() == true): claim() is atomic per (consumer, event_id); tokens come
//     from one counter per recorder, so they only grow for every key; a claim whose
//     lease_until <= now is taken over. complete()/release()/renew() act only with the current
//     token. A lapsed claim that nobody has taken over yet still belongs to its owner: its
//     complete() and renew() succeed.
//   * no transactions (supports_transactions() == false): there is no database to share with the
//     handler, so transactional mode needs a SQL recorder.
//   * marker timestamps and leases come from the injected Clock; purge(older_than) removes
//     markers whose timestamp is strictly older than now - older_than, and claims whose lease
//     ended before that instant.
//
// Cost: the state is split into shards by a hash of (consumer, event_id), each a mutex and one
// open-addressing table of 32-byte markers with a byte of hash bits per slot beside it, so
// threads working on different events rarely contend, and checking a new id reads those bytes
// (about 1/32 of the table, which stays in the CPU's cache far longer) instead of the markers. Each
// call validates the consumer name and the event id once and never allocates to look up. Ids of
// 32 lowercase hex digits (what new_event_id() makes) and dashed lowercase UUIDs are packed into
// the marker's 16 bytes, and any other id of up to 16 bytes is kept there as it is; a longer one
// (up to kMaxKeyLength bytes) is copied once into the shard's arena when it is marked (an arena's
// chunks of 256 KiB and more are cut from 2 MiB pages that the shards share, and tables of 2 MiB
// and more are mapped whole; both ask for transparent huge pages). Only adding a marker or a
// claim reads the clock; is_processed() and a repeated mark do not. There is no capacity bound:
// call purge() to reclaim space (it also compacts the arena and gives back the pages nobody
// uses). A table that fills doubles and moves every marker under its shard's lock;
// expected_markers sizes them up front when the volume is known, as std::unordered_set::reserve
// does. The hashes are keyed with a value drawn at random once per process, so nobody can choose
// ids that share a hash (as they can against an unkeyed one) to pile them up in one shard and
// make every lookup there walk them all.
//
// Thread-safety: all members are safe to call from any number of threads.
//
// fork(): a recorder made before fork() is a copy in the child, which may destroy it; it is the
// parent's, though (docs/guarantees.md §9): make a new one in the child.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"
#include "idem/recorder.hpp"

namespace idem {

struct InMemoryRecorderOptions {
  // Source of marker timestamps and lease deadlines. Default (null): idem::system_clock().
  std::shared_ptr<Clock> clock = nullptr;
  // Number of lock stripes; rounded up to a power of two. Default 64. 0 is a ConfigError.
  std::size_t shards = 64;
  // How many markers the recorder is expected to hold, as std::unordered_set::reserve: the
  // tables are allocated (and their memory touched) for that many at construction, so marking
  // up to it never stops to grow a table and move every marker, and purge() does not shrink them
  // below it. That takes 53 to 107 bytes per expected marker (the tables' sizes are powers of
  // two), held for the recorder's life; text ids that are neither 32-hex nor UUIDs still take
  // arena space as they are marked. At most 2^36 (a ConfigError beyond). Default 0: the tables
  // start small and double as needed.
  std::size_t expected_markers = 0;
};

namespace detail {
struct MemoryRecorderShard;
class PagePool;
}  // namespace detail

class InMemoryIdempotencyRecorder final : public IdempotencyRecorder {
 public:
  explicit InMemoryIdempotencyRecorder(InMemoryRecorderOptions options = {});
  ~InMemoryIdempotencyRecorder() override;

  InMemoryIdempotencyRecorder(const InMemoryIdempotencyRecorder&) = delete;
  InMemoryIdempotencyRecorder& operator=(const InMemoryIdempotencyRecorder&) = delete;

  // How many markers / live-or-lapsed claims are held right now (a snapshot; other threads may
  // change it at once).
  std::size_t marker_count() const;
  std::size_t claim_count() const;

 private:
  bool do_is_processed(std::string_view consumer, std::string_view event_id) override;
  void do_mark_processed(std::string_view consumer, std::string_view event_id) override;
  // is_processed_many / mark_processed_many: the base class's loop over the calls above (each a
  // shard lock and a hash lookup). A per-shard batch path was measured and bought nothing.

  RecorderCapabilities do_capabilities() const noexcept override { return {.claims = true}; }
  Claim do_claim(std::string_view consumer, std::string_view event_id, Millis lease) override;
  bool do_complete(std::string_view consumer, std::string_view event_id,
                   std::uint64_t token) override;
  bool do_release(std::string_view consumer, std::string_view event_id,
                  std::uint64_t token) override;
  bool do_renew(std::string_view consumer, std::string_view event_id, std::uint64_t token,
                Millis lease) override;
  // One chunk per shard: progress is called after each shard that lost markers.
  std::size_t do_purge(std::chrono::system_clock::duration older_than,
                       const PurgeProgress& progress) override;
  std::vector<ConsumerCounts> do_consumer_counts() override;
  std::size_t do_count_purgeable(std::chrono::system_clock::duration older_than) override;
  MarkerInspection do_inspect(std::string_view consumer, std::string_view event_id) override;

  detail::MemoryRecorderShard& shard_for(std::size_t hash) const noexcept;

  std::shared_ptr<Clock> clock_;
  std::size_t shard_mask_;
  std::unique_ptr<detail::PagePool> pages_;  // before shards_: their arenas hold its pages
  std::unique_ptr<detail::MemoryRecorderShard[]> shards_;
  std::atomic<std::uint64_t> next_token_{1};
};

}  // namespace idem
