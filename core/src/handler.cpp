#include "idem/handler.hpp"

#include <algorithm>
#include <optional>
#include <set>

#include "idem/detail/handler_logic.hpp"
#include "idem/key.hpp"
#include "idem/outbox.hpp"
#include "idem/sql.hpp"
#include "iso_time.hpp"

namespace idem {

std::string_view to_string(HandlerMode mode) noexcept {
  switch (mode) {
    case HandlerMode::automatic:
      return "automatic";
    case HandlerMode::check_then_mark:
      return "check_then_mark";
    case HandlerMode::exclusive:
      return "exclusive";
    case HandlerMode::transactional:
      return "transactional";
  }
  return "unknown";
}

namespace detail {

void throw_payload_decode_error(const Event& event, std::string_view consumer,
                                std::string_view reason) {
  throw DecodeError("consumer '" + std::string(consumer) + "' cannot decode the payload of event " +
                    event.id + " (type '" + event.type + "'): " + std::string(reason));
}

HandlerMode resolve_handler_mode(HandlerMode requested, bool claims, bool transactions,
                                 Millis lease) {
  const HandlerMode mode = requested != HandlerMode::automatic ? requested
                           : claims                            ? HandlerMode::exclusive
                                                               : HandlerMode::check_then_mark;
  if (mode == HandlerMode::exclusive) {
    if (!claims) throw NotSupported("exclusive mode needs a recorder that supports claims");
    if (lease <= Millis::zero()) {
      throw ConfigError("HandlerOptions::lease must be positive (got " +
                        std::to_string(lease.count()) + " ms)");
    }
  }
  if (mode == HandlerMode::transactional && !transactions) {
    throw NotSupported(
        "transactional mode needs a recorder that supports transactions (a SQL backend)");
  }
  return mode;
}

bool claim_says_run(const Claim& claim, std::string_view consumer, std::string_view event_id) {
  switch (claim.status) {
    case Claim::Status::processed:
      return false;
    case Claim::Status::in_progress:
      throw AlreadyInProgress(
          "consumer '" + std::string(consumer) + "': event " + std::string(event_id) +
          " is being handled by another delivery" +
          (claim.lease_until == WallTime{}
               ? std::string()
               : " (its lease runs until " + format_iso8601(claim.lease_until) + ")") +
          "; deliver it again later");
    case Claim::Status::acquired:
      break;
  }
  return true;
}

void throw_lease_lost(std::string_view consumer, std::string_view event_id) {
  throw LeaseLost("consumer '" + std::string(consumer) + "': event " + std::string(event_id) +
                  " was handled, but its claim had been taken over by another delivery (the "
                  "lease lapsed); the side effect may run twice");
}

DeliveryOutcome failure_outcome(const std::exception_ptr& error) noexcept {
  try {
    std::rethrow_exception(error);
  } catch (const AlreadyInProgress&) {
    return DeliveryOutcome::in_progress;
  } catch (...) {
  }
  return DeliveryOutcome::failed;
}

void observe_delivery(Observer& observer, std::string_view consumer, const Event& event,
                      DeliveryOutcome outcome,
                      std::optional<std::chrono::nanoseconds> handler_duration) noexcept {
  DeliveryObservation observation;
  observation.consumer = consumer;
  observation.event_id = event.id;
  observation.outcome = outcome;
  observation.handler_duration = handler_duration;
  notify(observer, observation);
}

void observe_batch(
    Observer& observer, std::string_view consumer, std::span<const Event> events,
    const std::vector<HandleOutcome>& outcomes,
    const std::vector<std::optional<std::chrono::nanoseconds>>& handler_durations) noexcept {
  for (std::size_t i = 0; i < events.size() && i < outcomes.size(); ++i) {
    const HandleOutcome& outcome = outcomes[i];
    DeliveryOutcome what = DeliveryOutcome::failed;
    if (outcome.result) {
      what = *outcome.result == HandleResult::processed ? DeliveryOutcome::processed
                                                        : DeliveryOutcome::duplicate;
    } else if (outcome.error) {
      what = failure_outcome(outcome.error);
    }
    observe_delivery(observer, consumer, events[i], what,
                     i < handler_durations.size() ? handler_durations[i] : std::nullopt);
  }
}

CheckMarkWindow::CheckMarkWindow(std::span<const Event> events)
    : events_(events), outcomes_(events.size()) {
  for (std::size_t i = 0; i < events.size(); ++i) {
    try {
      validate_key("event id", events[i].id);
      ids_.push_back(events[i].id);
      positions_.push_back(i);
    } catch (...) {
      outcomes_[i].error = std::current_exception();
    }
  }
}

void CheckMarkWindow::fail_checked() {
  for (std::size_t i : positions_)
    outcomes_[i].error = std::current_exception();
}

bool CheckMarkWindow::should_run(std::size_t k, const std::vector<bool>& processed) {
  if (processed[k] || handled_.count(ids_[k]) > 0) {
    outcomes_[positions_[k]].result = HandleResult::duplicate;
    return false;
  }
  return true;
}

void CheckMarkWindow::succeeded(std::size_t k) {
  handled_.insert(ids_[k]);
  to_mark_.push_back(ids_[k]);
  marked_positions_.push_back(positions_[k]);
}

void CheckMarkWindow::failed(std::size_t k, std::exception_ptr error) {
  outcomes_[positions_[k]].error = std::move(error);
}

void CheckMarkWindow::marked() {
  for (std::size_t i : marked_positions_)
    outcomes_[i].result = HandleResult::processed;
}

void CheckMarkWindow::mark_failed() {
  for (std::size_t i : marked_positions_)
    outcomes_[i].error = std::current_exception();
}

namespace {

// Transactional mode: handle sees the backend transaction; its published events wait for the
// commit.
class TransactionalProxy final : public BusProxy {
 public:
  TransactionalProxy(BusProxy& outer, Transaction& tx) : outer_(outer), tx_(tx) {}
  void publish(Event event) override { held_.push_back(std::move(event)); }
  std::string_view consumer() const override { return outer_.consumer(); }
  Transaction* transaction() noexcept override { return &tx_; }
  std::vector<Event> take() { return std::exchange(held_, {}); }

 private:
  BusProxy& outer_;
  Transaction& tx_;
  std::vector<Event> held_;
};

// Transactional mode with an outbox: published events become outbox rows of the transaction.
class OutboxProxy final : public BusProxy {
 public:
  OutboxProxy(BusProxy& outer, Transaction& tx, Outbox& outbox, const std::string& consumer,
              const std::string& source_event_id)
      : outer_(outer),
        tx_(tx),
        sql_(dynamic_cast<SqlTransaction*>(&tx)),
        outbox_(outbox),
        consumer_(consumer),
        source_event_id_(source_event_id) {
    if (sql_ == nullptr) {
      throw NotSupported(
          "HandlerOptions::outbox needs a SQL recorder (its transaction is not an "
          "idem::SqlTransaction)");
    }
  }
  void publish(Event event) override {
    if (event.id.empty()) event.id = follow_up_id(consumer_, source_event_id_, sequence_);
    ++sequence_;
    validate_key("event id", event.id);
    if (event.type.empty()) {
      throw InvalidArgument("publish: follow-up event " + event.id + " has no type");
    }
    if (event.timestamp == WallTime{}) event.timestamp = std::chrono::system_clock::now();
    outbox_.append(*sql_, consumer_, source_event_id_, event);
    ++appended_;
  }
  std::string_view consumer() const override { return outer_.consumer(); }
  Transaction* transaction() noexcept override { return &tx_; }
  std::size_t appended() const noexcept { return appended_; }

 private:
  BusProxy& outer_;
  Transaction& tx_;
  SqlTransaction* sql_;
  Outbox& outbox_;
  const std::string& consumer_;
  const std::string& source_event_id_;
  std::uint64_t sequence_ = 0;
  std::size_t appended_ = 0;
};

}  // namespace

HandlerCore::HandlerCore(std::string consumer, std::shared_ptr<IdempotencyRecorder> recorder,
                         HandlerOptions options)
    : consumer_(std::move(consumer)),
      recorder_(std::move(recorder)),
      mode_(HandlerMode::check_then_mark),
      lease_(options.lease),
      clock_(options.clock ? std::move(options.clock) : system_clock()),
      outbox_(std::move(options.outbox)),
      observer_(std::move(options.observer)),
      renewer_("IdempotentHandler '" + consumer_ + "'") {
  validate_key("consumer", consumer_);
  if (!recorder_) throw InvalidArgument("IdempotentHandler needs a recorder (got null)");
  mode_ = resolve_handler_mode(options.mode, recorder_->supports_claims(),
                               recorder_->supports_transactions(), lease_);
  if (outbox_ && mode_ != HandlerMode::transactional) {
    throw ConfigError("HandlerOptions::outbox needs HandlerMode::transactional (got " +
                      std::string(to_string(mode_)) + ")");
  }
}

void HandlerCore::check_process() const {
  renewer_.check_process();
}

HandleResult HandlerCore::run(const Event& event, BusProxy& bus,
                              const std::function<void(BusProxy&)>& invoke) {
  if (observer_) return run_observed(event, bus, invoke);
  return run_unobserved(event, bus, invoke);
}

namespace {

// Calls `call()` and sets `ran` to how long it took on `clock`, also when it throws.
template <class Call>
void timed(const Clock& clock, std::optional<std::chrono::nanoseconds>& ran, Call&& call) {
  const SteadyTime start = clock.steady_now();
  try {
    call();
  } catch (...) {
    ran = clock.steady_now() - start;
    throw;
  }
  ran = clock.steady_now() - start;
}

}  // namespace

HandleResult HandlerCore::run_observed(const Event& event, BusProxy& bus,
                                       const std::function<void(BusProxy&)>& invoke) {
  std::optional<std::chrono::nanoseconds> ran;
  const std::function<void(BusProxy&)> timed_invoke = [&](BusProxy& proxy) {
    timed(*clock_, ran, [&] { invoke(proxy); });
  };
  HandleResult result = HandleResult::processed;
  try {
    result = run_unobserved(event, bus, timed_invoke);
  } catch (...) {
    observe_delivery(*observer_, consumer_, event, failure_outcome(std::current_exception()), ran);
    throw;
  }
  observe_delivery(
      *observer_, consumer_, event,
      result == HandleResult::processed ? DeliveryOutcome::processed : DeliveryOutcome::duplicate,
      ran);
  return result;
}

HandleResult HandlerCore::run_unobserved(const Event& event, BusProxy& bus,
                                         const std::function<void(BusProxy&)>& invoke) {
  check_process();
  validate_key("event id", event.id);
  switch (mode_) {
    case HandlerMode::check_then_mark:
      return run_check_then_mark(event, bus, invoke);
    case HandlerMode::exclusive:
      return run_exclusive(event, bus, invoke);
    case HandlerMode::transactional:
      return run_transactional(event, bus, invoke);
    case HandlerMode::automatic:
      break;  // resolved at construction
  }
  throw InvalidArgument("IdempotentHandler: unresolved mode");
}

std::vector<HandleOutcome> HandlerCore::run_batch(
    std::span<const Event> events, BusProxy& bus,
    const std::function<void(const Event&, BusProxy&)>& invoke) {
  check_process();
  std::vector<HandleOutcome> outcomes(events.size());
  if (mode_ != HandlerMode::check_then_mark) {
    for (std::size_t i = 0; i < events.size(); ++i) {
      try {
        outcomes[i].result =
            run(events[i], bus, [&](BusProxy& proxy) { invoke(events[i], proxy); });
      } catch (...) {
        outcomes[i].error = std::current_exception();
      }
    }
    return outcomes;
  }
  if (!observer_) return run_batch_check_then_mark(events, bus, invoke);
  std::vector<std::optional<std::chrono::nanoseconds>> ran(events.size());
  outcomes = run_batch_check_then_mark(events, bus, [&](const Event& event, BusProxy& proxy) {
    // The window hands over the events themselves: the position says whose time it is.
    const auto index = static_cast<std::size_t>(&event - events.data());
    timed(*clock_, ran[index], [&] { invoke(event, proxy); });
  });
  observe_batch(*observer_, consumer_, events, outcomes, ran);
  return outcomes;
}

std::vector<HandleOutcome> HandlerCore::run_batch_check_then_mark(
    std::span<const Event> events, BusProxy& bus,
    const std::function<void(const Event&, BusProxy&)>& invoke) {
  CheckMarkWindow window(events);
  std::vector<bool> processed;
  try {
    processed = recorder_->is_processed_many(consumer_, window.ids());
  } catch (...) {
    window.fail_checked();  // nothing ran: every event is redelivered and checked again
    return window.take();
  }
  for (std::size_t k = 0; k < window.ids().size(); ++k) {
    if (!window.should_run(k, processed)) continue;
    try {
      invoke(window.event(k), bus);
      window.succeeded(k);
    } catch (...) {
      window.failed(k);
    }
  }
  try {
    recorder_->mark_processed_many(consumer_, window.to_mark());
  } catch (...) {
    window.mark_failed();
    return window.take();
  }
  window.marked();
  return window.take();
}

HandleResult HandlerCore::run_check_then_mark(const Event& event, BusProxy& bus,
                                              const std::function<void(BusProxy&)>& invoke) {
  if (recorder_->is_processed(consumer_, event.id)) return HandleResult::duplicate;
  invoke(bus);
  recorder_->mark_processed(consumer_, event.id);
  return HandleResult::processed;
}

HandleResult HandlerCore::run_exclusive(const Event& event, BusProxy& bus,
                                        const std::function<void(BusProxy&)>& invoke) {
  const Claim claim = recorder_->claim(consumer_, event.id, lease_);
  if (!claim_says_run(claim, consumer_, event.id)) return HandleResult::duplicate;

  std::shared_ptr<LeaseRenewer::Lease> renewal;
  try {
    // Inside the try: if even starting the renewal fails, the claim is released at once instead
    // of blocking redeliveries for a whole lease.
    // The renewal owns a copy of the id: one already running when remove() returns may still
    // finish after this call (and the event) are gone.
    renewal = renewer_.add(clock_, lease_, [this, id = event.id, token = claim.token] {
      return recorder_->renew(consumer_, id, token, lease_);
    });
    invoke(bus);
  } catch (...) {
    renewer_.remove(renewal);
    try {
      // False: a takeover fenced us off and the claim is no longer ours to drop.
      static_cast<void>(recorder_->release(consumer_, event.id, claim.token));
    } catch (...) {
      // The handler's own error matters more; an unreleased claim is taken over after its lease.
    }
    throw;
  }
  renewer_.remove(renewal);
  if (!recorder_->complete(consumer_, event.id, claim.token)) throw_lease_lost(consumer_, event.id);
  return HandleResult::processed;
}

HandleResult HandlerCore::run_transactional(const Event& event, BusProxy& bus,
                                            const std::function<void(BusProxy&)>& invoke) {
  if (outbox_) {
    std::size_t appended = 0;
    const bool ran = recorder_->run_transactional(consumer_, event.id, [&](Transaction& tx) {
      OutboxProxy proxy(bus, tx, *outbox_, consumer_, event.id);
      invoke(proxy);
      appended = proxy.appended();
    });
    if (!ran) return HandleResult::duplicate;
    if (appended > 0) outbox_->notify_committed();  // committed: wake this process's relays
    return HandleResult::processed;
  }
  std::vector<Event> held;
  const bool ran = recorder_->run_transactional(consumer_, event.id, [&](Transaction& tx) {
    TransactionalProxy proxy(bus, tx);
    invoke(proxy);
    held = proxy.take();
  });
  if (!ran) return HandleResult::duplicate;
  // Committed: now the follow-up events may leave.
  for (auto& follow_up : held)
    bus.publish(std::move(follow_up));
  return HandleResult::processed;
}

}  // namespace detail
}  // namespace idem
