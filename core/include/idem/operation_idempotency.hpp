// The idempotency settings of a resilient operation.
//
// With a key function set, every call computes key(args...) and runs through the
// IdempotencyCoordinator of the chosen store (idempotency.hpp): the first caller executes the
// whole resilience lifecycle (breaker, retries, timeouts, validation, fallbacks) once; callers
// with the same key meanwhile join it and get its value or its exception; later callers replay
// the successful result for `ttl` (counted from completion) with the original report. Failures
// are never cached. A caller that joins or replays never starts retries, fallbacks or breaker
// checks of its own — a replay succeeds even while the breaker is open.
//
// `fingerprint` (opt-in) detects a key reused with different arguments: `true` hashes the
// arguments with idem::fingerprint (fingerprint.hpp), or pass your own function of the
// arguments. Same key, different fingerprint: idem::KeyReuseError, nothing runs.
//
// idem::resilient takes these as flat `idempotency_*` fields of ResilientOptions;
// idem::operation(...).with_idempotency(IdempotencyOptions<Sig>{...}) takes this struct.
//
// Thread-safety: plain values; the functions are called concurrently and must be safe so.
#pragma once

#include <chrono>
#include <concepts>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "idem/clock.hpp"
#include "idem/detail/callable_traits.hpp"
#include "idem/idempotency.hpp"
#include "idem/idempotency_store.hpp"

namespace idem {

template <class Signature>
class IdempotencyFingerprint;

// Off by default; `true` uses idem::fingerprint(args...); a function of the arguments returning
// a string uses that.
template <class R, class... Params>
class IdempotencyFingerprint<R(Params...)> {
 public:
  using Function = std::function<std::string(detail::ConstArg<Params>...)>;

  IdempotencyFingerprint() = default;
  IdempotencyFingerprint(bool use_default) : use_default_(use_default) {}  // NOLINT: implicit
  template <class F>
  requires(std::is_invocable_r_v<std::string, const F&, detail::ConstArg<Params>...> &&
           !std::same_as<std::remove_cvref_t<F>, bool>) IdempotencyFingerprint(F fn)
      : function_(std::move(fn)) {}  // NOLINT: implicit on purpose

  bool enabled() const noexcept { return use_default_ || static_cast<bool>(function_); }
  bool uses_default() const noexcept { return use_default_ && !function_; }
  const Function& function() const noexcept { return function_; }

 private:
  bool use_default_ = false;
  Function function_{};
};

template <class Signature>
struct IdempotencyOptions;

template <class R, class... Params>
struct IdempotencyOptions<R(Params...)> {
  using KeyFunction = std::function<std::string(detail::ConstArg<Params>...)>;

  // The key of a call, from its arguments. Required. Namespace it yourself
  // ("create-payment:" + id): keys are shared by every operation using the same store.
  KeyFunction key{};
  // How long a success is replayed, from completion. Positive. Default 1 h.
  Millis ttl = std::chrono::hours(1);
  // Where records live. Default (null): the process-wide in-memory store.
  std::shared_ptr<IdempotencyStore> store{};
  // Detect a key reused with different arguments. Default: off.
  IdempotencyFingerprint<R(Params...)> fingerprint{};
  // A caller finding the key in progress in another process waits or is rejected. Default wait.
  InProgressPolicy in_progress = InProgressPolicy::wait;
  // The longest such a caller waits before AlreadyInProgress. >= 0. Default 30 s.
  Millis max_wait = std::chrono::seconds(30);
  // The owner's lease, renewed while it runs. Positive. Default 30 s.
  Millis lease = std::chrono::seconds(30);
};

}  // namespace idem
