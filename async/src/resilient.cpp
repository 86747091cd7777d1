// The non-template half of idem::async::resilient: the latch timed attempts await, timer waits,
// and the idempotency layer (join / replay / execute over an AsyncStore).

#include "idem/async/resilient.hpp"

#include <algorithm>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/execution.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <optional>
#include <stop_token>
#include <unordered_map>

#include "idem/async/detail/completion.hpp"
#include "idem/async/detail/holder_wait.hpp"
#include "idem/async/detail/renewal.hpp"
#include "idem/async/memory_store.hpp"
#include "idem/detail/flight.hpp"
#include "idem/error.hpp"
#include "idem/memory_store.hpp"

namespace idem::async::detail {

using idem::detail::FlightLead;
using idem::detail::FlightOutcome;
using idem::detail::FlightWaiter;
using idem::detail::SharedClaimHold;

// ---- Latch ------------------------------------------------------------------------------------

struct Latch::State {
  std::mutex mutex;
  bool set = false;
  Completion<void(bool)> waiter;  // empty when nobody waits
};

Latch::Latch() : state_(std::make_shared<State>()) {}
Latch::~Latch() = default;

void Latch::set() {
  Completion<void(bool)> waiter;
  {
    std::lock_guard lock(state_->mutex);
    if (state_->set) return;
    state_->set = true;
    waiter = std::move(state_->waiter);
  }
  if (waiter) waiter.post(true);
}

bool Latch::is_set() const {
  std::lock_guard lock(state_->mutex);
  return state_->set;
}

namespace {

// Completes with true when the latch is set, false when the awaiting coroutine's slot fires.
Task<bool> await_latch(std::shared_ptr<Latch::State> state) {
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(bool)>(
      [state](auto handler) {
        Completion<void(bool)> completion(std::move(handler));
        std::unique_lock lock(state->mutex);
        if (state->set) {
          lock.unlock();
          completion.post(true);
          return;
        }
        // A wait withdrawn has no side effects: every cancellation type ends it.
        if (auto slot = completion.slot(); slot.is_connected()) {
          slot.assign([state](asio::cancellation_type type) {
            if (type == asio::cancellation_type::none) return;
            Completion<void(bool)> waiter;
            {
              std::lock_guard inner(state->mutex);
              waiter = std::move(state->waiter);
            }
            if (waiter) waiter.post(false);
          });
        }
        state->waiter = std::move(completion);
      },
      asio::use_awaitable);
}

Task<bool> await_timer(asio::steady_timer& timer) {
  asio::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  co_return !ec;
}

}  // namespace

Task<bool> Latch::wait(std::optional<std::chrono::nanoseconds> limit) {
  using namespace asio::experimental::awaitable_operators;
  if (!limit) co_return co_await await_latch(state_);
  asio::steady_timer timer(co_await asio::this_coro::executor,
                           std::chrono::duration_cast<asio::steady_timer::duration>(*limit));
  auto which = co_await (await_latch(state_) || await_timer(timer));
  co_return which.index() == 0 && std::get<0>(which);
}

// ---- waits ------------------------------------------------------------------------------------

Task<bool> caller_cancelled() {
  asio::cancellation_state state = co_await asio::this_coro::cancellation_state;
  co_return state.cancelled() != asio::cancellation_type::none;
}

Task<bool> wait_delay(std::chrono::nanoseconds delay, std::shared_ptr<Clock> clock) {
  if (clock && clock != system_clock()) {
    // An injected clock owns time: a ManualClock advances at once. Then yield, so a loop of
    // retries does not starve the executor.
    clock->sleep_for(delay);
    co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
    co_return !co_await caller_cancelled();
  }
  asio::steady_timer timer(co_await asio::this_coro::executor,
                           std::chrono::duration_cast<asio::steady_timer::duration>(delay));
  const bool waited = co_await await_timer(timer);
  co_return waited && !co_await caller_cancelled();
}

std::exception_ptr attempt_timeout_error(const std::string& operation, int attempt,
                                         std::chrono::nanoseconds timeout,
                                         std::shared_ptr<const Latch> done) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
  return std::make_exception_ptr(TimeoutError(
      "operation '" + operation + "', attempt " + std::to_string(attempt) + ": timed out after " +
          std::to_string(ms) + " ms (the attempt was cancelled)",
      timeout, std::move(done),
      [](const void* latch) { return static_cast<const Latch*>(latch)->is_set(); }));
}

// ---- store and coordinator --------------------------------------------------------------------

namespace {

std::shared_ptr<AsyncStore> default_async_store() {
  static const std::shared_ptr<AsyncStore> store = std::make_shared<AsyncMemoryStore>(
      std::dynamic_pointer_cast<InMemoryIdempotencyStore>(default_idempotency_store()));
  return store;
}

// One in-process coordinator per AsyncStore without a blocking twin (weakly held stores).
struct InProcessRegistry {
  struct Entry {
    std::weak_ptr<AsyncStore> store;
    std::shared_ptr<IdempotencyCoordinator> coordinator;
  };
  std::mutex mutex;
  std::unordered_map<const AsyncStore*, Entry> entries;
};

std::string quote_key(std::string_view key) {
  return "'" + std::string(key) + "'";
}

}  // namespace

std::shared_ptr<AsyncStore> store_or_default(const std::shared_ptr<AsyncStore>& store) {
  return store ? store : default_async_store();
}

std::shared_ptr<IdempotencyStore> AsyncFace::policy_store(
    const std::shared_ptr<AsyncStore>& store) {
  return store ? store->blocking_store() : nullptr;
}

std::shared_ptr<IdempotencyCoordinator> AsyncFace::coordinator_for(
    const std::shared_ptr<AsyncStore>& store) {
  if (!store) return IdempotencyCoordinator::for_store(nullptr);
  if (auto blocking = store->blocking_store()) return IdempotencyCoordinator::for_store(blocking);
  static auto* registry = new InProcessRegistry();  // never destroyed, like core's registry
  std::lock_guard lock(registry->mutex);
  auto it = registry->entries.find(store.get());
  if (it != registry->entries.end() && !it->second.store.expired()) return it->second.coordinator;
  std::erase_if(registry->entries, [](const auto& entry) { return entry.second.store.expired(); });
  auto coordinator = make_in_process_coordinator();
  registry->entries[store.get()] = {store, coordinator};
  return coordinator;
}

namespace {

// ---- re-entrancy ------------------------------------------------------------------------------

// An executor that runs every function it is given with an owner's execution context current
// (OwnedKeysScope), on the executor it wraps. An owner's execution is a coroutine of its own on
// it, so each of its handlers — the first resumption and every one after an await, in this
// coroutine and in those it awaits or spawns on `co_await this_coro::executor` — sees the keys
// it owns, and a nested call with one of them throws ReentryError instead of waiting for itself.
// (Code the execution resumes through another executor, e.g. a strand made from a plain one,
// runs without the context.)
class OwnedKeysExecutor {
 public:
  OwnedKeysExecutor(asio::any_io_executor inner, std::shared_ptr<const OwnedKeys> keys) noexcept
      : inner_(std::move(inner)), keys_(std::move(keys)) {}

  template <class F>
  void execute(F&& f) const {
    inner_.execute([keys = keys_, f = std::forward<F>(f)]() mutable {
      OwnedKeysScope scope(keys);
      std::move(f)();
    });
  }

  asio::execution_context& query(
      asio::execution::context_as_t<asio::execution_context&> property) const noexcept {
    return asio::query(inner_, property);
  }
  template <class Property>
  requires asio::can_query<const asio::any_io_executor&, Property>::value auto query(
      const Property& property) const {
    return asio::query(inner_, property);
  }
  OwnedKeysExecutor require(asio::execution::blocking_t::never_t property) const {
    return {asio::require(inner_, property), keys_};
  }
  template <class Property>
  requires asio::can_prefer<const asio::any_io_executor&, Property>::value OwnedKeysExecutor
  prefer(const Property& property)
  const { return {asio::prefer(inner_, property), keys_}; }

  friend bool operator==(const OwnedKeysExecutor& a, const OwnedKeysExecutor& b) noexcept {
    return a.inner_ == b.inner_ && a.keys_ == b.keys_;
  }
  friend bool operator!=(const OwnedKeysExecutor& a, const OwnedKeysExecutor& b) noexcept {
    return !(a == b);
  }

 private:
  asio::any_io_executor inner_;
  std::shared_ptr<const OwnedKeys> keys_;
};

// The owner's execution, as a coroutine of its own on an OwnedKeysExecutor over the caller's
// executor (the caller's cancellation reaches it through co_spawn's slot, and it reports a
// cancellation itself, as the caller's coroutine does).
Task<Execution> run_as_owner(std::shared_ptr<const OwnedKeys> keys, const AsyncExecute& execute,
                             ClaimHold& hold) {
  if (!keys) co_return co_await execute(hold);
  const asio::any_io_executor executor(
      OwnedKeysExecutor(co_await asio::this_coro::executor, std::move(keys)));
  auto body = [&]() -> Task<Execution> {
    co_await asio::this_coro::throw_if_cancelled(false);
    co_return co_await execute(hold);
  };
  co_return co_await asio::co_spawn(executor, std::move(body), asio::use_awaitable);
}

// The owner's claim: lease renewal while it lives, release when a failed owner's last
// reference (its own or a ClaimHold token of a timed-out attempt) goes.
struct OwnedClaim {
  OwnedClaim(asio::any_io_executor executor, std::shared_ptr<AsyncStore> s,
             std::shared_ptr<FlightLead> l, std::string k, std::uint64_t t, Millis lease,
             std::shared_ptr<Clock> clock)
      : strand(asio::make_strand(executor)),
        store(std::move(s)),
        lead(std::move(l)),
        key(std::move(k)),
        token(t),
        renewal(strand, std::move(clock), lease, [store = store, key = key, token = t, lease] {
          return store->renew(key, token, lease);
        }) {}
  ~OwnedClaim() {
    stop_renewal();
    if (!armed) return;
    // Released on the owner's executor, detached from any caller's cancellation; the flight's
    // waiters start over once the key is free.
    asio::co_spawn(
        strand,
        [store = store, lead = lead, key = key, token = token]() -> Task<void> {
          try {
            (void)co_await store->release(key, token);
          } catch (...) {
            // The claim then lapses with its lease.
          }
          lead->released();
        },
        asio::detached);
  }
  void stop_renewal() noexcept { renewal.stop(); }

  asio::strand<asio::any_io_executor> strand;
  std::shared_ptr<AsyncStore> store;
  std::shared_ptr<FlightLead> lead;
  std::string key;
  std::uint64_t token;
  LeaseKeeper renewal;  // on the policy's clock, as the blocking coordinator's renewals
  std::atomic<bool> armed{true};
};

Task<CoordinatedResult> execute_owned(std::shared_ptr<AsyncStore> store,
                                      std::shared_ptr<FlightLead> lead, ClaimOutcome claim,
                                      const IdempotencyPolicy& policy, const IdempotentCall& call,
                                      const AsyncExecute& execute) {
  lead->claimed(claim.token, (policy.clock ? policy.clock : system_clock())->wall_now());
  auto owned = std::make_shared<OwnedClaim>(co_await asio::this_coro::executor, store, lead,
                                            call.key, claim.token, policy.lease, policy.clock);
  OwnedClaim& owned_claim = *owned;
  SharedClaimHold hold(std::move(owned));
  Execution execution;
  std::exception_ptr error;
  try {
    const std::shared_ptr<const OwnedKeys> keys = lead->owned_keys();
    execution = co_await run_as_owner(keys, execute, hold);
  } catch (...) {
    error = std::current_exception();
  }
  if (error) {
    // Joiners share the failure now; the key is released when the last reference goes (at
    // once, or when a timed-out attempt still running ends).
    lead->failed(error);
    hold.drop();
    std::rethrow_exception(error);
  }
  owned_claim.armed = false;
  owned_claim.stop_renewal();
  hold.drop();
  bool recorded = false;
  bool release = false;
  try {
    StoredValue stored;
    stored.object = execution.value;
    stored.type = call.type;
    if (store->needs_bytes()) stored.bytes = call.codec->encode(execution.value.get());
    recorded = co_await store->complete(call.key, claim.token, std::move(stored), execution.report,
                                        policy.ttl);
  } catch (...) {
    // The value is real; only the record is missing (recorded == false). Free the key.
    release = true;
  }
  if (release) {
    try {
      (void)co_await store->release(call.key, claim.token);
    } catch (...) {
    }
  }
  co_return lead->succeeded(std::move(execution), recorded, claim.took_over);
}

}  // namespace

Task<CoordinatedResult> lead_flight(std::shared_ptr<AsyncStore> store,
                                    std::shared_ptr<FlightLead> lead,
                                    const IdempotencyPolicy& policy, const IdempotentCall& call,
                                    const AsyncExecute& execute) {
  const auto clock = policy.clock ? policy.clock : system_clock();
  std::optional<SteadyTime> until;
  HolderWait holder_wait(clock, std::chrono::milliseconds(5), std::chrono::milliseconds(250));
  for (;;) {
    ClaimOutcome claim;
    std::exception_ptr error;
    try {
      claim = co_await store->claim(call.key, call.fingerprint, policy.lease);
    } catch (...) {
      error = std::current_exception();
    }
    if (error) {
      const bool cancelled = co_await caller_cancelled();
      lead->abandon(cancelled ? nullptr : error);
      std::rethrow_exception(error);
    }
    switch (claim.status) {
      case ClaimOutcome::Status::acquired:
        co_return co_await execute_owned(store, lead, std::move(claim), policy, call, execute);
      case ClaimOutcome::Status::completed: {
        if (!claim.record) {
          auto missing = std::make_exception_ptr(
              StoreError("the idempotency store answered 'completed' for " +
                         idem::detail::key_subject(call) + " without the record"));
          lead->abandon(missing);
          std::rethrow_exception(missing);
        }
        co_return lead->replay(std::move(*claim.record));
      }
      case ClaimOutcome::Status::mismatch: {
        auto reuse = std::make_exception_ptr(
            idem::detail::key_reuse_error(call, claim.record ? &*claim.record : nullptr));
        lead->abandon(reuse);
        std::rethrow_exception(reuse);
      }
      case ClaimOutcome::Status::in_progress: {
        const IdempotencyRecord* holder = claim.record ? &*claim.record : nullptr;
        if (policy.in_progress == InProgressPolicy::reject) {
          auto busy = std::make_exception_ptr(idem::detail::in_progress_error(call, holder));
          lead->abandon(busy);
          std::rethrow_exception(busy);
        }
        if (call.stop.stop_requested()) {
          lead->abandon(nullptr);  // its joiners start over without it
          throw Cancelled("stopped waiting for " + idem::detail::key_subject(call) +
                          " (in progress in another process)");
        }
        const SteadyTime now = clock->steady_now();
        if (!until) until = now + policy.max_wait;
        if (call.wait_deadline && *call.wait_deadline <= *until && now >= *call.wait_deadline) {
          // This caller gave up; its joiners did not: they start over without it.
          lead->abandon(nullptr);
          throw TimeoutError("gave up waiting for " + idem::detail::key_subject(call) +
                             " (in progress in another process) at its wait deadline");
        }
        if (now >= *until) {
          auto busy = std::make_exception_ptr(
              idem::detail::in_progress_error(call, holder, policy.max_wait));
          lead->abandon(busy);
          std::rethrow_exception(busy);
        }
        // Wait for the holder, then claim again: completed -> replay, absent or abandoned ->
        // execute (idem/async/detail/holder_wait.hpp says how it waits).
        const SteadyTime wake = call.wait_deadline ? std::min(*until, *call.wait_deadline) : *until;
        bool waited = true;
        std::exception_ptr failed;
        try {
          waited = co_await holder_wait.once(*store, call.key,
                                             holder ? std::optional(holder->token) : std::nullopt,
                                             wake, call.stop);
        } catch (...) {
          failed = std::current_exception();
        }
        if (!waited) {
          lead->abandon(nullptr);  // its joiners start over without it
          throw Cancelled("stopped waiting for " + idem::detail::key_subject(call) +
                          " (in progress in another process)");
        }
        if (failed) {
          lead->abandon(failed);
          std::rethrow_exception(failed);
        }
        continue;
      }
    }
  }
}

// ---- joiners -----------------------------------------------------------------------------------

// A joiner's whole wait in one object: its registration in the flight (the FlightWaiter base),
// the outcome it is told, and the awaiting coroutine's completion. `state` orders the parties:
// notify() (any thread), the initiation and the cancellation handler (the joiner's executor),
// and give_up() (a caller's stop token or wait deadline, any thread); whichever of notify() and
// the initiation comes second posts the completion, and a withdrawal posts it only if it moves
// the state from `suspended`. The withdrawn states are final, and say why.
class FlightJoin final : public FlightWaiter {
 public:
  enum State : int { waiting, suspended, told, withdrawn, stopped, past_deadline };

  void notify(FlightOutcome outcome) noexcept override {
    outcome_ = std::move(outcome);
    int expected = state_.load(std::memory_order_acquire);
    while ((expected == waiting || expected == suspended) &&
           !state_.compare_exchange_weak(expected, told, std::memory_order_acq_rel)) {
    }
    if (expected == suspended) completion_.post(true);
  }

  // The initiation of await_flight(), on the joiner's executor.
  template <class Handler>
  void suspend(Handler&& handler) {
    auto slot = asio::get_associated_cancellation_slot(handler);
    // The slot's handler runs on this executor, as the initiation does, so it cannot fire before
    // the completion is in place; whoever posts the completion clears the slot before resuming.
    // Assigned before the state says `suspended`: from then on notify() may post at once.
    if (slot.is_connected()) {
      // Leaving the flight has no side effects: every cancellation type withdraws the joiner.
      slot.assign([this](asio::cancellation_type type) {
        if (type == asio::cancellation_type::none) return;
        int expected = suspended;
        if (!state_.compare_exchange_strong(expected, withdrawn, std::memory_order_acq_rel)) {
          return;  // told: the outcome is on its way
        }
        detach();
        completion_.post(false);
      });
    }
    static_assert(JoinCompletion::fits_inline<Handler>(),
                  "a joiner's completion handler no longer fits its inline storage");
    completion_.emplace(std::forward<Handler>(handler));
    int expected = waiting;
    if (!state_.compare_exchange_strong(expected, suspended, std::memory_order_acq_rel)) {
      completion_.post(expected == told);  // told already, or gave up already
    }
  }

  // The caller's stop token or wait deadline (`why`: stopped or past_deadline): the joiner
  // resumes with false unless it was told or withdrawn first. Any thread.
  void give_up(State why) noexcept {
    int expected = waiting;
    if (state_.compare_exchange_strong(expected, why, std::memory_order_acq_rel)) {
      detach();  // suspend() resumes it with false
      return;
    }
    if (expected == suspended &&
        state_.compare_exchange_strong(expected, why, std::memory_order_acq_rel)) {
      detach();
      completion_.post(false);
    }
  }

  const FlightOutcome& outcome() const { return outcome_; }
  // Read by the joiner once it resumed.
  bool past_its_deadline() const noexcept {
    return state_.load(std::memory_order_acquire) == past_deadline;
  }

 private:
  // The awaiting coroutine's completion handler and the outstanding work on its executor, kept
  // inline (the handler of use_awaitable is a pointer to the coroutine's stack).
  using JoinCompletion = Completion<void(bool), 72>;

  std::atomic<int> state_{waiting};
  FlightOutcome outcome_;
  JoinCompletion completion_;
};

FlightEntered enter_flight(IdempotencyCoordinator& coordinator,
                           const std::shared_ptr<AsyncStore>& store, const IdempotentCall& call) {
  if (store_or_default(store)->needs_bytes() &&
      (call.codec == nullptr || !call.codec->encode || !call.codec->decode)) {
    throw ConfigError("idempotency key " + quote_key(call.key) +
                      ": the store keeps results as bytes, so the call needs a codec");
  }
  FlightEntered entered;
  entered.join = std::make_shared<FlightJoin>();
  entered.lead = coordinator.enter(call, entered.join).lead;
  if (entered.lead) entered.join.reset();
  return entered;
}

Task<bool> await_flight(FlightJoin& join) {
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(bool)>(
      [&join](auto handler) { join.suspend(std::move(handler)); }, asio::use_awaitable);
}

namespace {

// Gives a joiner up at its wait deadline: a timer loop on its own strand, stopped when the wait
// ends. With an injected clock it reads that clock's time every kDeadlineSlice of real time.
constexpr auto kDeadlineSlice = std::chrono::milliseconds(20);

Task<void> watch_deadline(std::shared_ptr<FlightJoin> join, SteadyTime deadline,
                          std::shared_ptr<Clock> clock) {
  const bool real = clock == system_clock();
  asio::steady_timer timer(co_await asio::this_coro::executor);
  for (;;) {
    const SteadyTime now = clock->steady_now();
    if (now >= deadline) {
      join->give_up(FlightJoin::past_deadline);
      co_return;
    }
    const std::chrono::nanoseconds left = deadline - now;
    timer.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(
        real ? left : std::min<std::chrono::nanoseconds>(left, kDeadlineSlice)));
    if (!co_await await_timer(timer)) co_return;
  }
}

struct StopGivesUp {
  FlightJoin* join;
  void operator()() const noexcept { join->give_up(FlightJoin::stopped); }
};

// await_flight with the caller's stop token and wait deadline.
Task<bool> await_flight_bounded(std::shared_ptr<FlightJoin> join, const IdempotentCall& call,
                                std::shared_ptr<Clock> clock) {
  if (!clock) clock = system_clock();
  std::optional<std::stop_callback<StopGivesUp>> on_stop;
  if (call.stop.stop_possible()) on_stop.emplace(call.stop, StopGivesUp{join.get()});
  std::shared_ptr<asio::cancellation_signal> watch;
  std::optional<asio::strand<asio::any_io_executor>> strand;
  if (call.wait_deadline) {
    watch = std::make_shared<asio::cancellation_signal>();
    strand.emplace(asio::make_strand(co_await asio::this_coro::executor));
    // The signal holds the watch's cancellation state: the completion keeps it alive until the
    // watch is gone.
    asio::co_spawn(
        *strand, watch_deadline(join, *call.wait_deadline, clock),
        asio::bind_cancellation_slot(watch->slot(), [watch](const std::exception_ptr&) {}));
  }
  const bool told = co_await await_flight(*join);
  on_stop.reset();
  if (watch) {
    asio::post(*strand, [watch] { watch->emit(asio::cancellation_type::terminal); });
  }
  co_return told;
}

}  // namespace

Task<bool> await_join(const std::shared_ptr<FlightJoin>& join, const IdempotentCall& call,
                      const std::shared_ptr<Clock>& clock) {
  if (!call.stop.stop_possible() && !call.wait_deadline) return await_flight(*join);
  return await_flight_bounded(join, call, clock);
}

std::shared_ptr<const CoordinatedResult> joined_outcome(FlightJoin& join, bool told,
                                                        const IdempotentCall& call) {
  if (!told) {
    join.detach();
    if (join.past_its_deadline()) {
      throw TimeoutError("gave up waiting for " + idem::detail::key_subject(call) +
                         " at its wait deadline (the execution it waited for goes on)");
    }
    throw Cancelled("stopped waiting for " + idem::detail::key_subject(call) +
                    " (the execution it waited for goes on)");
  }
  const FlightOutcome& outcome = join.outcome();
  switch (outcome.kind) {
    case FlightOutcome::Kind::result:
      return outcome.result;
    case FlightOutcome::Kind::error:
      std::rethrow_exception(outcome.error);
    case FlightOutcome::Kind::start_over:
      break;
  }
  return nullptr;
}

}  // namespace idem::async::detail
