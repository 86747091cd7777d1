// Result validation: named checks a result must pass before it counts as a success.
//
// A Validator<T> has a name and a check on `const T&` that returns either
//   * bool                        — false rejects the result (reason: "rejected by <name>"), or
//   * std::optional<std::string>  — a reason rejects it, nullopt accepts it.
// Validators run in order after every successful primary attempt and every fallback; the first
// rejection turns the attempt into a failure with idem::ValidationError (validator name and
// reason). Such a failure is retried like any other failed attempt (retry_invalid_results,
// default true, as in relprim, Polly and resilience4j; false makes it final), and it counts as a
// failure for the circuit breaker.
//
//   .validate = {{"has_id", [](const Receipt& r) { return !r.id.empty(); }},
//                {"amount", [](const Receipt& r) -> std::optional<std::string> {
//                   if (r.amount <= 0) return "amount " + std::to_string(r.amount) + " <= 0";
//                   return std::nullopt; }}}
//
// For void operations a validator takes no argument.
//
// Thread-safety: validators are called concurrently from every thread that calls the operation;
// their checks must be safe to call so.
#pragma once

#include <concepts>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "idem/error.hpp"

namespace idem {

// A result rejected by a validator. retryable() is what the retry policy chose
// (RetryPolicy::retry_invalid_results).
class ValidationError : public Error {
 public:
  ValidationError(std::string validator, std::string reason, bool retryable = false);

  const std::string& validator() const noexcept { return validator_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string validator_{};
  std::string reason_{};
};

namespace detail {
template <class T>
struct ValidatorCheck {
  using type = std::function<std::optional<std::string>(const T&)>;
};
template <>
struct ValidatorCheck<void> {
  using type = std::function<std::optional<std::string>()>;
};

template <class F>
inline constexpr bool is_std_function_v = false;
template <class Sig>
inline constexpr bool is_std_function_v<std::function<Sig>> = true;

// True when `fn` is a null function pointer or an empty std::function.
template <class F>
bool is_null_callable(const F& fn) noexcept {
  if constexpr (std::is_pointer_v<F> || is_std_function_v<F>) {
    return !fn;
  } else {
    return false;
  }
}

template <class F, class... A>
std::optional<std::string> run_check(const F& fn, const std::string& name, const A&... value) {
  using Result = std::invoke_result_t<const F&, const A&...>;
  if constexpr (std::is_convertible_v<Result, bool> &&
                !std::is_convertible_v<Result, std::optional<std::string>>) {
    if (static_cast<bool>(fn(value...))) return std::nullopt;
    return "rejected by " + name;
  } else {
    static_assert(std::is_convertible_v<Result, std::optional<std::string>>,
                  "a validator returns bool or std::optional<std::string>");
    return static_cast<std::optional<std::string>>(fn(value...));
  }
}
}  // namespace detail

template <class T>
struct Validator {
  using Check = typename detail::ValidatorCheck<T>::type;

  std::string name{};  // shown in errors, events and reports
  Check check{};       // nullopt = valid; a string = the reason it is not

  Validator() = default;

  // Accepts a callable on `const T&` (nothing for void) returning bool or optional<string>.
  template <class F>
  requires(!std::same_as<std::remove_cvref_t<F>, Validator>)
      Validator(std::string validator_name, F fn)
      : name(std::move(validator_name)) {
    if (detail::is_null_callable(fn)) return;  // left empty: rejected when the options are checked
    if constexpr (std::is_void_v<T>) {
      static_assert(std::is_invocable_v<const F&>, "a void operation's validator takes nothing");
      check = [fn = std::move(fn), n = name]() { return detail::run_check(fn, n); };
    } else {
      static_assert(std::is_invocable_v<const F&, const T&>,
                    "a validator must be callable with the result as `const T&`");
      check = [fn = std::move(fn), n = name](const T& value) {
        return detail::run_check(fn, n, value);
      };
    }
  }
};

}  // namespace idem
