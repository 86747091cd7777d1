#include "idem/async/handler.hpp"

#include <asio/strand.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <exception>

#include "idem/async/detail/renewal.hpp"
#include "idem/detail/handler_logic.hpp"
#include "idem/key.hpp"

namespace idem::async {

namespace detail {

// Transactional mode: handle sees the transaction; its published events wait for the commit.
class AsyncTransactionalProxy final : public BusProxy {
 public:
  AsyncTransactionalProxy(BusProxy& outer, AsyncSqlTransaction& tx) : outer_(outer), tx_(tx) {}
  void publish(Event event) override { held_.push_back(std::move(event)); }
  std::string_view consumer() const override { return outer_.consumer(); }
  AsyncSqlTransaction& async_transaction() noexcept { return tx_; }
  std::vector<Event> take() { return std::exchange(held_, {}); }

 private:
  BusProxy& outer_;
  AsyncSqlTransaction& tx_;
  std::vector<Event> held_;
};

}  // namespace detail

AsyncSqlTransaction* transaction_of(BusProxy& bus) noexcept {
  auto* proxy = dynamic_cast<detail::AsyncTransactionalProxy*>(&bus);
  return proxy ? &proxy->async_transaction() : nullptr;
}

Task<std::vector<HandleOutcome>> AsyncEventHandler::handle_batch(std::span<const Event> events,
                                                                 BusProxy& bus) {
  std::vector<HandleOutcome> outcomes(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    try {
      outcomes[i].result = co_await handle_event(events[i], bus);
    } catch (...) {
      outcomes[i].error = std::current_exception();
    }
  }
  co_return outcomes;
}

namespace detail {

AsyncHandlerCore::AsyncHandlerCore(std::string consumer, std::shared_ptr<AsyncRecorder> recorder,
                                   HandlerOptions options)
    : consumer_(std::move(consumer)),
      recorder_(std::move(recorder)),
      mode_(HandlerMode::check_then_mark),
      lease_(options.lease),
      observer_(std::move(options.observer)),
      clock_(options.clock ? std::move(options.clock) : system_clock()) {
  validate_key("consumer", consumer_);
  if (!recorder_) throw InvalidArgument("AsyncIdempotentHandler needs a recorder (got null)");
  const auto caps = recorder_->capabilities();
  mode_ = idem::detail::resolve_handler_mode(options.mode, caps.claims, caps.transactions, lease_);
}

Task<HandleResult> AsyncHandlerCore::run(const Event& event, BusProxy& bus, Invoke invoke) {
  if (observer_) return run_observed(event, bus, std::move(invoke));
  return run_unobserved(event, bus, std::move(invoke));
}

namespace {

// Awaits invoke(event, proxy) and sets `ran` to how long it took on `clock`, also when it
// throws.
Task<void> timed(const AsyncHandlerCore::Invoke& invoke, const Event& event, BusProxy& proxy,
                 const Clock& clock, std::optional<std::chrono::nanoseconds>& ran) {
  const SteadyTime start = clock.steady_now();
  std::exception_ptr failure;
  try {
    co_await invoke(event, proxy);
  } catch (...) {
    failure = std::current_exception();
  }
  ran = clock.steady_now() - start;
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

Task<HandleResult> AsyncHandlerCore::run_observed(const Event& event, BusProxy& bus,
                                                  Invoke invoke) {
  std::optional<std::chrono::nanoseconds> ran;
  const Invoke timed_invoke = [&](const Event& e, BusProxy& proxy) {
    return timed(invoke, e, proxy, *clock_, ran);
  };
  HandleResult result = HandleResult::processed;
  std::exception_ptr failure;
  try {
    result = co_await run_unobserved(event, bus, timed_invoke);
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) {
    idem::detail::observe_delivery(*observer_, consumer_, event,
                                   idem::detail::failure_outcome(failure), ran);
    std::rethrow_exception(failure);
  }
  idem::detail::observe_delivery(
      *observer_, consumer_, event,
      result == HandleResult::processed ? DeliveryOutcome::processed : DeliveryOutcome::duplicate,
      ran);
  co_return result;
}

Task<HandleResult> AsyncHandlerCore::run_unobserved(const Event& event, BusProxy& bus,
                                                    Invoke invoke) {
  validate_key("event id", event.id);
  switch (mode_) {
    case HandlerMode::check_then_mark:
      co_return co_await run_check_then_mark(event, bus, invoke);
    case HandlerMode::exclusive:
      co_return co_await run_exclusive(event, bus, invoke);
    case HandlerMode::transactional:
      co_return co_await run_transactional(event, bus, invoke);
    case HandlerMode::automatic:
      break;  // resolved at construction
  }
  throw InvalidArgument("AsyncIdempotentHandler: unresolved mode");
}

Task<std::vector<HandleOutcome>> AsyncHandlerCore::run_batch(std::span<const Event> events,
                                                             BusProxy& bus, Invoke invoke) {
  if (mode_ != HandlerMode::check_then_mark) {
    std::vector<HandleOutcome> outcomes(events.size());
    for (std::size_t i = 0; i < events.size(); ++i) {
      try {
        outcomes[i].result = co_await run(events[i], bus, invoke);
      } catch (...) {
        outcomes[i].error = std::current_exception();
      }
    }
    co_return outcomes;
  }
  if (!observer_) co_return co_await run_batch_check_then_mark(events, bus, invoke);
  std::vector<std::optional<std::chrono::nanoseconds>> ran(events.size());
  const Invoke timed_invoke = [&](const Event& event, BusProxy& proxy) {
    // The window hands over the events themselves: the position says whose time it is.
    const auto index = static_cast<std::size_t>(&event - events.data());
    return timed(invoke, event, proxy, *clock_, ran[index]);
  };
  std::vector<HandleOutcome> outcomes =
      co_await run_batch_check_then_mark(events, bus, timed_invoke);
  idem::detail::observe_batch(*observer_, consumer_, events, outcomes, ran);
  co_return outcomes;
}

Task<std::vector<HandleOutcome>> AsyncHandlerCore::run_batch_check_then_mark(
    std::span<const Event> events, BusProxy& bus, const Invoke& invoke) {
  idem::detail::CheckMarkWindow window(events);
  std::vector<bool> processed;
  bool checked = true;
  try {
    processed = co_await recorder_->is_processed_many(consumer_, window.ids());
  } catch (...) {
    window.fail_checked();  // nothing ran: every event is redelivered and checked again
    checked = false;
  }
  if (!checked) co_return window.take();
  for (std::size_t k = 0; k < window.ids().size(); ++k) {
    if (!window.should_run(k, processed)) continue;
    try {
      co_await invoke(window.event(k), bus);
      window.succeeded(k);
    } catch (...) {
      window.failed(k);
    }
  }
  try {
    co_await recorder_->mark_processed_many(consumer_, window.to_mark());
    window.marked();
  } catch (...) {
    window.mark_failed();
  }
  co_return window.take();
}

Task<HandleResult> AsyncHandlerCore::run_check_then_mark(const Event& event, BusProxy& bus,
                                                         const Invoke& invoke) {
  const bool processed = co_await recorder_->is_processed(consumer_, event.id);
  if (processed) co_return HandleResult::duplicate;
  auto work = invoke(event, bus);
  co_await std::move(work);
  co_await recorder_->mark_processed(consumer_, event.id);
  co_return HandleResult::processed;
}

Task<HandleResult> AsyncHandlerCore::run_exclusive(const Event& event, BusProxy& bus,
                                                   const Invoke& invoke) {
  const Claim claim = co_await recorder_->claim(consumer_, event.id, lease_);
  if (!idem::detail::claim_says_run(claim, consumer_, event.id)) co_return HandleResult::duplicate;

  // handle runs in this coroutine (the caller's cancellation reaches its awaits); the lease is
  // renewed beside it, on a strand of this executor, until it ends. A fenced renewal only stops
  // renewing: complete() reports the loss.
  // (Named locals, not temporaries of an expression with a co_await: GCC bug 100611.)
  const asio::any_io_executor executor = co_await asio::this_coro::executor;
  async::detail::RenewFn renew = [recorder = recorder_, consumer = consumer_, event_id = event.id,
                                  token = claim.token, lease = lease_]() {
    return recorder->renew(consumer, event_id, token, lease);
  };
  std::exception_ptr failure;
  {
    async::detail::LeaseKeeper keeper(asio::make_strand(executor), clock_, lease_,
                                      std::move(renew));
    try {
      auto work = invoke(event, bus);
      co_await std::move(work);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (failure) {
    // A cancelled caller still gives its claim back: without this, every co_await from here on
    // would end with operation_aborted (Asio's throw_if_cancelled). Only this call is affected:
    // the handler's error is rethrown right after.
    co_await asio::this_coro::reset_cancellation_state(asio::disable_cancellation());
    try {
      co_await recorder_->release(consumer_, event.id, claim.token);
    } catch (...) {
      // The handler's own error matters more; an unreleased claim is taken over after its lease.
    }
    std::rethrow_exception(failure);
  }
  const bool completed = co_await recorder_->complete(consumer_, event.id, claim.token);
  if (!completed) idem::detail::throw_lease_lost(consumer_, event.id);
  co_return HandleResult::processed;
}

Task<HandleResult> AsyncHandlerCore::run_transactional(const Event& event, BusProxy& bus,
                                                       const Invoke& invoke) {
  std::vector<Event> held;
  AsyncRecorder::TransactionalFn fn = [&](AsyncSqlTransaction& tx) -> Task<void> {
    AsyncTransactionalProxy proxy(bus, tx);
    co_await invoke(event, proxy);
    held = proxy.take();
  };
  const bool ran = co_await recorder_->run_transactional(consumer_, event.id, std::move(fn));
  if (!ran) co_return HandleResult::duplicate;
  // Committed: now the follow-up events may leave.
  for (auto& follow_up : held)
    bus.publish(std::move(follow_up));
  co_return HandleResult::processed;
}

}  // namespace detail
}  // namespace idem::async
