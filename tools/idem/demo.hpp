// `idem demo`: the crash-and-replay demonstration, on the embedded SQLite default or on any
// recorder URL (--store, see idem/open.hpp). The parts live in tools/idem/demo/, one file per
// concept (demo/demo.cpp runs them in order).
//
// A producer writes a stream of events with duplicates to a file-backed queue (a stand-in for a
// broker with at-least-once delivery: a consumer acknowledges by committing its offset every
// few messages) — or, with --broker amqp://..., publishes them to RabbitMQ, where the consumer
// acknowledges each message after its handler returned and the broker redelivers what a killed
// consumer had not acknowledged. A consumer *process* is killed with SIGKILL in the middle of a
// handler and restarted; it resumes from its last committed offset, so the backlog since that
// offset is redelivered. The demo then counts deliveries, duplicates dropped, redeliveries and side
// effects from what the processes left on disk, and checks each mode keeps its promise: in
// transactional and exclusive mode every distinct event had its side effect once; in
// check_then_mark mode (killed between the side effect and its marker) the killed event ran
// twice, which that mode admits.
//
// With --hops 2 the first consumer (billing, transactional mode) also publishes `order.charged`
// for each order through the outbox (idem/outbox.hpp), in the transaction of its marker and
// ledger row. A relay *process* (an OutboxRelay) then publishes the outbox rows to the second
// hop's queue (a second file, or RabbitMQ with --broker) and is killed with SIGKILL once after a
// batch was published and before its rows were deleted, so that batch goes out again; a second
// consumer process (shipping) consumes `order.charged` with its own markers and ledger and is
// killed mid-handler too. The checks then cover both hops: every order charged once, every
// charge shipped once, the outbox left empty.
//
// What the demo leaves: nothing that was there before is changed or deleted. A --dir must be new,
// empty or an earlier demo's; a --store must hold no data (unless --allow-nonempty-store), and the
// demo writes into it only under a namespace of its own (consumer names, a ledger table, a
// PostgreSQL schema, a Redis key prefix) that it removes at the end. The temporary work dir, the
// namespace and the run's RabbitMQ queues go on every way out (success, failure, SIGINT, SIGTERM,
// SIGPIPE) unless --keep; child processes never outlive the demo.
#pragma once

#include <cstdint>
#include <string>

namespace idem::cli {

struct DemoOptions {
  std::uint64_t events = 10000;        // distinct events published
  double duplicate_ratio = 0.3;        // extra copies published, as a share of `events`
  std::uint64_t ack_every = 64;        // the consumer commits its offset every N deliveries
  double kill_at = 0.45;               // kill the first consumer at this share of the stream
  std::string mode = "transactional";  // handler mode: transactional | exclusive | check_then_mark
  // Where in the handler the consumer is killed: "before-effect", "after-effect" or "" (the
  // mode's own: after the effect in check_then_mark and transactional, before it in exclusive).
  std::string kill_point;
  std::string dir;                    // work dir; default: a new temp dir (removed unless --keep)
  bool keep = false;                  // keep the work dir (and the store namespace)
  bool reuse_dir = false;             // --dir may hold files the demo did not make
  std::uint64_t seed = 42;            // for the duplicate pattern
  std::string store;                  // recorder URL; default: sqlite file idem.db in the work dir
  bool allow_nonempty_store = false;  // --store may already hold markers, records or rows
  std::string broker;                 // amqp:// URL: deliver through RabbitMQ (default: the file)
  int hops = 1;                       // 2: billing -> outbox -> relay -> shipping
};

// The consumer process gets the recorder URL in the environment variable IDEM_DEMO_STORE (not
// on its command line, where other users' `ps` would show a password).
inline constexpr const char* kDemoStoreVariable = "IDEM_DEMO_STORE";
// Likewise the broker URL (--broker), in IDEM_DEMO_BROKER.
inline constexpr const char* kDemoBrokerVariable = "IDEM_DEMO_BROKER";
// For tests: "PHASE" or "PHASE:SIGNAL" (INT, TERM or PIPE; default INT) makes `idem demo` raise
// that signal against itself when it enters the named phase (demo/supervisor.hpp lists them).
inline constexpr const char* kDemoRaiseAtVariable = "IDEM_DEMO_RAISE_AT";

struct ConsumerOptions {
  std::string dir;
  std::string consumer = "billing";  // the consumer name markers are recorded under
  std::string mode = "transactional";
  std::string kill_point = "after-effect";  // where the stall falls: before-/after-effect
  std::string ledger;                       // transactional mode: the ledger table
  std::uint64_t ack_every = 64;
  std::int64_t stall_at = -1;  // stall inside the handler at this sequence number (first time)
  int notify_fd = -1;          // write one byte here when stalled
  int hop = 1;                 // 1: billing's order.paid queue; 2: shipping's order.charged queue
  bool outbox = false;         // hop 1 of --hops 2: publish order.charged through the outbox
};

// The demo's relay process (--hops 2): publishes the outbox rows of the recorder's database to
// the second hop's queue file (and, with IDEM_DEMO_BROKER, to RabbitMQ), then exits when the
// outbox is empty.
struct RelayProcessOptions {
  std::string dir;
  std::string exchange;        // the RabbitMQ exchange of the second hop (with a broker)
  std::int64_t stall_at = -1;  // stall after the pass that brought the published rows to this
  int notify_fd = -1;          // write one line here when stalled
};

// Returns the process exit code: 0 when every check passed, 1 when one failed, 128 + the signal
// number when SIGINT, SIGTERM or SIGPIPE stopped it (after cleaning up); usage and store errors
// are thrown (main() maps them to 2 and 3).
int run_demo(const DemoOptions& options);
int run_demo_consumer(const ConsumerOptions& options);
int run_demo_relay(const RelayProcessOptions& options);

}  // namespace idem::cli
