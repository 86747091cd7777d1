// `idem demo`: the crash-and-replay demonstration, on the embedded SQLite default or on any
// recorder URL (--store, see idem/open.hpp).
//
// A producer writes a stream of events with duplicates to a file-backed queue (a stand-in for a
// broker with at-least-once delivery: a consumer acknowledges by committing its offset every
// few messages) — or, with --broker amqp://..., publishes them to RabbitMQ, where the consumer
// acknowledges each message after its handler returned and the broker redelivers what a killed
// consumer had not acknowledged. A consumer *process* is killed with SIGKILL in the middle of a
// handler and restarted; it resumes from its last committed offset, so the backlog since that
// offset is redelivered. The demo then counts deliveries, duplicates dropped, redeliveries and side
// effects from what the processes left on disk, and checks that every distinct event had its
// side effect exactly once.
//
// With --hops 2 the first consumer (billing, transactional mode) also publishes `order.charged`
// for each order through the outbox (idem/outbox.hpp), in the transaction of its marker and
// ledger row. A relay *process* (an OutboxRelay) then publishes the outbox rows to the second
// hop's queue (a second file, or RabbitMQ with --broker) and is killed with SIGKILL once after a
// batch was published and before its rows were deleted, so that batch goes out again; a second
// consumer process (shipping) consumes `order.charged` with its own markers and ledger and is
// killed mid-handler too. The checks then cover both hops: every order charged once, every
// charge shipped once, the outbox left empty.
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
  std::string dir;                     // work dir; default: a new temp dir (removed unless --keep)
  bool keep = false;                   // keep the work dir
  std::uint64_t seed = 42;             // for the duplicate pattern
  std::string store;                   // recorder URL; default: sqlite file idem.db in the work dir
  std::string broker;                  // amqp:// URL: deliver through RabbitMQ (default: the file)
  int hops = 1;                        // 2: billing -> outbox -> relay -> shipping
};

// The consumer process gets the recorder URL in the environment variable IDEM_DEMO_STORE (not
// on its command line, where other users' `ps` would show a password).
inline constexpr const char* kDemoStoreVariable = "IDEM_DEMO_STORE";
// Likewise the broker URL (--broker), in IDEM_DEMO_BROKER.
inline constexpr const char* kDemoBrokerVariable = "IDEM_DEMO_BROKER";

struct ConsumerOptions {
  std::string dir;
  std::string consumer = "billing";  // the consumer name markers are recorded under
  std::string mode = "transactional";
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

// Returns the process exit code (0: every check passed).
int run_demo(const DemoOptions& options);
int run_demo_consumer(const ConsumerOptions& options);
int run_demo_relay(const RelayProcessOptions& options);

}  // namespace idem::cli
