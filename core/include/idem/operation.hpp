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

#include "idem/detail/operation_builder.hpp"
#include "idem/resilient.hpp"

namespace idem {

template <class Signature>
class Operation;

template <class R, class... Params>
class Operation<R(Params...)>
    : public detail::OperationBuilder<Operation<R(Params...)>,
                                      detail::OperationSpec<R, Params...>> {
  using Builder =
      detail::OperationBuilder<Operation<R(Params...)>, detail::OperationSpec<R, Params...>>;

 public:
  using Signature = R(Params...);
  using value_type = std::remove_cvref_t<R>;
  using result_type = OperationResult<value_type>;
  using Spec = detail::OperationSpec<R, Params...>;

  explicit Operation(std::shared_ptr<const Spec> spec) : Builder(std::move(spec)) {}

  // with_retry, with_retries, with_timeout, with_rate_limit, with_validation,
  // with_circuit_breaker, with_fallbacks, with_events, with_observer, with_idempotency,
  // without_idempotency, with_clock and name(): detail::OperationBuilder
  // (detail/operation_builder.hpp).

  result_type run(Params... args) const {
    return detail::Engine<R, Params...>::call(this->spec_, CallOptions{}, args...);
  }
  result_type run_with(const CallOptions& options, Params... args) const {
    return detail::Engine<R, Params...>::call(this->spec_, options, args...);
  }

  // The same operation as a plain callable (shares the configuration).
  Resilient<Signature> callable() const { return Resilient<Signature>(this->spec_); }
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
