// Fallbacks: what to try, in order, once the primary operation has given up.
//
// The primary gives up when its retries are exhausted, its failure is not retryable, or the
// circuit breaker rejected it. Then each Fallback runs once, in order, with the same arguments;
// a fallback may also take a leading `const idem::FallbackContext&` to see why the primary
// failed. Each fallback's result goes through the operation's validators. The first fallback that
// returns a valid result wins (the report says fallback_used and which one). If every fallback
// fails, the operation fails with idem::FallbackChainError listing every failure — the primary's
// last one first, then each fallback's — as the cause of its OperationError. `fallback_on`, when
// set, also judges each fallback's failure, as relprim's FallbackPolicy does: one it does not
// accept stops the chain and is the cause itself.
//
// Fallbacks are not retried, not timed out and do not pass through the circuit breaker: they
// are the plan B for when the protected dependency is unavailable.
//
//   .fallbacks = {{"cache", [&](const std::string& id, int) { return cache.get(id); }},
//                 {"queue", [&](const idem::FallbackContext& why, const std::string& id, int) {
//                    return queue_for_later(id, why.error_message); }}}
//
// An unnamed fallback is called "fallback:<n>" (1-based position); a named one "fallback:<name>".
//
// Thread-safety: fallbacks are called concurrently from every thread that calls the operation.
// FallbackChainError is immutable.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "idem/detail/callable_traits.hpp"
#include "idem/error.hpp"
#include "idem/validation.hpp"

namespace idem {

// Why the primary gave up; valid only during the fallback call.
struct FallbackContext {
  std::exception_ptr error{};        // the primary's last failure
  std::string_view error_type{};     // its demangled type
  std::string_view error_message{};  // its what()
  int primary_attempts = 0;          // how many attempts the primary made
};

template <class Signature>
struct Fallback;

template <class R, class... Params>
struct Fallback<R(Params...)> {
  using Call = std::function<R(const FallbackContext&, detail::ArgRef<Params>...)>;

  std::string name{};  // optional; the report shows "fallback:<name>" or "fallback:<position>"
  Call call{};

  Fallback() = default;

  template <class F>
  requires(!std::same_as<std::remove_cvref_t<F>, Fallback>) Fallback(F fn)
      : Fallback(std::string(), std::move(fn)) {}  // NOLINT: implicit on purpose

  template <class F>
  Fallback(std::string fallback_name, F fn) : name(std::move(fallback_name)) {
    if (detail::is_null_callable(fn)) return;  // left empty: rejected when options are checked
    if constexpr (std::is_invocable_v<const F&, const FallbackContext&,
                                      detail::ArgRef<Params>...>) {
      call = std::move(fn);
    } else {
      static_assert(std::is_invocable_v<const F&, detail::ArgRef<Params>...>,
                    "a fallback takes the operation's arguments, optionally after a "
                    "`const idem::FallbackContext&`, and must be callable as const");
      call = [fn = std::move(fn)](const FallbackContext&, detail::ArgRef<Params>... args) -> R {
        return fn(args...);
      };
    }
  }
};

struct FallbackFailure {
  std::string source{};         // "primary" or "fallback:<name or position>"
  std::string error_type{};     // demangled exception type
  std::string error_message{};  // what()
  std::exception_ptr error{};   // the exception itself
};

// Every fallback failed. failures() holds the primary's last failure, then each fallback's.
class FallbackChainError : public Error {
 public:
  explicit FallbackChainError(std::vector<FallbackFailure> failures);
  const std::vector<FallbackFailure>& failures() const noexcept { return failures_; }

 private:
  std::vector<FallbackFailure> failures_{};
};

}  // namespace idem
