// idem::async::operation: the builder face of idem::async::resilient, as idem::operation
// (idem/operation.hpp) is of idem::resilient.
//
//   auto charge = idem::async::operation("charge", charge_card)  // Task<Receipt>(std::string, int)
//       .with_retries(2)
//       .with_timeout(200ms)
//       .with_validation({{"has_id", [](const Receipt& r) { return !r.id.empty(); }}})
//       .with_idempotency({.key = [](const std::string& order, int) { return order; },
//                          .store = async_store});
//   idem::OperationResult<Receipt> r = co_await charge.run("o-1", 500);
//
// Operation<Task<T>(Params...)> is an immutable value with the blocking builder's with_*()
// methods, checks and messages (one template, detail/operation_builder.hpp): every with_*()
// replaces its policy, checks the result at once (idem::ConfigError) and returns a new
// operation, leaving the original unchanged. Validators check the T of Task<T>, fallbacks return
// Task<T>, and with_idempotency takes idem::async::IdempotencyOptions<Sig>, whose store is an
// AsyncStore (null: the process-wide in-memory store).
//
// run(args...) is exactly a call of the AsyncResilient that callable() returns (one engine: see
// idem/async/resilient.hpp for executors, cancellation and idempotency); run_with(CallOptions,
// args...) is its call_with: a caller that waits for a key in flight gives up on its stop token
// (idem::Cancelled) or at its wait deadline (idem::TimeoutError).
//
// Thread-safety: an Operation is immutable; run() may be called from any number of coroutines
// on any executors at once.
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "idem/async/resilient.hpp"
#include "idem/async/store.hpp"
#include "idem/async/task.hpp"
#include "idem/call_options.hpp"
#include "idem/detail/operation_builder.hpp"
#include "idem/operation_idempotency.hpp"

namespace idem::async {

// The idempotency settings of with_idempotency (operation_idempotency.hpp), with an AsyncStore.
template <class Signature>
using IdempotencyOptions = idem::IdempotencyOptions<Signature, AsyncStore>;

template <class Signature>
class Operation;

template <class R, class... Params>
class Operation<R(Params...)>
    : public idem::detail::OperationBuilder<Operation<R(Params...)>,
                                            detail::AsyncSpec<R, Params...>> {
  using Builder =
      idem::detail::OperationBuilder<Operation<R(Params...)>, detail::AsyncSpec<R, Params...>>;

 public:
  using Signature = R(Params...);
  using Spec = detail::AsyncSpec<R, Params...>;
  using value_type = typename Spec::Value;
  using result_type = OperationResult<value_type>;

  explicit Operation(std::shared_ptr<const Spec> spec) : Builder(std::move(spec)) {}

  // with_retry, with_retries, with_timeout, with_rate_limit, with_validation,
  // with_circuit_breaker, with_fallbacks, with_events, with_observer, with_idempotency,
  // without_idempotency, with_clock and name(): idem::detail::OperationBuilder.

  // The arguments (and a share of the configuration) live in the call's frame until it ends.
  Task<result_type> run(Params... args) const {
    return detail::AsyncEngine<R, Params...>::call(this->spec_, CallOptions{},
                                                   std::forward<Params>(args)...);
  }
  Task<result_type> run_with(const CallOptions& options, Params... args) const {
    return detail::AsyncEngine<R, Params...>::call(this->spec_, options,
                                                   std::forward<Params>(args)...);
  }

  // The same operation as a plain callable (shares the configuration).
  AsyncResilient<Signature> callable() const { return AsyncResilient<Signature>(this->spec_); }
};

// With the signature named (needed for generic lambdas):
// idem::async::operation<Task<Receipt>(const std::string&)>("charge", fn).
template <class Signature, class F>
Operation<Signature> operation(std::string name, F fn) {
  ResilientOptions<Signature> options;
  options.name = std::move(name);
  return Operation<Signature>(idem::detail::make_spec<typename Operation<Signature>::Spec>(
      std::move(fn), std::move(options)));
}

// The signature deduced from fn (one non-template operator()), as for idem::async::resilient.
template <class F>
requires(!std::is_function_v<F>) auto operation(std::string name, F fn) {
  static_assert(idem::detail::CallableTraits<std::decay_t<F>>::known,
                "idem::async::operation: cannot deduce the parameters of this function (a "
                "generic lambda?). Name the signature: "
                "idem::async::operation<idem::async::Task<Receipt>(std::string)>(name, fn)");
  return operation<idem::detail::deduced_signature_t<F>>(std::move(name), std::move(fn));
}

}  // namespace idem::async
