// idem::async::resilient: the blocking idem::resilient (idem/resilient.hpp) for functions that
// return idem::async::Task<T> — the same options, the same report, events and errors, with
// every wait on an Asio timer and every join a suspension.
//
//   auto charge = idem::async::resilient(
//       [&](std::string order, int cents) -> idem::async::Task<Receipt> { ... co_return r; },
//       {.name = "charge", .retries = 2, .timeout = 200ms,
//        .idempotency_key = [](const std::string& order, int) { return order; },
//        .idempotency_store = std::make_shared<idem::async::AsyncMemoryStore>(memory)});
//   idem::OperationResult<Receipt> r = co_await charge("o-1", 500);
//
// resilient(fn, options) returns an AsyncResilient<Task<T>(Params...)> whose call is a
// Task<OperationResult<T>>; failure throws idem::OperationError (report + cause), as blocking.
// A leading idem::AttemptContext& parameter of fn is supplied by idem.
//
// Executors: the call runs on the awaiting coroutine's executor and resumes there. Backoff and
// rate-limit waits are asio::steady_timer waits there (with the system clock; an injected clock
// is asked to sleep_for() instead — a ManualClock advances at once — see docs/async.md). With
// a timeout each attempt runs as its own coroutine on a strand of that executor, with copies of
// the arguments; the lease renewal of an idempotency owner is a timer loop on a strand too.
//
// Cancellation: a timed-out attempt is cancelled through its cancellation slot (its pending
// operation ends with operation_aborted, so it never gets further); the caller waits up to
// timeout_grace for it to end, then moves on (it ends in the background, keeping the key
// claimed). The caller's own cancellation (its slot fires) ends the call at once: no further
// retry, no fallback, OperationError whose report status is `cancelled`; an owner cancelled so
// releases its key, so the next caller executes. A joiner's cancellation (idem::Cancelled)
// detaches that joiner only.
// call_with(CallOptions, args...) bounds a caller's wait for a key in flight, as blocking
// Resilient::call_with does: its stop token (idem::Cancelled, requested from any thread) or its
// wait deadline on the operation's clock (idem::TimeoutError) detaches that caller only.
//
// Idempotency: the coordinator is the blocking face's (IdempotencyCoordinator::enter), so a
// coroutine and a thread calling one key with one store object join one execution.
// idempotency_store is an idem::async::AsyncStore (null: the process-wide in-memory store, the
// blocking face's default too).
//
// Arguments: passed to fn as lvalues, once per attempt (by value or const& in fn). References
// in Params must stay valid until the call's co_await completes.
//
// Thread-safety: an AsyncResilient is immutable; copies share one configuration and may be
// called from any number of coroutines on any executors at once. The functions you give it are
// called concurrently and must be safe so.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "idem/async/store.hpp"
#include "idem/async/task.hpp"
#include "idem/resilient.hpp"

namespace idem::detail {
class FlightLead;
}  // namespace idem::detail

namespace idem::async {

namespace detail {

template <class R>
struct TaskValue {
  static_assert(sizeof(R) == 0,
                "idem::async::resilient: the function must return idem::async::Task<T> "
                "(asio::awaitable<T>)");
};
template <class T>
struct TaskValue<asio::awaitable<T, asio::any_io_executor>> {
  using type = T;
};

// The async face's spec traits (see idem::detail::BlockingFace).
struct AsyncFace {
  template <class R>
  using value_t = typename TaskValue<std::remove_cvref_t<R>>::type;
  using Store = AsyncStore;
  static std::shared_ptr<IdempotencyStore> policy_store(const std::shared_ptr<AsyncStore>& store);
  static std::shared_ptr<IdempotencyCoordinator> coordinator_for(
      const std::shared_ptr<AsyncStore>& store);
};

// The store a keyed call uses: `store`, or the process-wide in-memory one.
std::shared_ptr<AsyncStore> store_or_default(const std::shared_ptr<AsyncStore>& store);

// Whether the awaiting coroutine's cancellation slot has fired.
Task<bool> caller_cancelled();

// Waits `delay` (a retry's backoff or rate-limit wait): an asio::steady_timer with the system
// clock, clock->sleep_for() with any other. False: the caller was cancelled meanwhile.
Task<bool> wait_delay(std::chrono::nanoseconds delay, std::shared_ptr<Clock> clock);

// A thread-safe one-shot event a coroutine can await with its cancellation honoured (a timed
// attempt's end).
class Latch {
 public:
  Latch();
  ~Latch();
  Latch(const Latch&) = delete;
  Latch& operator=(const Latch&) = delete;
  // Wakes the waiter (posted to its executor); later set()s do nothing. Any thread.
  void set();
  bool is_set() const;
  // True once set(); false when `limit` passed first or the caller's slot fired.
  Task<bool> wait(std::optional<std::chrono::nanoseconds> limit = std::nullopt);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// One attempt run as its own coroutine (timeouts): the outcome lands here.
template <class Box>
struct AttemptRun {
  explicit AttemptRun(const asio::any_io_executor& executor)
      : strand(asio::make_strand(executor)) {}
  asio::strand<asio::any_io_executor> strand;
  // Used on `strand` only. It holds the attempt's cancellation state, so it lives as long as
  // the co_spawn completion handler, which shares this object.
  asio::cancellation_signal signal;
  Latch done;
  std::optional<Box> value;
  std::exception_ptr error;
  // Emits a terminal cancellation on the attempt's slot (on its strand).
  void cancel(const std::shared_ptr<AttemptRun>& self) {
    asio::post(strand, [self] { self->signal.emit(asio::cancellation_type::terminal); });
  }
};

// The timeout error of an attempt that is being cancelled (attempt_stopped reads `done`).
std::exception_ptr attempt_timeout_error(const std::string& operation, int attempt,
                                         std::chrono::nanoseconds timeout,
                                         std::shared_ptr<const Latch> done);

// The idempotency layer of one keyed call (join / replay / execute), compiled once. A keyed call
// enters its key's flight without suspending (enter_flight); a leader then runs lead_flight, a
// joiner awaits its FlightJoin (await_flight, one asynchronous operation) and reads what it was
// told (joined_outcome). Rejections are rethrown as blocking (AlreadyInProgress, KeyReuseError,
// ReentryError); a joiner cancelled by its caller gets idem::Cancelled and only it leaves.

// A joiner's wait: its registration in the flight, the outcome and the awaiting coroutine's
// completion, in one allocation (resilient.cpp).
class FlightJoin;
struct FlightEntered {
  std::shared_ptr<idem::detail::FlightLead> lead;  // set: this call leads
  std::shared_ptr<FlightJoin> join;                // else: this call waits on the flight
};
// Throws ConfigError (a store that keeps bytes and no codec) and enter()'s rejections.
FlightEntered enter_flight(IdempotencyCoordinator& coordinator,
                           const std::shared_ptr<AsyncStore>& store, const IdempotentCall& call);
// Completes with true once the joiner is told, false when its own cancellation slot fired.
Task<bool> await_flight(FlightJoin& join);
// await_flight, or (when the caller gave CallOptions) a wait that also gives up when
// `call.stop` is requested or at `call.wait_deadline` (on `clock`'s steady time; null: the
// system clock). Not a coroutine: a joiner without options awaits await_flight itself.
Task<bool> await_join(const std::shared_ptr<FlightJoin>& join, const IdempotentCall& call,
                      const std::shared_ptr<Clock>& clock);
// The joiners' shared result; null: enter again (start over). Throws the owner's error, or
// (after leaving the flight) when `told` is false TimeoutError if it gave up at its wait
// deadline, else Cancelled.
std::shared_ptr<const CoordinatedResult> joined_outcome(FlightJoin& join, bool told,
                                                        const IdempotentCall& call);
// The leader's claim / replay / execution; `execute` runs the lifecycle of an owner.
using AsyncExecute = std::function<Task<Execution>(ClaimHold&)>;
Task<CoordinatedResult> lead_flight(std::shared_ptr<AsyncStore> store,
                                    std::shared_ptr<idem::detail::FlightLead> lead,
                                    const IdempotencyPolicy& policy, const IdempotentCall& call,
                                    const AsyncExecute& execute);

template <class R, class... Params>
using AsyncSpec = idem::detail::BasicOperationSpec<AsyncFace, R, Params...>;

template <class R, class... Params>
class AsyncEngine {
 public:
  using Spec = AsyncSpec<R, Params...>;
  using Value = typename Spec::Value;
  using Result = OperationResult<Value>;
  // What an attempt produced (void: nothing).
  using Box = std::conditional_t<std::is_void_v<Value>, std::monostate, Value>;
  template <class P>
  using ArgRef = idem::detail::ArgRef<P>;

  // One call: the idempotency layer when a key is configured, then the lifecycle. The returned
  // coroutine owns the arguments. `options` concern a keyed caller that waits (call_options.hpp).
  static Task<Result> call(std::shared_ptr<const Spec> spec, const CallOptions& options,
                           Params... args) {
    if (spec->core.observer) {
      return call_observed(std::move(spec), options, std::forward<Params>(args)...);
    }
    return call_unobserved(std::move(spec), options, std::forward<Params>(args)...);
  }

 private:
  static Task<Result> call_unobserved(std::shared_ptr<const Spec> spec, const CallOptions& options,
                                      Params... args) {
    if constexpr (std::is_void_v<Value> || std::is_copy_constructible_v<Value>) {
      if (spec->key) return call_keyed(std::move(spec), options, std::forward<Params>(args)...);
    }
    return call_plain(std::move(spec), std::forward<Params>(args)...);
  }

  // The call, and then the observer told how it ended (the caller's throw_if_cancelled setting
  // is restored before the call returns or throws, as call_plain and call_keyed do).
  static Task<Result> call_observed(std::shared_ptr<const Spec> spec, CallOptions options,
                                    Params... args) {
    const bool throw_if_cancelled = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    const SteadyTime started = spec->core.clock->steady_now();
    const bool keyed = static_cast<bool>(spec->key);
    std::optional<Result> result;
    std::exception_ptr error;
    try {
      result.emplace(co_await call_unobserved(spec, options, std::forward<Params>(args)...));
    } catch (...) {
      idem::detail::observe_call(spec->core, started, keyed, nullptr);
      error = std::current_exception();
    }
    if (!error) idem::detail::observe_call(spec->core, started, keyed, &result->report);
    co_await asio::this_coro::throw_if_cancelled(throw_if_cancelled);
    if (error) std::rethrow_exception(error);
    co_return std::move(*result);
  }

  // The engine checks the caller's cancellation itself (to report it, and to still decide after
  // it), so co_await must not throw on its own once the slot fired; the caller's setting is
  // restored before the call returns or throws.
  static Task<Result> call_plain(std::shared_ptr<const Spec> spec, Params... args) {
    const bool throw_if_cancelled = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    std::optional<Result> result;
    std::exception_ptr error;
    try {
      if (spec->key) {
        throw ConfigError("unreachable: resolve() rejects idempotency for move-only results");
      }
      result.emplace(co_await run_lifecycle(spec, nullptr, args...));
    } catch (...) {
      error = std::current_exception();
    }
    co_await asio::this_coro::throw_if_cancelled(throw_if_cancelled);
    if (error) std::rethrow_exception(error);
    co_return std::move(*result);
  }

  // request.caller_key is the caller's key.
  struct KeyedCall {
    IdempotentCall request;
  };

  // A keyed call. A joiner costs this one coroutine frame (it holds no result of its own until
  // it resumes), its FlightJoin and one asynchronous operation; the leader goes on in lead_call.
  static Task<Result> call_keyed(std::shared_ptr<const Spec> spec, CallOptions options,
                                 Params... args) {
    const bool throw_if_cancelled = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    KeyedCall keyed;
    std::shared_ptr<const CoordinatedResult> joined;
    // The leader's result: on the heap, so a joiner's frame has no room for a Result of its own
    // beside the one its promise holds.
    std::unique_ptr<Result> led;
    std::exception_ptr error;     // the key or fingerprint function's: rethrown as is
    std::exception_ptr rejected;  // the coordinator's
    try {
      keyed.request = idem::detail::idempotent_request(*spec, spec->key(args...), args...);
      keyed.request.stop = std::move(options.stop);
      keyed.request.wait_deadline = options.wait_deadline;
    } catch (...) {
      error = std::current_exception();
    }
    while (!error && !rejected && !joined) {
      FlightEntered entered;
      try {
        entered = enter_flight(*spec->coordinator, spec->store, keyed.request);
      } catch (...) {
        rejected = std::current_exception();
        break;
      }
      if (entered.lead) {
        co_await lead_call(spec, std::move(entered.lead), keyed, throw_if_cancelled, led, args...);
        co_return std::move(*led);
      }
      const bool told = co_await await_join(entered.join, keyed.request, spec->core.clock);
      try {
        joined = joined_outcome(*entered.join, told, keyed.request);
      } catch (...) {
        rejected = std::current_exception();
      }
    }
    co_await asio::this_coro::throw_if_cancelled(throw_if_cancelled);
    if (error) std::rethrow_exception(error);
    if (rejected) rethrow_rejection(*spec, rejected, keyed.request.caller_key);
    co_return joined_result(*spec, *joined, keyed);
  }

  [[noreturn]] static void rethrow_rejection(const Spec& s, const std::exception_ptr& rejected,
                                             const std::string& user_key) {
    try {
      std::rethrow_exception(rejected);
    } catch (...) {
      idem::detail::rethrow_idempotency_rejection(s.core, user_key);
    }
  }

  static Result joined_result(const Spec& s, const CoordinatedResult& joined,
                              const KeyedCall& keyed) {
    return idem::detail::idempotent_result<Value>(s, CoordinatedResult(joined),
                                                  keyed.request.caller_key, keyed.request.key);
  }

  // The leader's part of call_keyed, which restores the caller's throw_if_cancelled and leaves
  // the result in `led`.
  static Task<void> lead_call(std::shared_ptr<const Spec> spec,
                              std::shared_ptr<idem::detail::FlightLead> lead,
                              const KeyedCall& keyed, bool throw_if_cancelled,
                              std::unique_ptr<Result>& led, ArgRef<Params>... args) {
    const Spec& s = *spec;
    const std::string& user_key = keyed.request.caller_key;
    std::tuple<ArgRef<Params>...> arguments{args...};
    AsyncExecute execute = [&](ClaimHold& hold) -> Task<Execution> {
      idem::detail::emit_idempotency_event(s.core, EventType::idempotency_executed, user_key, {});
      auto result = co_await std::apply(
          [&](ArgRef<Params>... a) { return run_lifecycle(spec, &hold, a...); }, arguments);
      co_return idem::detail::execution_of<Value>(std::move(result));
    };
    std::exception_ptr rejected;
    CoordinatedResult outcome;
    try {
      outcome = co_await lead_flight(store_or_default(s.store), std::move(lead), s.policy,
                                     keyed.request, execute);
    } catch (...) {
      rejected = std::current_exception();
    }
    co_await asio::this_coro::throw_if_cancelled(throw_if_cancelled);
    if (rejected) rethrow_rejection(s, rejected, user_key);
    led = std::make_unique<Result>(
        idem::detail::idempotent_result<Value>(s, std::move(outcome), user_key, keyed.request.key));
  }

  static void validate(const Spec& s, bool retryable, const Box& box) {
    if constexpr (std::is_void_v<Value>) {
      idem::detail::Validation<Value>::run(s.validators, retryable);
    } else {
      idem::detail::Validation<Value>::run(s.validators, retryable, box);
    }
  }

  static Result result_of(std::optional<Box>& box, ExecutionReport report) {
    if constexpr (std::is_void_v<Value>) {
      return Result{std::move(report)};
    } else {
      return Result{std::move(*box), std::move(report)};
    }
  }

  template <class Awaitable>
  static Task<Box> boxed(Awaitable awaitable) {
    if constexpr (std::is_void_v<Value>) {
      co_await std::move(awaitable);
      co_return Box{};
    } else {
      co_return co_await std::move(awaitable);
    }
  }

  [[noreturn]] static void end_cancelled(idem::detail::Lifecycle& life, const Spec& s, int attempt,
                                         CircuitBreaker::Permit* permit) {
    life.cancelled(attempt, permit,
                   std::make_exception_ptr(
                       Cancelled("operation '" + s.core.name + "' was cancelled by its caller")));
    life.fail();
  }

  static Task<Result> run_lifecycle(std::shared_ptr<const Spec> spec, ClaimHold* hold,
                                    ArgRef<Params>... args) {
    const Spec& s = *spec;
    idem::detail::Lifecycle life(s.core);
    for (int attempt = 1;; ++attempt) {
      CircuitBreaker::Permit permit;
      if (!life.start_attempt(attempt, permit)) break;
      std::optional<Box> value;
      std::exception_ptr error;
      try {
        value.emplace(co_await invoke_primary(spec, attempt, hold, args...));
        validate(s, s.core.retry.retry_invalid_results, *value);
      } catch (...) {
        error = std::current_exception();
      }
      if (error) {
        if (co_await caller_cancelled()) end_cancelled(life, s, attempt, &permit);
        const auto delay = life.retry_delay_after(attempt, permit, error);
        if (!delay) break;
        if (!co_await wait_delay(*delay, s.core.clock)) end_cancelled(life, s, 0, nullptr);
        continue;
      }
      if (!s.validators.empty()) life.validation_succeeded(attempt, "primary");
      life.attempt_succeeded(attempt, permit);
      co_return result_of(value, life.succeed());
    }
    if (!s.fallbacks.empty() && life.falls_back()) {
      const FallbackContext& why = life.fallback_context();
      for (std::size_t i = 0; i < s.fallbacks.size(); ++i) {
        if (co_await caller_cancelled()) end_cancelled(life, s, 0, nullptr);
        life.fallback_started(i);
        std::optional<Box> value;
        std::exception_ptr error;
        try {
          value.emplace(co_await boxed(s.fallbacks[i].call(why, args...)));
          validate(s, false, *value);
        } catch (...) {
          error = std::current_exception();
        }
        if (error) {
          if (co_await caller_cancelled()) end_cancelled(life, s, 0, nullptr);
          if (life.fallback_failed(i, error)) continue;
          break;
        }
        if (!s.validators.empty()) life.validation_succeeded(0, s.core.fallback_sources[i]);
        life.fallback_succeeded(i);
        co_return result_of(value, life.succeed());
      }
    }
    life.fail();
  }

  static Task<Box> invoke_primary(std::shared_ptr<const Spec> spec, int attempt, ClaimHold* hold,
                                  ArgRef<Params>... args) {
    const Spec& s = *spec;
    AttemptContext context;
    context.attempt = attempt;
    if (!s.core.timeout) co_return co_await boxed(s.primary(context, args...));
    if constexpr (Spec::kArgumentsCopyable) {
      // The attempt may outlive this call: it owns copies of the arguments and a share of the
      // spec, and keeps the idempotency key claimed until it ends.
      using Run = AttemptRun<Box>;
      auto run = std::make_shared<Run>(co_await asio::this_coro::executor);
      std::shared_ptr<void> token = hold != nullptr ? hold->retain() : nullptr;
      auto body =
          [spec, run, token, attempt,
           copies = std::tuple<std::remove_cvref_t<Params>...>(args...)]() mutable -> Task<void> {
        AttemptContext ctx;
        ctx.attempt = attempt;
        run->value.emplace(co_await std::apply(
            [&](auto&... a) { return boxed(spec->primary(ctx, a...)); }, copies));
      };
      asio::co_spawn(
          run->strand, std::move(body),
          asio::bind_cancellation_slot(run->signal.slot(), [run](std::exception_ptr error) {
            run->error = std::move(error);
            run->done.set();
          }));
      const bool finished = co_await run->done.wait(*s.core.timeout);
      if (finished) {
        if (run->error) std::rethrow_exception(run->error);
        co_return std::move(*run->value);
      }
      run->cancel(run);
      const bool by_caller = co_await caller_cancelled();
      if (!by_caller && s.core.timeout_grace > std::chrono::nanoseconds::zero()) {
        co_await run->done.wait(s.core.timeout_grace);
      }
      if (by_caller) throw Cancelled("operation '" + s.core.name + "' was cancelled by its caller");
      std::rethrow_exception(attempt_timeout_error(s.core.name, attempt, *s.core.timeout,
                                                   std::shared_ptr<const Latch>(run, &run->done)));
    } else {
      throw ConfigError("unreachable: resolve() rejects timeouts for these parameters");
    }
  }
};

}  // namespace detail

template <class Signature>
struct AsyncOptions;
template <class R, class... Params>
struct AsyncOptions<R(Params...)> {
  using type =
      BasicResilientOptions<R(Params...), typename detail::AsyncFace::value_t<R>, AsyncStore>;
};

// The options of idem::async::resilient: idem::ResilientOptions field for field, except that
// validators check the T of Task<T>, fallbacks return Task<T> and idempotency_store is an
// AsyncStore.
template <class Signature>
using ResilientOptions = typename AsyncOptions<Signature>::type;

template <class Signature>
class AsyncResilient;

template <class R, class... Params>
class AsyncResilient<R(Params...)> {
 public:
  using Spec = detail::AsyncSpec<R, Params...>;
  using value_type = typename Spec::Value;
  using result_type = OperationResult<value_type>;

  explicit AsyncResilient(std::shared_ptr<const Spec> spec) : spec_(std::move(spec)) {}

  // The arguments (and a share of the configuration) live in this call's frame until it ends.
  Task<result_type> operator()(Params... args) const {
    return detail::AsyncEngine<R, Params...>::call(spec_, CallOptions{},
                                                   std::forward<Params>(args)...);
  }

  // The same call with per-call settings (call_options.hpp): a caller that waits for a key in
  // flight (a joiner, or a leader polling another process's owner) gives up when
  // `options.stop` is requested (idem::Cancelled) or at `options.wait_deadline` on the
  // operation's clock (idem::TimeoutError); the execution it waited for goes on.
  Task<result_type> call_with(const CallOptions& options, Params... args) const {
    return detail::AsyncEngine<R, Params...>::call(spec_, options, std::forward<Params>(args)...);
  }

  const std::string& name() const noexcept { return spec_->core.name; }

 private:
  std::shared_ptr<const Spec> spec_{};
};

// With the signature named: idem::async::resilient<Task<Receipt>(const std::string&)>(fn, {...}).
template <class Signature, class F>
AsyncResilient<Signature> resilient(F fn, ResilientOptions<Signature> options = {}) {
  return AsyncResilient<Signature>(
      idem::detail::make_spec<typename AsyncResilient<Signature>::Spec>(std::move(fn),
                                                                        std::move(options)));
}

// The signature deduced from fn (one non-template operator()).
template <class F>
requires(!std::is_function_v<F>) auto resilient(
    F fn, ResilientOptions<idem::detail::deduced_signature_t<F>> options = {}) {
  static_assert(idem::detail::CallableTraits<std::decay_t<F>>::known,
                "idem::async::resilient: cannot deduce the parameters of this function (a "
                "generic lambda?). Name the signature: "
                "idem::async::resilient<idem::async::Task<Receipt>(std::string)>(fn, {...})");
  return resilient<idem::detail::deduced_signature_t<F>>(std::move(fn), std::move(options));
}

}  // namespace idem::async
