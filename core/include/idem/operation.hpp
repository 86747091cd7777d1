// idem::operation: the builder face of the resilient-operation engine.
//
//   auto create_payment = idem::operation("create_payment", charge)
//       .with_retry({.max_attempts = 3, .backoff = {.base = 50ms}})
//       .with_timeout(2s)
//       .with_validation({{"has_id", [](const Receipt& r) { return !r.id.empty(); }}})
//       .with_circuit_breaker(gateway_breaker)
//       .with_fallbacks({{"queue", queue_for_later}})
//       .with_events({sink})
//       .with_idempotency({.key = [](const std::string& id, int) { return "pay:" + id; }});
//   auto result = create_payment.run("request-123", 2499);
//
// Operation<R(Params...)> is an immutable value: every with_*() returns a new operation and
// leaves the original unchanged, so a base configuration can be specialised safely. Each with_*()
// replaces that policy (it does not append) and checks the result at once (idem::ConfigError).
// run() is exactly a call of idem::resilient with the same settings — one engine, see
// resilient.hpp for the semantics and docs/resilience.md for the order of the policies.
//
// One configuration, two spellings: every with_*() sets the ResilientOptions field of the same
// name and default (docs/resilience.md §2 has the one table). with_retries(n) counts retries
// like ResilientOptions::retries; with_retry(RetryPolicy) takes the whole policy, whose
// max_attempts counts attempts. Without either, an operation makes one attempt, as resilient()
// does.
//
// Thread-safety: an Operation is immutable; run() may be called from any number of threads.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "idem/resilient.hpp"

namespace idem {

template <class Signature>
class Operation;

template <class R, class... Params>
class Operation<R(Params...)> {
 public:
  using Signature = R(Params...);
  using value_type = std::remove_cvref_t<R>;
  using result_type = OperationResult<value_type>;
  using Spec = detail::OperationSpec<R, Params...>;

  explicit Operation(std::shared_ptr<const Spec> spec) : spec_(std::move(spec)) {}

  Operation with_retry(RetryPolicy policy) const {
    return change([&](Spec& s) { s.core.retry = std::move(policy); });
  }
  // Retries after the first attempt, keeping the rest of the retry policy: the same count as
  // ResilientOptions::retries (with_retries(2) == with_retry({.max_attempts = 3})).
  Operation with_retries(int retries) const {
    if (retries < 0) {
      throw ConfigError("operation '" + spec_->core.name + "': retries must be >= 0, got " +
                        std::to_string(retries));
    }
    return change([&](Spec& s) { s.core.retry.max_attempts = retries + 1; });
  }
  // Deadline of each primary attempt (real time). Positive. `grace`: see
  // ResilientOptions::timeout_grace (default 0).
  Operation with_timeout(std::chrono::nanoseconds timeout,
                         std::chrono::nanoseconds grace = std::chrono::nanoseconds::zero()) const {
    return change([&](Spec& s) {
      s.core.timeout = timeout;
      s.core.timeout_grace = grace;
    });
  }
  // Rate-limit recovery (rate_limit.hpp); a default RateLimitPolicy{} removes it.
  Operation with_rate_limit(RateLimitPolicy policy) const {
    return change([&](Spec& s) { s.core.rate_limit = std::move(policy); });
  }
  Operation with_validation(std::vector<Validator<value_type>> validators) const {
    return change([&](Spec& s) { s.validators = std::move(validators); });
  }
  // Null removes the breaker.
  Operation with_circuit_breaker(std::shared_ptr<CircuitBreaker> breaker) const {
    return change([&](Spec& s) { s.core.breaker = std::move(breaker); });
  }
  // `fallback_on`: which failures of the primary start the chain (default: every failure).
  Operation with_fallbacks(std::vector<Fallback<Signature>> fallbacks,
                           FailurePredicate fallback_on = {}) const {
    return change([&](Spec& s) {
      s.fallbacks = std::move(fallbacks);
      s.core.fallback_on = std::move(fallback_on);
    });
  }
  Operation with_events(std::vector<std::shared_ptr<EventSink>> sinks) const {
    return change([&](Spec& s) { s.core.sinks = std::move(sinks); });
  }
  Operation with_idempotency(IdempotencyOptions<Signature> options) const {
    if (!options.key) {
      throw ConfigError("operation '" + spec_->core.name +
                        "': with_idempotency needs a key function");
    }
    return change([&](Spec& s) {
      s.key = std::move(options.key);
      s.scope = std::move(options.scope);
      s.ttl = options.ttl;
      s.store = std::move(options.store);
      s.fingerprint = std::move(options.fingerprint);
      s.in_progress = options.in_progress;
      s.max_wait = options.max_wait;
      s.lease = options.lease;
    });
  }
  // Removes idempotency.
  Operation without_idempotency() const {
    return change([](Spec& s) {
      s.key = nullptr;
      s.scope.reset();
      s.ttl.reset();
      s.store.reset();
      s.fingerprint = {};
      s.in_progress.reset();
      s.max_wait.reset();
      s.lease.reset();
    });
  }
  // Time source (see ResilientOptions::clock). Null: the system clock.
  Operation with_clock(std::shared_ptr<Clock> clock) const {
    return change([&](Spec& s) { s.core.clock_option = std::move(clock); });
  }

  result_type run(Params... args) const {
    return detail::Engine<R, Params...>::call(spec_, CallOptions{}, args...);
  }
  result_type run_with(const CallOptions& options, Params... args) const {
    return detail::Engine<R, Params...>::call(spec_, options, args...);
  }

  // The same operation as a plain callable (shares the configuration).
  Resilient<Signature> callable() const { return Resilient<Signature>(spec_); }

  const std::string& name() const noexcept { return spec_->core.name; }

 private:
  template <class Change>
  Operation change(Change&& apply) const {
    auto next = std::make_shared<Spec>(*spec_);
    apply(*next);
    next->resolve();
    return Operation(std::move(next));
  }

  std::shared_ptr<const Spec> spec_;
};

// With the signature named (needed for generic lambdas).
template <class Signature, class F>
Operation<Signature> operation(std::string name, F fn) {
  ResilientOptions<Signature> options;
  options.name = std::move(name);
  return Operation<Signature>(
      detail::make_spec<typename Operation<Signature>::Spec>(std::move(fn), std::move(options)));
}

// The signature deduced from fn, as for idem::resilient.
template <class F>
requires(!std::is_function_v<F>) auto operation(std::string name, F fn) {
  static_assert(detail::CallableTraits<std::decay_t<F>>::known,
                "idem::operation: cannot deduce the parameters of this function (a generic "
                "lambda or an overloaded function object?). Name the signature: "
                "idem::operation<Receipt(const std::string&, int)>(name, fn)");
  return operation<detail::deduced_signature_t<F>>(std::move(name), std::move(fn));
}

}  // namespace idem
