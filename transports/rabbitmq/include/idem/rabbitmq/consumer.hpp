// Consumer: delivers events from a RabbitMQ queue to an idem EventHandler, at least once.
//
// Topology (declared, idempotently, on every connect):
//   * the exchange ConsumerOptions::exchange (durable, of exchange_type);
//   * a durable QUORUM queue named queue_name (default "idem.<consumer_name>"), bound to the
//     exchange with binding_key — one queue per consumer name, so under fanout every consumer
//     name gets every event once;
//   * a durable classic dead-letter queue dead_letter_queue (default "<queue_name>.dlq").
// Quorum queues count deliveries themselves (the `x-delivery-count` header: how often the
// message was returned to the queue — nacked, or unacked when a connection dropped), which is
// what bounds redelivery here; classic queues only say "redelivered". docs/rabbitmq.md has why.
//
// Deliveries are handled in batches: the consumer waits for one, takes the ones that have
// already arrived behind it (up to batch_size, never waiting for more) and passes the
// well-formed ones to EventHandler::handle_batch in delivery order. An IdempotentHandler in
// check_then_mark mode checks the whole batch with one recorder query and marks its successes
// with one write, so dedup costs two recorder round trips per batch instead of per event (the
// crash-before-mark window then covers the batch: handler.hpp). Other handlers and modes run
// each event in turn. Once the batch returns, each delivery is settled:
//   * no message_id, or one that is not a valid idem key → dead-lettered as malformed (before
//     the batch runs);
//   * the handler returned (processed or duplicate) → acked, AFTER the batch returned (one
//     basic.ack with `multiple` for the batch's acks, sent after its failures are settled);
//   * it throws DecodeError or InvalidKey (the payload cannot be decoded: retrying cannot help)
//     → dead-lettered as malformed;
//   * it throws AlreadyInProgress (exclusive mode: another delivery holds the claim) → after
//     in_progress_backoff, basic.nack(requeue) — not counted as a failure, but bounded by
//     max_in_progress_requeues (then dead-lettered);
//   * it throws anything else → basic.nack(requeue), until the message has failed
//     max_deliveries times; then dead-lettered with the exception's what() as reason.
// Dead-lettering publishes a copy (same properties and body, plus headers x-idem-reason,
// x-idem-consumer, x-idem-routing-key, x-idem-deliveries) to the dead-letter queue, waits for the
// broker's confirm, then acks the original. If that publish fails the original is requeued.
//
// Connection loss (broker restart, network): the consumer reconnects with backoff
// (ConnectionOptions), re-declares and resumes. Messages that were delivered but not acked are
// delivered again by the broker; an IdempotentHandler drops the ones it already marked, so their
// side effects do not run twice (see handler.hpp for the windows each mode leaves).
//
// Follow-up events a handler publishes through its BusProxy go to ConsumerOptions::exchange
// over the consumer's second connection, with confirms, at once (in transactional mode the
// handler hands them over only after its commit). A failed follow-up publish throws out of the
// handler's publish call.
//
// Threads: while a batch runs, the consumer receives the next deliveries (ConsumerOptions::
// pipeline, on by default): the handler is then called on a thread the consumer owns — one call
// at a time, in delivery order, never two batches at once — and the run call returns only after
// the batch in hand is settled, so the handler is not used after it returns.
//
// Thread-safety: run(), run_until(), run_for() and poll_once() must be called from one thread at
// a time (the consumer owns two rabbitmq-c connections, which are not thread-safe). stop() and
// stats() may be called from any thread; stop() only stores to a lock-free atomic, so it is
// async-signal-safe.
//
// fork(): an object made before fork() belongs to the parent. In a child its calls throw
// ConfigError, and it must not be destroyed there either (its destructor would join the parent's
// threads and close connections the parent still uses): leak it, e.g. end the child with _exit(),
// and make new objects in the child (docs/guarantees.md §9).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "idem/clock.hpp"
#include "idem/handler.hpp"
#include "idem/rabbitmq/options.hpp"
#include "idem/rabbitmq/publisher.hpp"

namespace idem::rabbitmq {

struct ConsumerOptions {
  // The consumer name; names the queue. Required: a valid idem key. It should equal the
  // handler's consumer() so markers and queue belong together (not enforced).
  std::string consumer_name;
  // Exchange the queue is bound to (and follow-up events go to). Default "idem.events".
  std::string exchange = "idem.events";
  // Type the exchange is declared with. Default topic.
  ExchangeType exchange_type = ExchangeType::topic;
  // Binding of the queue; ignored by fanout exchanges. Default "#" (every event).
  std::string binding_key = "#";
  // Queue name. Default "" → "idem.<consumer_name>". At most 255 bytes.
  std::string queue_name;
  // Dead-letter queue. Default "" → "<queue_name>.dlq". At most 255 bytes.
  std::string dead_letter_queue;
  // Unacknowledged deliveries the broker may send ahead (basic.qos). Default 16; 1..65535.
  int prefetch = 16;
  // Most deliveries handed to the handler at once (EventHandler::handle_batch). A batch holds
  // only what has already arrived, so it is also bounded by prefetch; and it holds no more than
  // the last batch's time per delivery fits into half of ConnectionOptions::heartbeat (starting
  // at 1 and at most doubling per batch), which keeps slow handlers to small batches. 1 handles
  // (and acks) one delivery at a time. Default 64; 1..65535.
  int batch_size = 64;
  // true: the handler runs on a thread the consumer owns, one batch at a time, while the
  // calling thread receives the next deliveries and answers heartbeats; the next batch starts
  // once the previous one is settled (acked), so batches still run, and are acked, in delivery
  // order. false: the handler runs on the thread that called run(), and nothing is received
  // while it runs. poll_once() always runs it on the calling thread. Default true.
  bool pipeline = true;
  // Failed deliveries of one message before it is dead-lettered. Default 5; at least 1.
  int max_deliveries = 5;
  // AlreadyInProgress requeues of one message before it is dead-lettered. Default 1000.
  int max_in_progress_requeues = 1000;
  // Wait before requeueing an AlreadyInProgress delivery (the consumer thread waits: the
  // claim's holder is busy, so the broker would only hand it straight back). Default 100 ms.
  Millis in_progress_backoff = std::chrono::milliseconds(100);
  // How long run()/run_until() wait for a delivery before checking stop() again. Default 100 ms;
  // must be positive.
  Millis poll_interval = std::chrono::milliseconds(100);
};

struct ConsumerStats {
  std::uint64_t delivered = 0;             // deliveries received
  std::uint64_t batches = 0;               // handle_batch calls (delivered / batches: mean size)
  std::uint64_t acked = 0;                 // handler returned → acked
  std::uint64_t duplicates = 0;            // of those, HandleResult::duplicate
  std::uint64_t requeued = 0;              // handler threw → nacked with requeue
  std::uint64_t in_progress_requeued = 0;  // AlreadyInProgress → nacked with requeue
  std::uint64_t dead_lettered = 0;         // sent to the dead-letter queue (malformed included)
  std::uint64_t malformed = 0;             // of those, malformed messages
  std::uint64_t follow_ups = 0;            // events handlers published through the BusProxy
  std::uint64_t reconnects = 0;            // connections opened after the first
};

class Consumer {
 public:
  // Validates the options (ConfigError). Does not connect yet: the first poll does.
  Consumer(ConnectionOptions connection, ConsumerOptions options);
  ~Consumer();  // closes the connections; unacked deliveries go back to the queue
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // Connects and declares the topology now (one attempt; BrokerError when it fails), so events
  // published afterwards are queued for this consumer. The run and poll calls do it themselves.
  void connect();
  // Consumes until stop(). Returns normally after stop(); throws BrokerError when the broker
  // refuses the topology (not retryable) or max_reconnect_attempts connects failed in a row.
  void run(EventHandler& handler);
  // Like run(), but also returns once done() is true (checked after every batch and every
  // poll_interval, on the calling thread and never while the handler runs, so it may read what
  // the handler wrote without a lock). Returns false when stop() ended it.
  bool run_until(EventHandler& handler, const std::function<bool()>& done);
  // Consumes until `deliveries` deliveries have been settled (acked, requeued or dead-lettered)
  // or stop(); never hands the handler more than that (deliveries that arrived beyond it wait,
  // unacked, for the next call). Returns how many were settled.
  std::size_t run_for(EventHandler& handler, std::size_t deliveries);
  // Connects if needed (one attempt: BrokerError when it fails), waits up to `timeout` for one
  // delivery and settles it (a batch of one). Returns whether a delivery was handled. A lost
  // connection is dropped (false) and reopened by the next call.
  bool poll_once(EventHandler& handler, Millis timeout);

  // Makes the running (or next) run()/run_until()/run_for() return after the batch in hand.
  // Any thread, async-signal-safe.
  void stop() noexcept;

  ConsumerStats stats() const;
  const std::string& queue_name() const noexcept;
  const std::string& dead_letter_queue() const noexcept;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::rabbitmq
