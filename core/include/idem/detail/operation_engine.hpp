// Internal: the one engine behind idem::resilient and idem::operation.
//
// OperationSpec holds everything one operation was configured with; it is immutable once
// resolve() has checked it, and shared (std::shared_ptr<const OperationSpec>) by every copy of
// the callable, every call and every attempt still running in the background after a timeout.
//
// Order of policies for one call (docs/resilience.md):
//   idempotency (outermost: join / replay / execute)
//     -> retry loop, for each attempt: circuit breaker -> timeout -> the function -> validation
//     -> fallbacks, once the primary gave up
//
// Thread-safety: call() may run on any number of threads at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include "idem/call_options.hpp"
#include "idem/circuit_breaker.hpp"
#include "idem/codec.hpp"
#include "idem/detail/callable_traits.hpp"
#include "idem/detail/operation_support.hpp"
#include "idem/error.hpp"
#include "idem/events.hpp"
#include "idem/fallback.hpp"
#include "idem/fingerprint.hpp"
#include "idem/idempotency.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/operation_result.hpp"
#include "idem/retry.hpp"
#include "idem/timeout.hpp"
#include "idem/validation.hpp"

namespace idem::detail {

// Emits idempotency.* events; defined in operation_support.cpp.
void emit_idempotency_event(const PolicyCore& core, EventType type, const std::string& key,
                            std::string_view reason);
// The scope an operation's keys live in (see IdempotencyOptions::scope); throws ConfigError for a
// scope that cannot work. Defined in operation_support.cpp.
std::string resolve_scope(const std::string& who, const std::string& name,
                          const std::optional<std::string>& scope,
                          const std::string& anonymous_scope, bool durable);
// scoped_idempotency_key(scope, key) after validating `key` alone; InvalidKey names the operation
// and both parts when the scoped key is too long.
std::string scoped_key_for(const std::string& operation, const std::string& scope,
                           const std::string& key);
// Throws ConfigError for idempotency settings that cannot work.
void check_idempotency_settings(const std::string& operation, Millis ttl, Millis lease,
                                Millis max_wait);

// Whether idem::fingerprint can encode a T. fingerprint() itself is unconstrained (it
// static_asserts), so this mirrors the kinds listed in fingerprint.hpp; it lets
// `idempotency_fingerprint = true` fail with a ConfigError instead of a compile error in every
// operation whose arguments it cannot encode.
template <class T>
constexpr bool fingerprintable() {
  using U = std::remove_cvref_t<T>;
  // NOLINTNEXTLINE(bugprone-branch-clone): one branch per kind of argument, for the reader
  if constexpr (std::is_same_v<U, bool> || std::is_same_v<U, char> || std::is_enum_v<U> ||
                std::is_integral_v<U>) {
    return true;
  } else if constexpr (std::is_same_v<U, std::nullptr_t> || std::is_same_v<U, long double>) {
    return false;
  } else if constexpr (std::is_pointer_v<U>) {
    return std::is_convertible_v<U, const char*>;
  } else if constexpr (std::is_floating_point_v<U> ||
                       std::is_convertible_v<const U&, std::string_view> || is_basic_json_v<U>) {
    return true;
  } else if constexpr (is_optional_v<U>) {
    return fingerprintable<typename U::value_type>();
  } else {
    return JsonConvertible<U> || HasCodec<U>;
  }
}

template <class... Args>
concept DefaultFingerprintable = (fingerprintable<Args>() && ...);

// What tells the two faces' specs apart: the value a call produces, the store protocol, and how
// an operation finds its coordinator. The async face has its own (idem/async/resilient.hpp).
struct BlockingFace {
  template <class R>
  using value_t = std::remove_cvref_t<R>;
  using Store = IdempotencyStore;
  // The blocking store the coordinator's policy names (null: the default store).
  static std::shared_ptr<IdempotencyStore> policy_store(const std::shared_ptr<Store>& store) {
    return store;
  }
  static std::shared_ptr<IdempotencyCoordinator> coordinator_for(
      const std::shared_ptr<Store>& store) {
    return IdempotencyCoordinator::for_store(store);
  }
};

template <class Face, class R, class... Params>
struct BasicOperationSpec {
  using Value = typename Face::template value_t<R>;
  using Signature = R(Params...);
  using Store = typename Face::Store;
  using Primary = std::function<R(AttemptContext&, ArgRef<Params>...)>;
  using KeyFunction = std::function<std::string(ConstArg<Params>...)>;

  static_assert(!(std::is_rvalue_reference_v<Params> || ...),
                "idem: the function takes a parameter by rvalue reference; a retry passes the "
                "arguments again, so take them by value or by const reference");

  // The arguments can be copied for an attempt that runs on its own thread (timeouts).
  static constexpr bool kArgumentsCopyable =
      ((std::is_copy_constructible_v<std::remove_cvref_t<Params>> &&
        !(std::is_lvalue_reference_v<Params> &&
          !std::is_const_v<std::remove_reference_t<Params>>)) &&
       ...);

  PolicyCore core;
  Primary primary;
  std::vector<Validator<Value>> validators;
  std::vector<Fallback<Signature>> fallbacks;

  // Idempotency, as configured.
  KeyFunction key;
  std::optional<std::string> scope;  // as configured
  std::string anonymous_scope;       // "operation#<n>" for an unnamed operation, else empty
  std::optional<Millis> ttl;
  std::shared_ptr<typename Face::Store> store;
  IdempotencyFingerprint<Signature> fingerprint;
  std::optional<InProgressPolicy> in_progress;
  std::optional<Millis> max_wait;
  std::optional<Millis> lease;

  // Idempotency, resolved.
  std::string resolved_scope;
  IdempotencyPolicy policy;
  std::shared_ptr<IdempotencyCoordinator> coordinator;
  std::optional<ErasedCodec> codec;

  // Checks everything (ConfigError) and resolves defaults. Call after any change.
  void resolve() {
    std::vector<std::string> fallback_names;
    fallback_names.reserve(fallbacks.size());
    for (const auto& fallback : fallbacks)
      fallback_names.push_back(fallback.name);
    core.validator_names.clear();
    for (const auto& validator : validators)
      core.validator_names.push_back(validator.name);
    core.idempotency_enabled = static_cast<bool>(key);
    core.resolve(fallback_names);
    if (core.fallback_on && fallbacks.empty()) {
      throw ConfigError("operation '" + core.name +
                        "': fallback_on is set but there is no fallback");
    }
    const std::string who = "operation '" + core.name + "'";
    if (!primary) throw ConfigError(who + ": the function is empty");
    if (core.timeout && !kArgumentsCopyable) {
      throw ConfigError(who +
                        ": a timeout runs each attempt on its own thread with copies of the "
                        "arguments, but a parameter is not copyable or is a non-const reference "
                        "(an abandoned attempt could outlive it); take it by value, const& or "
                        "pointer");
    }
    for (const auto& validator : validators) {
      if (validator.name.empty()) throw ConfigError(who + ": a validator has no name");
      if (!validator.check) {
        throw ConfigError(who + ": validator '" + validator.name + "' has no function");
      }
    }
    for (std::size_t i = 0; i < fallbacks.size(); ++i) {
      if (!fallbacks[i].call) {
        throw ConfigError(who + ": " + core.fallback_sources[i] + " has no function");
      }
    }
    resolve_idempotency(who);
  }

  void resolve_idempotency(const std::string& who) {
    coordinator.reset();
    codec.reset();
    if (!key) {
      if (store || scope || ttl || fingerprint.enabled() || in_progress || max_wait || lease) {
        throw ConfigError(
            who +
            ": idempotency settings (store, scope, ttl, fingerprint, in-progress policy, "
            "max wait, lease) are given without an idempotency key function");
      }
      return;
    }
    if constexpr (!std::is_void_v<Value> && !std::is_copy_constructible_v<Value>) {
      throw ConfigError(who +
                        ": idempotency replays the result to many callers, so the result "
                        "type must be copyable");
    }
    if (fingerprint.uses_default()) {
      if constexpr (!DefaultFingerprintable<std::remove_cvref_t<Params>...>) {
        throw ConfigError(who +
                          ": idempotency_fingerprint = true, but idem::fingerprint cannot "
                          "encode these argument types; pass a fingerprint function");
      }
    }
    resolved_scope =
        resolve_scope(who, core.name, scope, anonymous_scope, store && store->needs_bytes());
    policy = IdempotencyPolicy{};
    policy.store = Face::policy_store(store);
    if (ttl) policy.ttl = *ttl;
    if (lease) policy.lease = *lease;
    if (in_progress) policy.in_progress = *in_progress;
    if (max_wait) policy.max_wait = *max_wait;
    policy.clock = core.clock;
    check_idempotency_settings(core.name, policy.ttl, policy.lease, policy.max_wait);
    if (store && store->needs_bytes()) {
      if constexpr (std::is_void_v<Value>) {
        codec = ErasedCodec{[](const void*) { return std::string(); },
                            [](std::string_view) { return std::shared_ptr<const void>(); }};
      } else if constexpr (HasCodec<Value>) {
        codec = ErasedCodec{[](const void* object) {
                              return Codec<Value>::encode(*static_cast<const Value*>(object));
                            },
                            [](std::string_view bytes) -> std::shared_ptr<const void> {
                              return std::make_shared<const Value>(Codec<Value>::decode(bytes));
                            }};
      } else {
        throw ConfigError(who +
                          ": the idempotency store keeps results as bytes, but the result "
                          "type has no idem::Codec (specialise idem::Codec<T> or give T "
                          "nlohmann-json to_json/from_json)");
      }
    }
    coordinator = Face::coordinator_for(store);
  }

  template <class F>
  static Primary wrap(F fn) {
    if constexpr (std::is_invocable_v<const F&, ArgRef<Params>...>) {
      return [fn = std::move(fn)](AttemptContext&, ArgRef<Params>... args) -> R {
        return fn(args...);
      };
    } else if constexpr (std::is_invocable_v<const F&, std::stop_token, ArgRef<Params>...> &&
                         !std::is_invocable_v<const F&, AttemptContext&, ArgRef<Params>...>) {
      return [fn = std::move(fn)](AttemptContext& context, ArgRef<Params>... args) -> R {
        return fn(context.stop, args...);
      };
    } else {
      static_assert(std::is_invocable_v<const F&, AttemptContext&, ArgRef<Params>...>,
                    "idem: the function must be callable as const (it is shared between "
                    "threads, so no mutable lambda) with the operation's parameters, optionally "
                    "after a leading idem::AttemptContext& or std::stop_token");
      return [fn = std::move(fn)](AttemptContext& context, ArgRef<Params>... args) -> R {
        return fn(context, args...);
      };
    }
  }
};

template <class R, class... Params>
using OperationSpec = BasicOperationSpec<BlockingFace, R, Params...>;

template <class Value>
struct Validation {
  template <class Validators, class... V>
  static void run(const Validators& validators, bool retryable, const V&... value) {
    for (const auto& validator : validators) {
      if (auto reason = validator.check(value...)) {
        throw ValidationError(validator.name, std::move(*reason), retryable);
      }
    }
  }
};

// ---- the idempotency layer's pieces shared by both faces ----

// Called inside a catch block around the coordinator: the rejections (AlreadyInProgress,
// KeyReuseError, ReentryError) emit idempotency.rejected; everything is rethrown as is (the
// coordinator names the caller's key, IdempotentCall::caller_key). Defined in
// operation_support.cpp.
[[noreturn]] void rethrow_idempotency_rejection(const PolicyCore& core,
                                                const std::string& user_key);
// Emits joined/replayed/takeover events and writes the caller's key, the scope and the stored
// key into the report. Defined in operation_support.cpp.
void note_idempotent_outcome(const PolicyCore& core, CoordinatedResult& outcome,
                             const std::string& user_key, const std::string& scope,
                             const std::string& stored_key);

// The coordinator's request for one keyed call (without the caller's stop/deadline); the
// caller's key moves into its caller_key.
template <class Spec, class... A>
IdempotentCall idempotent_request(const Spec& s, std::string user_key, const A&... args) {
  using Value = typename Spec::Value;
  IdempotentCall request;
  request.key = scoped_key_for(s.core.name, s.resolved_scope, user_key);
  request.caller_key = std::move(user_key);
  if (s.fingerprint.function()) {
    request.fingerprint = s.fingerprint.function()(args...);
  } else if (s.fingerprint.uses_default() || s.fingerprint.is_automatic()) {
    // Automatic: arguments idem::fingerprint cannot encode leave the call without a fingerprint.
    if constexpr (DefaultFingerprintable<std::remove_cvref_t<A>...>) {
      request.fingerprint = idem::fingerprint(args...);
    }
  }
  request.codec = s.codec ? &*s.codec : nullptr;
  request.type = std::type_index(typeid(Value));
  request.operation = s.core.name;
  return request;
}

// An owner's successful OperationResult as the coordinator's Execution.
template <class Value, class Result>
Execution execution_of(Result&& result) {
  if constexpr (std::is_void_v<Value>) {
    return Execution{nullptr, std::move(result.report)};
  } else {
    return Execution{std::make_shared<const Value>(std::move(result.value)),
                     std::move(result.report)};
  }
}

// The coordinated outcome as the caller's OperationResult.
template <class Value, class Spec>
OperationResult<Value> idempotent_result(const Spec& s, CoordinatedResult&& outcome,
                                         const std::string& user_key,
                                         const std::string& stored_key) {
  note_idempotent_outcome(s.core, outcome, user_key, s.resolved_scope, stored_key);
  if constexpr (std::is_void_v<Value>) {
    return OperationResult<Value>{std::move(outcome.report)};
  } else {
    if (!outcome.value) {
      throw DecodeError("idempotency key '" + stored_key + "' of operation '" + s.core.name +
                        "' produced no value");
    }
    return OperationResult<Value>{*static_cast<const Value*>(outcome.value.get()),
                                  std::move(outcome.report)};
  }
}

template <class R, class... Params>
class Engine {
 public:
  using Spec = OperationSpec<R, Params...>;
  using Value = typename Spec::Value;
  using Result = OperationResult<Value>;

  // One call: the idempotency layer when a key is configured, then the lifecycle; the observer,
  // when there is one, is told how it ended.
  static Result call(const std::shared_ptr<const Spec>& spec, const CallOptions& options,
                     ArgRef<Params>... args) {
    if (!spec->core.observer) return call_unobserved(spec, options, args...);
    const SteadyTime started = spec->core.clock->steady_now();
    const bool keyed = static_cast<bool>(spec->key);
    try {
      Result result = call_unobserved(spec, options, args...);
      observe_call(spec->core, started, keyed, &result.report);
      return result;
    } catch (...) {
      observe_call(spec->core, started, keyed, nullptr);
      throw;
    }
  }

 private:
  static Result call_unobserved(const std::shared_ptr<const Spec>& spec, const CallOptions& options,
                                ArgRef<Params>... args) {
    if (!spec->key) return run_lifecycle(spec, nullptr, args...);
    if constexpr (std::is_void_v<Value> || std::is_copy_constructible_v<Value>) {
      return call_idempotent(spec, options, args...);
    } else {
      throw ConfigError("unreachable: resolve() rejects idempotency for move-only results");
    }
  }

  static Result call_idempotent(const std::shared_ptr<const Spec>& spec, const CallOptions& options,
                                ArgRef<Params>... args) {
    const Spec& s = *spec;
    IdempotentCall request = idempotent_request(s, s.key(args...), args...);
    const std::string& user_key = request.caller_key;
    request.stop = options.stop;
    request.wait_deadline = options.wait_deadline;

    // Captured through one pointer, so std::function keeps the lambda in its inline buffer.
    struct Frame {
      const std::shared_ptr<const Spec>& spec;
      const std::string& key;
      std::tuple<ArgRef<Params>...> arguments;
    } frame{spec, user_key, {args...}};
    auto execute = [&frame](ClaimHold& hold) -> Execution {
      emit_idempotency_event(frame.spec->core, EventType::idempotency_executed, frame.key, {});
      return execution_of<Value>(
          std::apply([&](ArgRef<Params>... a) { return run_lifecycle(frame.spec, &hold, a...); },
                     frame.arguments));
    };

    CoordinatedResult outcome;
    try {
      outcome = s.coordinator->run(s.policy, request, execute);
    } catch (...) {
      rethrow_idempotency_rejection(s.core, user_key);
    }
    return idempotent_result<Value>(s, std::move(outcome), user_key, request.key);
  }

  static Result run_lifecycle(const std::shared_ptr<const Spec>& spec, ClaimHold* hold,
                              ArgRef<Params>... args) {
    const Spec& s = *spec;
    Lifecycle life(s.core);
    for (int attempt = 1;; ++attempt) {
      CircuitBreaker::Permit permit;
      if (!life.start_attempt(attempt, permit)) break;
      if constexpr (std::is_void_v<Value>) {
        try {
          invoke_primary(spec, attempt, hold, args...);
          Validation<Value>::run(s.validators, s.core.retry.retry_invalid_results);
        } catch (...) {
          if (life.attempt_failed(attempt, permit, std::current_exception())) continue;
          break;
        }
        if (!s.validators.empty()) life.validation_succeeded(attempt, "primary");
        life.attempt_succeeded(attempt, permit);
        return Result{life.succeed()};
      } else {
        std::optional<Value> value;
        try {
          value.emplace(invoke_primary(spec, attempt, hold, args...));
          Validation<Value>::run(s.validators, s.core.retry.retry_invalid_results, *value);
        } catch (...) {
          if (life.attempt_failed(attempt, permit, std::current_exception())) continue;
          break;
        }
        if (!s.validators.empty()) life.validation_succeeded(attempt, "primary");
        life.attempt_succeeded(attempt, permit);
        return Result{std::move(*value), life.succeed()};
      }
    }
    if (!s.fallbacks.empty() && life.falls_back()) {
      const FallbackContext& why = life.fallback_context();
      for (std::size_t i = 0; i < s.fallbacks.size(); ++i) {
        life.fallback_started(i);
        if constexpr (std::is_void_v<Value>) {
          try {
            s.fallbacks[i].call(why, args...);
            Validation<Value>::run(s.validators, false);
          } catch (...) {
            if (life.fallback_failed(i, std::current_exception())) continue;
            break;
          }
          if (!s.validators.empty()) life.validation_succeeded(0, s.core.fallback_sources[i]);
          life.fallback_succeeded(i);
          return Result{life.succeed()};
        } else {
          std::optional<Value> value;
          try {
            value.emplace(s.fallbacks[i].call(why, args...));
            Validation<Value>::run(s.validators, false, *value);
          } catch (...) {
            if (life.fallback_failed(i, std::current_exception())) continue;
            break;
          }
          if (!s.validators.empty()) life.validation_succeeded(0, s.core.fallback_sources[i]);
          life.fallback_succeeded(i);
          return Result{std::move(*value), life.succeed()};
        }
      }
    }
    life.fail();
  }

  static Value invoke_primary(const std::shared_ptr<const Spec>& spec, int attempt, ClaimHold* hold,
                              ArgRef<Params>... args) {
    const Spec& s = *spec;
    AttemptContext context;
    context.attempt = attempt;
    if (!s.core.timeout) return s.primary(context, args...);
    if constexpr (Spec::kArgumentsCopyable) {
      // The attempt may outlive this call: it owns copies of the arguments and a share of the
      // spec, and keeps the idempotency key claimed until it ends.
      auto work = [spec, copies = std::tuple<std::remove_cvref_t<Params>...>(args...)](
                      AttemptContext& ctx) mutable -> Value {
        return std::apply([&](auto&... a) -> Value { return spec->primary(ctx, a...); }, copies);
      };
      std::shared_ptr<void> token = hold != nullptr ? hold->retain() : nullptr;
      return run_with_timeout<Value>(std::move(work), *s.core.timeout, s.core.timeout_grace,
                                     context, std::move(token), s.core.name);
    } else {
      throw ConfigError("unreachable: resolve() rejects timeouts for these parameters");
    }
  }
};

}  // namespace idem::detail
