// The with_*() half of the builder faces, idem::Operation (operation.hpp) and
// idem::async::Operation (idem/async/operation.hpp): one template, so both faces configure an
// operation with the same methods, the same checks and the same messages.
//
// OperationBuilder<Derived, Spec> holds the shared, immutable configuration (a resolved Spec of
// either face). Every with_*() copies it, changes one policy (replacing it, never appending),
// resolves the copy (idem::ConfigError at once) and returns it as a new Derived; the original is
// unchanged. Derived must be constructible from std::shared_ptr<const Spec> and adds what
// differs between the faces: run(), run_with() and callable().
//
// Thread-safety: immutable; every method may be called from any number of threads.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "idem/circuit_breaker.hpp"
#include "idem/clock.hpp"
#include "idem/error.hpp"
#include "idem/events.hpp"
#include "idem/fallback.hpp"
#include "idem/observer.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/rate_limit.hpp"
#include "idem/retry.hpp"
#include "idem/validation.hpp"

namespace idem::detail {

template <class Derived, class Spec>
class OperationBuilder {
 public:
  using Signature = typename Spec::Signature;
  using value_type = typename Spec::Value;
  // IdempotencyOptions with the face's store (IdempotencyStore or async::AsyncStore).
  using Idempotency = IdempotencyOptions<Signature, typename Spec::Store>;

  Derived with_retry(RetryPolicy policy) const {
    return change([&](Spec& s) { s.core.retry = std::move(policy); });
  }
  // Retries after the first attempt, keeping the rest of the retry policy: the same count as
  // ResilientOptions::retries (with_retries(2) == with_retry({.max_attempts = 3})).
  Derived with_retries(int retries) const {
    if (retries < 0) {
      throw ConfigError("operation '" + spec_->core.name + "': retries must be >= 0, got " +
                        std::to_string(retries));
    }
    return change([&](Spec& s) { s.core.retry.max_attempts = retries + 1; });
  }
  // Deadline of each primary attempt (real time). Positive. `grace`: see
  // ResilientOptions::timeout_grace (default 0).
  Derived with_timeout(std::chrono::nanoseconds timeout,
                       std::chrono::nanoseconds grace = std::chrono::nanoseconds::zero()) const {
    return change([&](Spec& s) {
      s.core.timeout = timeout;
      s.core.timeout_grace = grace;
    });
  }
  // Rate-limit recovery (rate_limit.hpp); a default RateLimitPolicy{} removes it.
  Derived with_rate_limit(RateLimitPolicy policy) const {
    return change([&](Spec& s) { s.core.rate_limit = std::move(policy); });
  }
  Derived with_validation(std::vector<Validator<value_type>> validators) const {
    return change([&](Spec& s) { s.validators = std::move(validators); });
  }
  // Null removes the breaker.
  Derived with_circuit_breaker(std::shared_ptr<CircuitBreaker> breaker) const {
    return change([&](Spec& s) { s.core.breaker = std::move(breaker); });
  }
  // `fallback_on`: which failures of the primary start the chain, and of a fallback go on to the
  // next one (default: every failure).
  Derived with_fallbacks(std::vector<Fallback<Signature>> fallbacks,
                         FailurePredicate fallback_on = {}) const {
    return change([&](Spec& s) {
      s.fallbacks = std::move(fallbacks);
      s.core.fallback_on = std::move(fallback_on);
    });
  }
  Derived with_events(std::vector<std::shared_ptr<EventSink>> sinks) const {
    return change([&](Spec& s) { s.core.sinks = std::move(sinks); });
  }
  // Told how every call ended (see ResilientOptions::observer). Null removes it.
  Derived with_observer(std::shared_ptr<Observer> observer) const {
    return change([&](Spec& s) { s.core.observer = std::move(observer); });
  }
  Derived with_idempotency(Idempotency options) const {
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
  Derived without_idempotency() const {
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
  Derived with_clock(std::shared_ptr<Clock> clock) const {
    return change([&](Spec& s) { s.core.clock_option = std::move(clock); });
  }

  const std::string& name() const noexcept { return spec_->core.name; }

 protected:
  explicit OperationBuilder(std::shared_ptr<const Spec> spec) : spec_(std::move(spec)) {}

  std::shared_ptr<const Spec> spec_;

 private:
  template <class Change>
  Derived change(Change&& apply) const {
    auto next = std::make_shared<Spec>(*spec_);
    apply(*next);
    next->resolve();
    return Derived(std::move(next));
  }
};

}  // namespace idem::detail
