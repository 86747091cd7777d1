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
};

// Returns the process exit code (0: every check passed).
int run_demo(const DemoOptions& options);
int run_demo_consumer(const ConsumerOptions& options);

}  // namespace idem::cli
