// idem::resilient: wrap a call in retries, timeouts, a circuit breaker, validation, fallbacks,
// an execution report and structured events — with idempotency around the whole lifecycle.
//
//   auto create_payment = idem::resilient(
//       [&](const std::string& request_id, int amount) { return gateway.create(request_id, amount);
//       },
//       {.retries = 2, .timeout = 10s,
//        .idempotency_key = [](const std::string& id, int) { return "create-payment:" + id; },
//        .idempotency_ttl = 1h});
//   auto first  = create_payment("request-123", 2499);  // report.metadata["idempotency_status"]
//   auto second = create_payment("request-123", 2499);  //   "executed", then "replayed"
//
// resilient(fn, options) returns a Resilient<R(Params...)>: a callable with fn's parameters
// (a leading idem::AttemptContext& or std::stop_token parameter of fn is supplied by idem and
// not part of them)
// returning idem::OperationResult<T>{value, report} with T = fn's result without cv/ref
// (OperationResult<void> has only the report). Failure throws idem::OperationError carrying the
// final ExecutionReport and the cause (operation_result.hpp).
//
// Every option has a default, so resilient(fn) alone is a plain call with a report; options are
// checked at construction and contradictory ones throw idem::ConfigError. The semantics of each
// policy are in retry.hpp, timeout.hpp, circuit_breaker.hpp, validation.hpp, fallback.hpp,
// events.hpp and operation_idempotency.hpp; the whole picture is in docs/resilience.md.
// idem::operation(name, fn) (operation.hpp) is the same engine behind a builder.
//
// Arguments are passed to fn as lvalues, once per attempt, so fn may take them by value (a fresh
// copy per attempt) or by reference, not by rvalue reference. With a timeout the attempt runs on
// its own thread with copies of the arguments.
//
// Thread-safety: a Resilient is immutable; copies share one configuration and may be called from
// any number of threads at once. The functions you give it (fn, validators, fallbacks, key and
// fingerprint functions, sinks, the observer) are called concurrently and must be safe so.
#pragma once

#include <chrono>
#include <concepts>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "idem/call_options.hpp"
#include "idem/circuit_breaker.hpp"
#include "idem/clock.hpp"
#include "idem/detail/callable_traits.hpp"
#include "idem/detail/operation_engine.hpp"
#include "idem/events.hpp"
#include "idem/fallback.hpp"
#include "idem/idempotency.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/observer.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/operation_result.hpp"
#include "idem/rate_limit.hpp"
#include "idem/retry.hpp"
#include "idem/timeout.hpp"
#include "idem/validation.hpp"

namespace idem {

// The options of both faces: `Value` is what a call produces (R without cv/ref for the blocking
// face, T of Task<T> for the async face) and `Store` the idempotency store protocol of the face.
template <class Signature, class Value, class Store>
struct BasicResilientOptions;

// Designated initialisers must follow this field order.
template <class R, class... Params, class V, class Store>
struct BasicResilientOptions<R(Params...), V, Store> {
  using Value = V;

  // Name in reports, events and errors. Not empty. Default "operation".
  std::string name = "operation";

  // Retries after the first attempt (N retries = N + 1 attempts). >= 0. Default 0: resilient()
  // retries only when asked, since a retry of a non-idempotent call may repeat its effect.
  int retries = 0;
  // Waits between attempts. Default: 100 ms doubling up to 10 s, full jitter (retry.hpp).
  Backoff backoff{};
  // Which failures are retried. Default: empty = idem::default_retry_on (retry.hpp).
  RetryPredicate retry_on{};
  // Retry failures whose outcome is in doubt (Error::in_doubt()). Default false.
  bool retry_in_doubt = false;
  // Retry results rejected by a validator (an invalid result is a failed attempt). Default true.
  bool retry_invalid_results = true;

  // Which failures are rate limits, e.g. idem::failures_of<TooManyRequests>() (rate_limit.hpp).
  // Default: empty = rate limits are not handled.
  FailurePredicate rate_limit_on{};
  // The provider's delay for a rate-limited failure (idem::parse_retry_after reads an HTTP
  // Retry-After); nullopt = none, the backoff applies. Default: empty = always the backoff.
  std::function<std::optional<std::chrono::nanoseconds>(const std::exception&)> retry_after{};
  // The longest rate-limit wait accepted; longer ends the retries with RateLimitWaitExceeded.
  // >= 0. Default 60 s.
  std::chrono::nanoseconds max_rate_limit_wait = std::chrono::seconds(60);

  // Deadline of each primary attempt, measured in real time. Positive. Default: none.
  std::optional<std::chrono::nanoseconds> timeout{};
  // After a timed-out attempt is asked to stop, how long the caller waits for it to end before
  // it moves on (timeout.hpp). >= 0. Default 0: at once.
  std::chrono::nanoseconds timeout_grace{0};

  // Guards each primary attempt; may be shared between operations. Default: none.
  std::shared_ptr<CircuitBreaker> circuit_breaker{};

  // Checks every result (primary and fallback) must pass. Default: none.
  std::vector<Validator<Value>> validate{};

  // Tried once the primary gives up: `fallback` first, then `fallbacks` in order. Default none.
  Fallback<R(Params...)> fallback{};
  std::vector<Fallback<R(Params...)>> fallbacks{};
  // Which failures of the primary start the fallbacks, and of a fallback go on to the next one;
  // any other propagates at once. Default: empty = every failure.
  FailurePredicate fallback_on{};

  // Where structured events go. Default: nowhere (no events are built).
  std::vector<std::shared_ptr<EventSink>> events{};
  // Told how every call ended (outcome and duration; observer.hpp), e.g. an idem::Metrics.
  // Default: none (one null check per call).
  std::shared_ptr<Observer> observer{};

  // The idempotency key of a call, from its arguments. Default: none (no idempotency). All
  // other idempotency_* options require it.
  typename IdempotencyOptions<R(Params...)>::KeyFunction idempotency_key{};
  // The namespace of the keys (IdempotencyOptions::scope). Default (unset): `name`; an unnamed
  // operation gets a scope of its own in memory and needs a name or scope for a store that needs
  // bytes. Same scope = shared results; "" = the unscoped key space.
  std::optional<std::string> idempotency_scope{};
  // How long a success is replayed, from completion. Positive. Default (unset): 1 h.
  std::optional<Millis> idempotency_ttl{};
  // Where records live. Default (null): the process-wide in-memory store.
  std::shared_ptr<Store> idempotency_store{};
  // `true` or a function of the arguments: detect a key reused with other arguments. Default off.
  IdempotencyFingerprint<R(Params...)> idempotency_fingerprint{};
  // A key in progress in another process: wait or reject. Default (unset): wait.
  std::optional<InProgressPolicy> idempotency_in_progress{};
  // The longest such a wait lasts before AlreadyInProgress. >= 0. Default (unset): 30 s.
  std::optional<Millis> idempotency_max_wait{};
  // The owner's lease on the key, renewed while it runs. Positive. Default (unset): 30 s.
  std::optional<Millis> idempotency_lease{};

  // Time for backoff waits, breaker-free bookkeeping, reports, events and idempotency expiry.
  // Default: the system clock. (Breakers use their own clock.)
  std::shared_ptr<Clock> clock{};
  // Jitter draws in [0, 1); called under a lock. Default: a thread-local PRNG.
  RandomSource random{};
};

namespace detail {
template <class Signature>
struct BlockingOptions;
template <class R, class... Params>
struct BlockingOptions<R(Params...)> {
  using type = BasicResilientOptions<R(Params...), std::remove_cvref_t<R>, IdempotencyStore>;
};
}  // namespace detail

// The options of idem::resilient / idem::operation for a function R(Params...).
template <class Signature>
using ResilientOptions = typename detail::BlockingOptions<Signature>::type;

template <class Signature>
class Resilient;

template <class R, class... Params>
class Resilient<R(Params...)> {
 public:
  using value_type = std::remove_cvref_t<R>;
  using result_type = OperationResult<value_type>;
  using Spec = detail::OperationSpec<R, Params...>;

  explicit Resilient(std::shared_ptr<const Spec> spec) : spec_(std::move(spec)) {}

  result_type operator()(Params... args) const {
    return detail::Engine<R, Params...>::call(spec_, no_options(), args...);
  }

  // The same call with per-call settings (a waiter's stop token / deadline).
  result_type call_with(const CallOptions& options, Params... args) const {
    return detail::Engine<R, Params...>::call(spec_, options, args...);
  }

  const std::string& name() const noexcept { return spec_->core.name; }

 private:
  static const CallOptions& no_options() noexcept {
    static const CallOptions kNone{};
    return kNone;
  }

  std::shared_ptr<const Spec> spec_{};
};

namespace detail {

// "operation#<n>": a scope no other operation in this process has (defined in
// operation_support.cpp).
std::string next_anonymous_scope();

// A resolved Spec (either face's) from a function and its options.
template <class Spec, class F, class Options>
std::shared_ptr<const Spec> make_spec(F fn, Options&& options) {
  auto spec = std::make_shared<Spec>();
  spec->primary = Spec::wrap(std::move(fn));
  spec->core.name = std::move(options.name);
  if (options.retries < 0) {
    throw ConfigError("operation '" + spec->core.name + "': retries must be >= 0, got " +
                      std::to_string(options.retries));
  }
  spec->core.retry.max_attempts = options.retries + 1;
  spec->core.retry.backoff = options.backoff;
  spec->core.retry.retry_on = std::move(options.retry_on);
  spec->core.retry.retry_in_doubt = options.retry_in_doubt;
  spec->core.retry.retry_invalid_results = options.retry_invalid_results;
  spec->core.retry.random = std::move(options.random);
  spec->core.rate_limit.rate_limit_on = std::move(options.rate_limit_on);
  spec->core.rate_limit.retry_after = std::move(options.retry_after);
  spec->core.rate_limit.max_wait = options.max_rate_limit_wait;
  spec->core.timeout = options.timeout;
  spec->core.timeout_grace = options.timeout_grace;
  spec->core.breaker = std::move(options.circuit_breaker);
  spec->core.fallback_on = std::move(options.fallback_on);
  spec->core.sinks = std::move(options.events);
  spec->core.observer = std::move(options.observer);
  spec->core.clock_option = std::move(options.clock);
  spec->validators = std::move(options.validate);
  if (options.fallback.call || !options.fallback.name.empty()) {
    spec->fallbacks.push_back(std::move(options.fallback));
  }
  for (auto& fallback : options.fallbacks)
    spec->fallbacks.push_back(std::move(fallback));
  spec->key = std::move(options.idempotency_key);
  spec->scope = std::move(options.idempotency_scope);
  spec->anonymous_scope = spec->core.name == "operation" ? next_anonymous_scope() : std::string();
  spec->ttl = options.idempotency_ttl;
  spec->store = std::move(options.idempotency_store);
  spec->fingerprint = std::move(options.idempotency_fingerprint);
  spec->in_progress = options.idempotency_in_progress;
  spec->max_wait = options.idempotency_max_wait;
  spec->lease = options.idempotency_lease;
  spec->resolve();
  return spec;
}

}  // namespace detail

// With the signature named (needed for generic lambdas): resilient<R(Params...)>(fn, {...}).
template <class Signature, class F>
Resilient<Signature> resilient(F fn, ResilientOptions<Signature> options = {}) {
  return Resilient<Signature>(
      detail::make_spec<typename Resilient<Signature>::Spec>(std::move(fn), std::move(options)));
}

// The signature deduced from fn (a function, function pointer, or lambda / function object with
// one non-template operator()).
template <class F>
requires(!std::is_function_v<F>) auto resilient(
    F fn, ResilientOptions<detail::deduced_signature_t<F>> options = {}) {
  static_assert(detail::CallableTraits<std::decay_t<F>>::known,
                "idem::resilient: cannot deduce the parameters of this function (a generic "
                "lambda or an overloaded function object?). Name the signature: "
                "idem::resilient<Receipt(const std::string&, int)>(fn, {...})");
  return resilient<detail::deduced_signature_t<F>>(std::move(fn), std::move(options));
}

}  // namespace idem
