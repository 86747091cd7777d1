#include "idem/rabbitmq/consumer.hpp"

#include <algorithm>
#include <atomic>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "amqp_connection.hpp"
#include "batch_runner.hpp"
#include "idem/detail/fork.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/rabbitmq/broker_error.hpp"
#include "internal.hpp"

namespace idem::rabbitmq {
namespace {

// Reasons travel in a header; a runaway what() should not make every dead letter huge.
constexpr std::size_t kMaxReasonLength = 1000;
// The in-progress requeue counts are per process and only a guard against endless cycling; if
// they pile up (messages taken over by other consumer processes never come back here) they are
// simply forgotten.
constexpr std::size_t kMaxTrackedInProgress = 10000;

std::string clip(std::string reason) {
  if (reason.size() > kMaxReasonLength) {
    reason.resize(kMaxReasonLength);
    reason += "...";
  }
  return reason;
}

}  // namespace

class Consumer::Impl {
 public:
  // ConfigError in a child of fork(): the connection and the batch runner are the parent's.
  void check_process() const { process_.use("this RabbitMQ consumer"); }

  Impl(ConnectionOptions connection, ConsumerOptions options)
      : connection_options_(std::move(connection)), options_(std::move(options)) {
    detail::validate_connection_options(connection_options_);
    try {
      validate_key("ConsumerOptions::consumer_name", options_.consumer_name);
    } catch (const InvalidKey& e) {
      throw ConfigError(e.message());
    }
    detail::validate_amqp_name("ConsumerOptions::exchange", options_.exchange);
    detail::validate_amqp_name("ConsumerOptions::binding_key", options_.binding_key,
                               /*allow_empty=*/true);
    queue_ = options_.queue_name.empty() ? "idem." + options_.consumer_name : options_.queue_name;
    dead_letter_queue_ =
        options_.dead_letter_queue.empty() ? queue_ + ".dlq" : options_.dead_letter_queue;
    detail::validate_amqp_name("ConsumerOptions::queue_name (\"idem.<consumer_name>\")", queue_);
    detail::validate_amqp_name("ConsumerOptions::dead_letter_queue (\"<queue_name>.dlq\")",
                               dead_letter_queue_);
    if (queue_ == dead_letter_queue_)
      throw ConfigError("idem rabbitmq: ConsumerOptions: queue and dead-letter queue are the same");
    const auto bad = [](const std::string& what) {
      throw ConfigError("idem rabbitmq: ConsumerOptions: " + what);
    };
    if (options_.prefetch < 1 || options_.prefetch > 65535)
      bad("prefetch " + std::to_string(options_.prefetch) + " is not in 1..65535");
    if (options_.batch_size < 1 || options_.batch_size > 65535)
      bad("batch_size " + std::to_string(options_.batch_size) + " is not in 1..65535");
    if (options_.max_deliveries < 1)
      bad("max_deliveries " + std::to_string(options_.max_deliveries) + " is less than 1");
    if (options_.max_in_progress_requeues < 0) bad("max_in_progress_requeues is negative");
    if (options_.in_progress_backoff.count() < 0) bad("in_progress_backoff is negative");
    if (options_.poll_interval.count() <= 0) bad("poll_interval must be positive");
    clock_ = connection_options_.clock != nullptr ? connection_options_.clock : system_clock();
  }

  bool run_until(EventHandler& handler, const std::function<bool()>& done) {
    return consume(handler, done, std::numeric_limits<std::size_t>::max()) == Ended::done;
  }

  std::size_t run_for(EventHandler& handler, std::size_t deliveries) {
    const std::uint64_t start = settled_;
    consume(handler, nullptr, deliveries);
    return static_cast<std::size_t>(settled_ - start);
  }

  // Connects if needed (one attempt), waits up to `timeout` for a delivery unless one is already
  // here, and handles and settles it on this thread.
  bool poll_once(EventHandler& handler, Millis timeout) {
    if (!ensure_connected(/*retry=*/false)) return false;
    if (staged_.empty()) {
      try {
        if (std::optional<detail::Delivery> delivery = main_->next_delivery(timeout))
          staged_.push_back(std::move(*delivery));
      } catch (const BrokerError&) {
        drop_connection();  // reopened by the next call
        return false;
      }
    }
    if (staged_.empty()) return false;
    hand_over(handler, 1, /*on_runner=*/false);
    return true;
  }
  void connect() { ensure_connected(/*retry=*/false); }

  void stop() noexcept { stop_.store(true); }

  ConsumerStats stats() const {
    std::lock_guard lock(stats_mutex_);
    return stats_;
  }

  const std::string& queue() const noexcept { return queue_; }
  const std::string& dead_letter_queue() const noexcept { return dead_letter_queue_; }

  // Follow-up events from handlers.
  void publish_follow_up(const Event& event) {
    const detail::Outgoing message = detail::to_outgoing(event);
    side_publish(options_.exchange, event.type, message);
    count([](ConsumerStats& s) { ++s.follow_ups; });
  }
  const std::string& consumer_name() const noexcept { return options_.consumer_name; }

 private:
  class Proxy final : public BusProxy {
   public:
    explicit Proxy(Impl& impl) : impl_(impl) {}
    void publish(Event event) override { impl_.publish_follow_up(event); }
    std::string_view consumer() const override { return impl_.consumer_name(); }

   private:
    Impl& impl_;
  };

  enum class Outcome { in_progress, malformed, failed };
  enum class Ended { stopped, done, budget };

  // Deliveries handed to the handler together, and where each event came from.
  struct Batch {
    std::vector<detail::Delivery> deliveries;
    std::vector<Event> events;         // the well-formed deliveries, in delivery order
    std::vector<std::size_t> sources;  // events[i] came from deliveries[sources[i]]
    std::uint64_t connection = 0;      // generation_ when received: tags belong to it
  };

  // The loop behind run(), run_until() and run_for(), on the caller's thread. With
  // ConsumerOptions::pipeline the runner thread handles one batch while this thread receives
  // the next deliveries into staged_ (and answers heartbeats); the next batch is handed over
  // once the previous one is settled, so batches run and are settled in delivery order and at
  // most one batch has run without being acked. Ends on stop(), once done() is true, or when
  // `budget` deliveries were handed over — always with the batch in hand settled.
  Ended consume(EventHandler& handler, const std::function<bool()>& done, std::size_t budget) {
    const bool pipelined = options_.pipeline;
    std::size_t handed = 0;
    // However this returns or throws, the runner gives the batch back before the handler (and
    // the caller's stack) can go away.
    struct SettleInHand {
      Impl& impl;
      ~SettleInHand() { impl.finish_in_flight(/*wait=*/true); }
    } settle_in_hand{*this};
    Ended ended = Ended::stopped;
    for (;;) {
      finish_in_flight(/*wait=*/false);
      if (stop_.load()) break;
      // done() usually reads what the handler wrote: it is asked only while no batch runs.
      if (!in_flight_ && done && done()) {
        ended = Ended::done;
        break;
      }
      if (handed >= budget && !in_flight_) {
        ended = Ended::budget;
        break;
      }
      if (!ensure_connected(/*retry=*/true)) break;  // stopped while reconnecting
      if (!in_flight_ && !staged_.empty() && handed < budget) {
        handed += hand_over(handler, budget - handed, pipelined);
        continue;
      }
      receive();
    }
    finish_in_flight(/*wait=*/true);
    if (ended == Ended::stopped) stop_.store(false);
    return ended;
  }

  // Receives what the broker sent into staged_. With a batch on the runner, waits (up to
  // poll_interval) for the broker or for the runner to finish, then takes everything that has
  // arrived; otherwise waits up to poll_interval for one delivery and takes what arrived with it.
  void receive() {
    try {
      std::optional<detail::Delivery> delivery;
      if (in_flight_) {
        main_->wait_readable(options_.poll_interval, runner().ready_fd());
        delivery = main_->next_delivery(Millis::zero());  // also answers a due heartbeat
      } else {
        delivery = main_->next_delivery(options_.poll_interval);
      }
      while (delivery) {
        staged_.push_back(std::move(*delivery));
        delivery = main_->next_delivery(Millis::zero());
      }
    } catch (const BrokerError&) {
      // Reconnect on the next turn. Deliveries taken on this connection cannot be acked on
      // another; the broker delivers them again.
      drop_connection();
    }
  }

  // Takes up to min(max, batch limit) staged deliveries: dead-letters the malformed ones, then
  // hands the rest to the handler — on the runner thread, or (on_runner false) here, settling
  // them before returning. Returns how many deliveries it took.
  std::size_t hand_over(EventHandler& handler, std::size_t max, bool on_runner) {
    if (on_runner) runner();  // started first: if it cannot be, nothing has been taken yet
    const std::size_t take = std::min({max, batch_limit_, staged_.size()});
    Batch batch;
    batch.connection = generation_;
    batch.deliveries.reserve(take);
    for (std::size_t i = 0; i < take; ++i) {
      batch.deliveries.push_back(std::move(staged_.front()));
      staged_.pop_front();
    }
    count([&](ConsumerStats& s) { s.delivered += take; });
    settled_ += take;
    try {
      for (std::size_t i = 0; i < batch.deliveries.size(); ++i) {
        detail::IncomingEvent incoming = detail::event_from_delivery(batch.deliveries[i]);
        if (!incoming.event) {
          dead_letter(batch.deliveries[i], incoming.malformed_reason, true, 0);
          continue;
        }
        batch.events.push_back(std::move(*incoming.event));
        batch.sources.push_back(i);
      }
    } catch (const BrokerError&) {
      drop_connection();  // the broker delivers the batch again
      return take;
    }
    if (batch.events.empty()) return take;
    count([](ConsumerStats& s) { ++s.batches; });
    in_flight_ = std::move(batch);
    if (on_runner) {
      runner().start(handler, in_flight_->events, proxy_);
      return take;
    }
    detail::BatchRunner::Done done;
    const SteadyTime started = clock_->steady_now();
    try {
      done.outcomes = handler.handle_batch(in_flight_->events, proxy_);
    } catch (...) {
      done.outcomes.clear();  // the whole batch failed
    }
    done.elapsed = clock_->steady_now() - started;
    finish(std::move(done));
    return take;
  }

  // Settles the batch in hand once the runner has finished it (wait: blocks until then).
  // Never throws: it also runs from a destructor.
  void finish_in_flight(bool wait) noexcept {
    if (!in_flight_ || runner_ == nullptr) return;
    std::optional<detail::BatchRunner::Done> done = runner_->take(wait);
    if (!done) return;
    try {
      finish(std::move(*done));
    } catch (...) {
      // Only allocation can fail here; the broker delivers what was not acked again.
      in_flight_.reset();
      drop_connection();
    }
  }

  void finish(detail::BatchRunner::Done done) {
    Batch batch = std::move(*in_flight_);
    in_flight_.reset();
    adapt_batch_limit(batch.events.size(), done.elapsed);
    // The connection the batch came on is gone: its deliveries come again on the new one.
    if (main_ == nullptr || batch.connection != generation_) return;
    try {
      settle(batch, std::move(done.outcomes));
    } catch (const BrokerError&) {
      // An ack/nack could not be sent: the connection is gone and the broker will deliver the
      // unsettled messages again (the idempotent handler then drops the ones it processed).
      drop_connection();
    }
  }

  detail::BatchRunner& runner() {
    if (runner_ == nullptr) runner_ = std::make_unique<detail::BatchRunner>(clock_);
    return *runner_;
  }

  void drop_connection() noexcept {
    main_.reset();
    staged_.clear();
  }

  template <class F>
  void count(F&& update) {
    std::lock_guard lock(stats_mutex_);
    update(stats_);
  }

  // One attempt, or (retry) attempts with backoff until connected, stopped (false) or out of
  // attempts (throws).
  bool ensure_connected(bool retry) {
    if (main_ != nullptr && !main_->broken()) return true;
    drop_connection();
    Millis backoff = connection_options_.initial_backoff;
    int failures = 0;
    for (;;) {
      try {
        open_main();
        return true;
      } catch (const BrokerError& e) {
        main_.reset();
        if (!retry || !e.retryable()) throw;
        ++failures;
        if (connection_options_.max_reconnect_attempts > 0 &&
            failures >= connection_options_.max_reconnect_attempts) {
          throw BrokerError(
              std::string(e.what()) + " (gave up after " + std::to_string(failures) + " attempts)",
              true);
        }
        if (!detail::wait_unless_stopped(*clock_, backoff, options_.poll_interval, stop_))
          return false;
        backoff = std::min(backoff * 2, connection_options_.max_backoff);
      }
    }
  }

  void open_main() {
    auto connection = std::make_unique<detail::AmqpConnection>(connection_options_);
    connection->declare_exchange(options_.exchange, to_string(options_.exchange_type));
    connection->declare_queue(queue_, /*quorum=*/true);
    connection->bind_queue(queue_, options_.exchange, options_.binding_key);
    connection->declare_queue(dead_letter_queue_, /*quorum=*/false);
    connection->qos(options_.prefetch);
    connection->consume(queue_);
    if (connected_before_) count([](ConsumerStats& s) { ++s.reconnects; });
    connected_before_ = true;
    main_ = std::move(connection);
    ++generation_;
  }

  void side_publish(const std::string& exchange, const std::string& routing_key,
                    const detail::Outgoing& message) {
    // Follow-ups come from the handler (on the runner thread), dead letters from the consumer's.
    std::lock_guard lock(side_mutex_);
    try {
      if (side_ == nullptr || !side_->alive()) {
        side_.reset();
        auto connection = std::make_unique<detail::AmqpConnection>(connection_options_);
        connection->enable_confirms();
        side_ = std::move(connection);
      }
      side_->publish(exchange, routing_key, message);
    } catch (...) {
      if (side_ != nullptr && side_->broken()) side_.reset();
      throw;
    }
  }

  std::size_t batch_limit() const { return batch_limit_; }

  // rabbitmq-c sends heartbeats only while idem waits for the broker. Without the pipeline a
  // whole batch must therefore run well within the heartbeat, or the broker drops the connection
  // and redelivers it all; with it, heartbeats go on, but a batch that ran without being acked is
  // what a crash makes run again, so slow handlers still get small batches. The next batch may
  // hold what the last one's time per delivery fits into half a heartbeat, and at most twice the
  // last limit (it starts at 1, like TCP's slow start), never more than batch_size.
  void adapt_batch_limit(std::size_t handled, SteadyTime::duration elapsed) {
    const auto configured = static_cast<std::size_t>(options_.batch_size);
    std::size_t limit = std::min(configured, batch_limit_ * 2);
    const auto heartbeat = connection_options_.heartbeat;
    if (heartbeat.count() > 0 && handled > 0 && elapsed.count() > 0) {
      const SteadyTime::duration per_delivery =
          elapsed / static_cast<SteadyTime::duration::rep>(handled);
      const auto budget = std::chrono::duration_cast<SteadyTime::duration>(heartbeat) / 2;
      const auto fits =
          static_cast<std::size_t>(budget / std::max(per_delivery, SteadyTime::duration(1)));
      limit = std::min(limit, fits);
    }
    batch_limit_ = std::max<std::size_t>(limit, 1);
  }

  // Settles each delivery of a finished batch: failures first (nack or dead letter, in delivery
  // order), then every ack at once — one basic.ack with `multiple` for the highest tag, which
  // covers exactly the batch's acks because everything delivered before it on this channel is
  // settled by then (deliveries received meanwhile have higher tags). Throws BrokerError.
  void settle(const Batch& batch, std::vector<HandleOutcome> outcomes) {
    const std::vector<Event>& events = batch.events;
    if (outcomes.size() != events.size()) {
      const std::exception_ptr error =
          std::make_exception_ptr(std::runtime_error("the handler's handle_batch threw or "
                                                     "returned the wrong number of outcomes"));
      outcomes.assign(events.size(), HandleOutcome{std::nullopt, error});
    }

    std::optional<std::uint64_t> last_ack;
    std::uint64_t acks = 0;
    std::uint64_t duplicates = 0;
    for (std::size_t i = 0; i < events.size(); ++i) {
      const Event& event = events[i];
      const detail::Delivery& delivery = batch.deliveries[batch.sources[i]];
      if (outcomes[i].result && !outcomes[i].error) {
        in_progress_.erase(event.id);
        last_ack = std::max(last_ack.value_or(0), delivery.tag);
        ++acks;
        if (*outcomes[i].result == HandleResult::duplicate) ++duplicates;
        continue;
      }
      settle_failure(delivery, event.id, outcomes[i].error);
    }
    if (last_ack) {
      main_->ack(*last_ack, /*multiple=*/true);
      count([&](ConsumerStats& s) {
        s.acked += acks;
        s.duplicates += duplicates;
      });
    }
  }

  void settle_failure(const detail::Delivery& delivery, const std::string& id,
                      const std::exception_ptr& error) {
    Outcome outcome = Outcome::failed;
    std::string reason = "the handler failed without an exception";
    try {
      if (error) std::rethrow_exception(error);
    } catch (const AlreadyInProgress& e) {
      outcome = Outcome::in_progress;
      reason = e.what();
    } catch (const Error& e) {
      // A payload the handler's codec cannot read (or an id it refuses) fails the same way on
      // every delivery: retrying only delays the dead letter.
      const bool permanent =
          e.code() == ErrorCode::decode_error || e.code() == ErrorCode::invalid_key;
      outcome = permanent ? Outcome::malformed : Outcome::failed;
      reason = e.what();
    } catch (const std::exception& e) {
      reason = e.what();
    } catch (...) {
      reason = "the handler threw a non-standard exception";
    }

    switch (outcome) {
      case Outcome::malformed:
        in_progress_.erase(id);
        dead_letter(delivery, "malformed: " + reason, true, 1);
        return;
      case Outcome::in_progress:
        on_in_progress(delivery, id, reason);
        return;
      case Outcome::failed:
        on_failure(delivery, id, reason);
        return;
    }
  }

  void on_in_progress(const detail::Delivery& delivery, const std::string& id,
                      const std::string& reason) {
    if (in_progress_.size() >= kMaxTrackedInProgress && in_progress_.count(id) == 0)
      in_progress_.clear();
    const int requeues = ++in_progress_[id];
    if (requeues > options_.max_in_progress_requeues) {
      in_progress_.erase(id);
      dead_letter(
          delivery,
          "still in progress after " + std::to_string(requeues - 1) + " requeues: " + reason, false,
          static_cast<int>(delivery.delivery_count));
      return;
    }
    detail::wait_unless_stopped(*clock_, options_.in_progress_backoff, options_.poll_interval,
                                stop_);
    main_->nack(delivery.tag, /*requeue=*/true);
    count([](ConsumerStats& s) { ++s.in_progress_requeued; });
  }

  void on_failure(const detail::Delivery& delivery, const std::string& id,
                  const std::string& reason) {
    // x-delivery-count counts every return to the queue, in-progress requeues included; those
    // are not failures.
    const auto tracked = in_progress_.find(id);
    const std::int64_t not_failures = tracked == in_progress_.end() ? 0 : tracked->second;
    const std::int64_t failures =
        std::max<std::int64_t>(delivery.delivery_count - not_failures, 0) + 1;
    if (failures >= options_.max_deliveries) {
      in_progress_.erase(id);
      dead_letter(delivery, reason, false, static_cast<int>(failures));
      return;
    }
    main_->nack(delivery.tag, /*requeue=*/true);
    count([](ConsumerStats& s) { ++s.requeued; });
  }

  // Copies the message to the dead-letter queue (confirmed), then acks the original. If the copy
  // cannot be published the original is requeued, so nothing is lost.
  void dead_letter(const detail::Delivery& delivery, const std::string& reason, bool malformed,
                   int failures) {
    detail::Outgoing copy;
    copy.message_id = delivery.message_id ? &*delivery.message_id : nullptr;
    copy.type = delivery.type ? &*delivery.type : nullptr;
    copy.timestamp = delivery.timestamp;
    copy.headers = delivery.headers;
    copy.headers["x-idem-reason"] = clip(reason);
    copy.headers["x-idem-consumer"] = options_.consumer_name;
    copy.headers["x-idem-routing-key"] = delivery.routing_key;
    copy.headers["x-idem-deliveries"] = std::to_string(failures);
    copy.body = delivery.body;
    try {
      side_publish(/*exchange=*/"", dead_letter_queue_, copy);
    } catch (const Error&) {
      main_->nack(delivery.tag, /*requeue=*/true);
      count([](ConsumerStats& s) { ++s.requeued; });
      return;
    }
    main_->ack(delivery.tag);
    count([&](ConsumerStats& s) {
      ++s.dead_lettered;
      if (malformed) ++s.malformed;
    });
  }

  const ConnectionOptions connection_options_;
  const ConsumerOptions options_;
  std::string queue_;
  std::string dead_letter_queue_;
  std::shared_ptr<Clock> clock_;
  std::unique_ptr<detail::AmqpConnection> main_;  // consumes, acks
  std::mutex side_mutex_;
  std::unique_ptr<detail::AmqpConnection> side_;  // publishes dead letters and follow-ups
  bool connected_before_ = false;
  std::uint64_t generation_ = 0;         // connections opened so far
  std::deque<detail::Delivery> staged_;  // received on main_, not yet handed over
  std::optional<Batch> in_flight_;       // handed over, not yet settled
  std::uint64_t settled_ = 0;
  std::size_t batch_limit_ = 1;                       // see adapt_batch_limit()
  std::unordered_map<std::string, int> in_progress_;  // event id → AlreadyInProgress requeues
  std::atomic<bool> stop_{false};
  static_assert(std::atomic<bool>::is_always_lock_free, "stop() must be async-signal-safe");
  mutable std::mutex stats_mutex_;
  ConsumerStats stats_;
  Proxy proxy_{*this};
  const ::idem::detail::ForkOwner process_;
  std::unique_ptr<detail::BatchRunner> runner_;  // last: its thread may use everything above
};

Consumer::Consumer(ConnectionOptions connection, ConsumerOptions options)
    : impl_(std::make_unique<Impl>(std::move(connection), std::move(options))) {}
Consumer::~Consumer() = default;

void Consumer::connect() {
  impl_->check_process();
  impl_->connect();
}
void Consumer::run(EventHandler& handler) {
  impl_->check_process();
  impl_->run_until(handler, nullptr);
}
bool Consumer::run_until(EventHandler& handler, const std::function<bool()>& done) {
  impl_->check_process();
  return impl_->run_until(handler, done);
}
std::size_t Consumer::run_for(EventHandler& handler, std::size_t deliveries) {
  impl_->check_process();
  return impl_->run_for(handler, deliveries);
}
bool Consumer::poll_once(EventHandler& handler, Millis timeout) {
  impl_->check_process();
  return impl_->poll_once(handler, timeout);
}
void Consumer::stop() noexcept {
  impl_->stop();
}
ConsumerStats Consumer::stats() const {
  return impl_->stats();
}
const std::string& Consumer::queue_name() const noexcept {
  return impl_->queue();
}
const std::string& Consumer::dead_letter_queue() const noexcept {
  return impl_->dead_letter_queue();
}

namespace detail {

IncomingEvent event_from_delivery(const Delivery& delivery) {
  IncomingEvent incoming;
  if (!delivery.message_id) {
    incoming.malformed_reason = "malformed: the message has no message_id property";
    return incoming;
  }
  try {
    validate_key("event id", *delivery.message_id);
  } catch (const InvalidKey& e) {
    incoming.malformed_reason =
        std::string("malformed: message_id is not a valid event id: ") + e.what();
    return incoming;
  }
  Event event;
  event.id = *delivery.message_id;
  // An absent or empty `type` property: the routing key names the event instead.
  event.type = delivery.type && !delivery.type->empty() ? *delivery.type : delivery.routing_key;
  event.payload = delivery.body;
  event.headers = delivery.headers;
  // AMQP timestamps are unsigned seconds; WallTime counts nanoseconds in an int64, so anything
  // past the year 2262 would overflow the conversion (undefined behaviour): left unset.
  constexpr std::uint64_t kMaxSeconds = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(WallTime::duration::max()).count());
  if (delivery.timestamp && *delivery.timestamp <= kMaxSeconds) {
    event.timestamp = WallTime(std::chrono::duration_cast<WallTime::duration>(
        std::chrono::seconds(static_cast<std::int64_t>(*delivery.timestamp))));
  }
  incoming.event = std::move(event);
  return incoming;
}

}  // namespace detail

}  // namespace idem::rabbitmq
