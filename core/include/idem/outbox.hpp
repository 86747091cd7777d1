// Outbox: follow-up events of transactional handlers, committed with the marker and relayed after.
//
// A transactional handler (HandlerMode::transactional) given HandlerOptions::outbox writes every
// event it publishes through its BusProxy into the outbox table of the recorder's database, in
// the SAME transaction as the marker and the handler's own writes: commit → marker, business rows
// and follow-ups together; rollback (a throw, a crash before COMMIT) → none of them. An
// OutboxRelay then reads committed rows in commit order, publishes them through an
// OutboxPublisher (the in-process Bus, RabbitMQ with publisher confirms) and deletes a row only
// after the publisher confirmed it. A crash between the confirm and the delete publishes the
// same event (same id) again; downstream idem consumers drop it by id. docs/outbox.md.
//
// Follow-up ids: an event published with an empty id gets follow_up_id(consumer, incoming id,
// n) — n = 0, 1, ... counts the handler run's publishes — so every re-run of a handler (a
// rolled-back attempt, a redelivery) produces the same ids. An event with an id keeps it.
//
// Backends: idem::sqlite::SqliteOutbox and idem::postgres::PostgresOutbox implement Outbox on
// the recorder's database (each creates its table `idem_outbox` when missing); open_outbox(url)
// (idem/open.hpp) opens one from a store URL.
//
// Thread-safety: Outbox implementations and OutboxRelay may be used from any thread.
// OutboxPublisher implementations state their own (the relay calls one from one thread).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/clock.hpp"
#include "idem/event.hpp"
#include "idem/sql.hpp"

namespace idem {

class Bus;

// The name-based (UUIDv5-style: SHA-1 over idem's namespace UUID and the name, version 5 and the
// RFC 4122 variant set) id of the `sequence`-th follow-up published by `consumer` while handling
// `incoming_event_id`, as 32 lowercase hex digits. The same arguments always give the same id;
// different arguments give different ids (the name encodes each part's length).
std::string follow_up_id(std::string_view consumer, std::string_view incoming_event_id,
                         std::uint64_t sequence);

// One committed outbox row.
struct OutboxRow {
  std::int64_t seq = 0;         // commit order (per database); ascending = older
  std::string consumer;         // the handler's consumer that published it
  std::string source_event_id;  // the event whose handling published it
  Event event;                  // the follow-up itself (id, type, payload, headers, timestamp)
  int attempts = 0;             // refusals so far
  std::string last_error;       // the last refusal's reason ("" when none)
  WallTime created_at{};        // when the transaction wrote it (the database's clock)
};

// What a publisher did with one row: confirmed; refused (with a reason); or neither — not
// sent or its outcome unknown (a failure part way through a batch): the row stays as it is and
// goes out again in a later pass, not counted as a refusal.
struct PublishVerdict {
  bool confirmed = false;  // the broker took responsibility: the row may go
  std::string refusal;     // not confirmed: why (counted as an attempt; parked past the limit)
};

// Sends rows to a broker. publish() returns one verdict per row, in order. Throw (any exception)
// when the broker cannot be reached or the outcome is unknown: no row is then deleted or counted
// as refused, and the relay tries the batch again later (downstream drops what was stored).
class OutboxPublisher {
 public:
  virtual ~OutboxPublisher() = default;
  virtual std::vector<PublishVerdict> publish(std::span<const OutboxRow> rows) = 0;
};

// Publishes to an in-process Bus (Bus::publish enqueues: confirmed once enqueued). An event the
// bus rejects (invalid id, empty type) is refused with the bus's reason. The Bus must outlive
// the publisher. Thread-safe.
class BusOutboxPublisher final : public OutboxPublisher {
 public:
  explicit BusOutboxPublisher(Bus& bus) : bus_(bus) {}
  std::vector<PublishVerdict> publish(std::span<const OutboxRow> rows) override;

 private:
  Bus& bus_;
};

// What one relay pass did.
struct RelayBatchResult {
  std::size_t taken = 0;      // rows read for publishing
  std::size_t published = 0;  // confirmed and deleted
  std::size_t refused = 0;    // refused (attempts + 1), still queued
  std::size_t parked = 0;     // refused for the max_attempts-th time: parked with their reason
  std::size_t deferred = 0;   // neither confirmed nor refused: left for a later pass
  bool busy = false;          // another relay held the outbox (SQLite) or every ready consumer
};

// Operator view of an outbox.
struct OutboxStats {
  std::uint64_t depth = 0;   // rows waiting to be relayed (not parked)
  std::uint64_t parked = 0;  // rows parked (dead-lettered) after repeated refusals
  // Age of the oldest waiting row (database clock), absent when none waits.
  std::optional<std::chrono::milliseconds> oldest_age;
};

// Rows one relay pass took from an outbox (Outbox::do_take), held by that pass alone until
// settle() or destruction: no other relay takes them meanwhile. What holds them is the backend's
// (SQLite: a file lock; PostgreSQL: an open transaction with row and advisory locks). Destroying a
// batch that was not settled releases its rows unchanged (the publisher threw, the pass failed).
// Used by one thread (the relay pass that took it).
class OutboxBatch {
 public:
  // A refused row: attempts + 1, last_error = reason, and parked when `park` (Outbox decides:
  // at the max_attempts-th refusal).
  struct Refusal {
    std::int64_t seq = 0;
    std::string reason;
    bool park = false;
  };

  virtual ~OutboxBatch() = default;

  // Deletes the `confirmed` rows and records the `refused` ones, all in one transaction, then
  // releases the batch. Rows in neither list stay as they were. Called at most once, with seqs
  // of `rows` only.
  virtual void settle(std::span<const std::int64_t> confirmed,
                      std::span<const Refusal> refused) = 0;

  std::vector<OutboxRow> rows;  // waiting rows, oldest first (per consumer, in commit order)
  bool busy = false;            // another relay held what this pass needed (rows is then empty)

 protected:
  OutboxBatch() = default;
};

// The outbox of one database. A backend implements it (SqliteOutbox, PostgresOutbox).
//
// Its public calls are non-virtual: each checks its arguments once (InvalidKey for a consumer,
// source event id or event id that validate_key() rejects; InvalidArgument for an event without
// type, max_rows or max_attempts below 1, a negative timeout) and then calls the protected do_*
// virtual a backend implements, so a backend only ever sees valid arguments. The relay pass
// itself (take, publish, settle; which rows are deleted, refused, parked or left alone) lives
// here, once: a backend supplies the SQL steps do_take() and OutboxBatch::settle(), plus
// do_append, do_stats, do_parked and do_unpark (and do_wait_for_rows when its database can
// notify). idem/testing/outbox_conformance.hpp checks an implementation against this contract.
class Outbox {
 public:
  virtual ~Outbox() = default;

  // Writes `event` (its id already final) as a row of (consumer, source event) through `tx`, the
  // open transaction of a recorder on the same database. Called by the handler; throws what the
  // statement throws (the handler's transaction then rolls back).
  void append(SqlTransaction& tx, std::string_view consumer, std::string_view source_event_id,
              const Event& event);

  // Called after a transaction that appended rows committed: wakes this process's relays.
  void notify_committed();

  // One relay pass: takes up to `max_rows` waiting rows in commit order, exclusively (no other
  // relay publishes them meanwhile; per consumer, rows go out in order), hands them to
  // `publisher`, deletes the confirmed ones, counts refusals and parks a row at its
  // `max_attempts`-th refusal; rows neither confirmed nor refused stay as they were. If the
  // publisher throws (or returns a verdict count other than the row count: InvalidArgument),
  // nothing changes and the exception propagates.
  RelayBatchResult relay_batch(OutboxPublisher& publisher, std::size_t max_rows, int max_attempts);

  // Waits until rows may be waiting: a commit in this process (notify_committed), a
  // notification from the database (PostgreSQL LISTEN/NOTIFY), or `timeout` (polling).
  // Returns true when woken before the timeout.
  bool wait_for_rows(std::chrono::milliseconds timeout);

  OutboxStats stats() { return do_stats(); }
  // Parked rows, oldest first, at most `limit` (none for 0).
  std::vector<OutboxRow> parked(std::size_t limit);
  // Puts parked rows back in the queue (attempts reset, last_error kept); returns how many, and
  // wakes this process's relays when there were any.
  std::size_t unpark();

 protected:
  Outbox() = default;
  // Wakes wait_for_rows() (for subclasses whose database notifies them).
  void wake();

  // What a backend implements (protected, so that an override can call the base's default).
  virtual void do_append(SqlTransaction& tx, std::string_view consumer,
                         std::string_view source_event_id, const Event& event) = 0;
  // Up to `max_rows` waiting (not parked) rows, oldest first, held exclusively by the returned
  // batch; an empty batch when none waits, busy when another relay holds them.
  virtual std::unique_ptr<OutboxBatch> do_take(std::size_t max_rows) = 0;
  // Default: waits for notify_committed()/wake() or the timeout.
  virtual bool do_wait_for_rows(std::chrono::milliseconds timeout);
  virtual OutboxStats do_stats() = 0;
  virtual std::vector<OutboxRow> do_parked(std::size_t limit) = 0;
  virtual std::size_t do_unpark() = 0;

 private:
  std::mutex wake_mutex_;
  std::condition_variable wake_cv_;
  bool woken_ = false;  // guarded by wake_mutex_: a wake not yet consumed by wait_for_rows()
};

struct OutboxRelayOptions {
  // Rows per pass. Default 256; at least 1.
  std::size_t batch_size = 256;
  // Longest wait between passes when nothing woke the relay. Default 1 s; positive.
  std::chrono::milliseconds poll_interval = std::chrono::seconds(1);
  // A row is parked at this many refusals. Default 5; at least 1.
  int max_attempts = 5;
  // Wait after a publisher failure (broker down) before trying again. Default 200 ms; >= 0.
  std::chrono::milliseconds failure_backoff = std::chrono::milliseconds(200);
  // Called on the relay's thread with each publisher failure (for logging). Default none.
  std::function<void(const std::exception&)> on_failure = nullptr;
};

struct OutboxRelayStats {
  std::uint64_t passes = 0;
  std::uint64_t published = 0;
  std::uint64_t refused = 0;
  std::uint64_t parked = 0;
  std::uint64_t failures = 0;  // passes whose publisher (or database) threw
};

// Moves committed outbox rows to a publisher. run_once()/drain() work on the caller's thread;
// start() runs passes on a background thread until stop() (or destruction): after each pass that
// found rows it goes on at once, otherwise it waits in Outbox::wait_for_rows(poll_interval).
// Several relays (threads or processes) may work on one outbox: the outbox keeps them from
// publishing a row twice at once.
//
// Thread-safety: every member may be called from any thread; run_once()/drain() must not be
// called while the background thread runs (InvalidArgument). The outbox and publisher must
// outlive the relay.
class OutboxRelay {
 public:
  // ConfigError for bad options; InvalidArgument for a null outbox or publisher.
  OutboxRelay(std::shared_ptr<Outbox> outbox, std::shared_ptr<OutboxPublisher> publisher,
              OutboxRelayOptions options = {});
  ~OutboxRelay();
  OutboxRelay(const OutboxRelay&) = delete;
  OutboxRelay& operator=(const OutboxRelay&) = delete;

  // One pass; the publisher's exceptions propagate.
  RelayBatchResult run_once();
  // Passes until one finds no row to publish (or only busy ones) or `max_passes` ran; returns
  // rows published. The publisher's exceptions propagate.
  std::size_t drain(std::size_t max_passes = 1'000'000);

  void start();
  // Stops the background thread after its current pass. Idempotent.
  void stop();

  OutboxRelayStats stats() const;

 private:
  void loop(std::stop_token stop);
  void count(const RelayBatchResult& result);

  std::shared_ptr<Outbox> outbox_;
  std::shared_ptr<OutboxPublisher> publisher_;
  OutboxRelayOptions options_;
  mutable std::mutex mutex_;
  OutboxRelayStats stats_;  // guarded by mutex_
  std::jthread thread_;
};

}  // namespace idem
