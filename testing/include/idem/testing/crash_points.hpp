// Crash points: make a process die (or throw) at each point where idem's protocols can be cut.
//
// idem's guarantees are about what happens when a process stops half-way: after it claimed an
// event, after its handler's side effect, just before or just after the marker commits, or after
// the commit but before the transport heard the ack. This header lets a test — idem's own crash
// matrix (tests/process/crash_matrix_test.cpp) or a user's test of their own handler — stop a
// process at exactly one of those points, then let a fresh process finish the work and count the
// side effects (docs/guarantees.md has the outcomes idem promises for every point).
//
//   * CrashPoint names the point, CrashAction what happens there: kill (SIGKILL: no destructor,
//     no flush, no unlock — what a power cut or the OOM killer does to the process) or throw_
//     (InjectedCrash: the process survives and the call fails, as with a bug in the handler).
//   * CrashPlan is one (point, action) pair; CrashPlan::from_env() arms a child process from
//     outside: IDEM_CRASH_POINT=before_complete IDEM_CRASH_ACTION=kill ./my_consumer.
//   * CrashingRecorder / CrashingStore decorate an IdempotencyRecorder / IdempotencyStore and fire
//     the plan at the points the protocol itself passes through; crash_point() fires it at the
//     points only the caller knows (after its side effect; after the handler returned, before the
//     ack). No production code changes: wrap the recorder or store the handler is given.
//
// Where each point fires:
//   after_claim              CrashingRecorder: claim() returned acquired; check_then_mark:
//                            is_processed() returned false (the check let the event through);
//                            transactional: inside the transaction, marker inserted, before the
//                            handler runs. CrashingStore: claim() returned acquired.
//   after_side_effect        crash_point() only: call it in the handler after its write.
//   before_complete          before mark_processed() / complete() is called; transactional:
//                            inside the transaction after the handler's work, before COMMIT.
//   during_complete          mark_processed() / complete() / run_transactional() committed (the
//                            inner call returned; complete() returned true) but the call has not
//                            returned to its caller yet.
//   after_commit_before_ack  crash_point() only: call it after the handler (or the idempotent
//                            operation) returned, before the delivery is acknowledged (or the
//                            result is used).
// A plan fires every time its point is reached (the decorators count firings: fired()). A plan
// with CrashPoint::none never fires, so a process can always be wrapped and armed only when the
// environment says so.
//
// Thread-safety: CrashPlan is a value. CrashingRecorder and CrashingStore are as thread-safe as
// the object they wrap (they add only an atomic counter). crash_point() is thread-safe.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/error.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/recorder.hpp"
#include "idem/wrapper.hpp"

namespace idem::testing {

enum class CrashPoint {
  none,                     // never fires
  after_claim,              // the claim (or the check, or the marker insert) succeeded
  after_side_effect,        // the handler's side effect is done (crash_point() in the handler)
  before_complete,          // the marker / result is about to be written
  during_complete,          // the marker / result is committed; the call has not returned
  after_commit_before_ack,  // the handler returned; the delivery is not acknowledged yet
};

enum class CrashAction {
  kill,    // SIGKILL the whole process at once: no destructors, no flush, no unlock
  throw_,  // throw InjectedCrash: the process survives, the call in progress fails
};

// Every point but none, in protocol order (for loops over the matrix).
inline constexpr CrashPoint kCrashPoints[] = {
    CrashPoint::after_claim, CrashPoint::after_side_effect, CrashPoint::before_complete,
    CrashPoint::during_complete, CrashPoint::after_commit_before_ack};

inline std::string_view to_string(CrashPoint point) noexcept {
  switch (point) {
    case CrashPoint::none:
      return "none";
    case CrashPoint::after_claim:
      return "after_claim";
    case CrashPoint::after_side_effect:
      return "after_side_effect";
    case CrashPoint::before_complete:
      return "before_complete";
    case CrashPoint::during_complete:
      return "during_complete";
    case CrashPoint::after_commit_before_ack:
      return "after_commit_before_ack";
  }
  return "unknown";
}

inline std::string_view to_string(CrashAction action) noexcept {
  switch (action) {
    case CrashAction::kill:
      return "kill";
    case CrashAction::throw_:
      return "throw";
  }
  return "unknown";
}

// The point named `text` (exactly as to_string() writes it). Throws ConfigError naming the text
// and the valid names otherwise.
inline CrashPoint parse_crash_point(std::string_view text) {
  if (text == "none") return CrashPoint::none;
  for (const CrashPoint point : kCrashPoints) {
    if (text == to_string(point)) return point;
  }
  std::string valid = "none";
  for (const CrashPoint point : kCrashPoints)
    valid += ", " + std::string(to_string(point));
  throw ConfigError("unknown crash point '" + std::string(text) + "' (valid: " + valid + ")");
}

// "kill" or "throw" (also "throw_"). Throws ConfigError naming the text otherwise.
inline CrashAction parse_crash_action(std::string_view text) {
  if (text == "kill") return CrashAction::kill;
  if (text == "throw" || text == "throw_") return CrashAction::throw_;
  throw ConfigError("unknown crash action '" + std::string(text) + "' (valid: kill, throw)");
}

// What CrashAction::throw_ throws. Deliberately not an idem::Error: it stands for the user's own
// code failing (or the process dying), so no idem code may mistake it for a retryable backend
// error.
class InjectedCrash : public std::runtime_error {
 public:
  explicit InjectedCrash(CrashPoint point)
      : std::runtime_error("injected crash at " + std::string(to_string(point))), point_(point) {}
  CrashPoint point() const noexcept { return point_; }

 private:
  CrashPoint point_;
};

struct CrashPlan {
  // Where to crash. Default none: the plan never fires.
  CrashPoint point = CrashPoint::none;
  // What to do there. Default kill.
  CrashAction action = CrashAction::kill;

  // True when a plan reaching `here` fires.
  bool fires_at(CrashPoint here) const noexcept {
    return point != CrashPoint::none && point == here;
  }

  // A plan from two strings as an operator would type them; an empty point means none, an empty
  // action means kill. Throws ConfigError (naming `source`, e.g. the variable) for bad values.
  static CrashPlan parse(std::string_view point_text, std::string_view action_text,
                         std::string_view source = "crash plan") {
    CrashPlan plan;
    try {
      if (!point_text.empty()) plan.point = parse_crash_point(point_text);
      if (!action_text.empty()) plan.action = parse_crash_action(action_text);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(source) + ": " + e.what());
    }
    return plan;
  }

  // The plan in the environment: IDEM_CRASH_POINT (unset or empty: none) and IDEM_CRASH_ACTION
  // (unset or empty: kill). A bad value throws ConfigError naming the variable, so a mistyped
  // point fails the process at start instead of silently never crashing.
  static CrashPlan from_env(const char* point_variable = "IDEM_CRASH_POINT",
                            const char* action_variable = "IDEM_CRASH_ACTION") {
    const char* point = std::getenv(point_variable);
    const char* action = std::getenv(action_variable);
    // Parsed one at a time so the error names the variable that holds the bad value.
    CrashPlan plan = parse(point ? point : "", "", point_variable);
    plan.action = parse("", action ? action : "", action_variable).action;
    return plan;
  }
};

// Fires `plan` if it is armed at `here`: kill never returns; throw_ throws InjectedCrash.
// Otherwise does nothing. Use it for the points only user code knows.
inline void crash_point(CrashPoint here, const CrashPlan& plan) {
  if (!plan.fires_at(here)) return;
  if (plan.action == CrashAction::throw_) throw InjectedCrash(here);
  // kill() of our own pid, not raise(): raise() targets the calling thread, and although SIGKILL
  // takes the whole process either way, saying "the process" is the point.
  ::kill(::getpid(), SIGKILL);
  std::_Exit(137);  // not reached: SIGKILL cannot be caught
}

namespace detail {

// The shared part of the decorators: the plan and how often it fired (throw_ only: kill does
// not come back to count).
class CrashTrigger {
 public:
  explicit CrashTrigger(CrashPlan plan) noexcept : plan_(plan) {}

  void at(CrashPoint here) {
    if (!plan_.fires_at(here)) return;
    fired_.fetch_add(1, std::memory_order_relaxed);
    crash_point(here, plan_);
  }
  const CrashPlan& plan() const noexcept { return plan_; }
  std::uint64_t fired() const noexcept { return fired_.load(std::memory_order_relaxed); }

 private:
  CrashPlan plan_;
  std::atomic<std::uint64_t> fired_{0};
};

}  // namespace detail

// An IdempotencyRecorder that forwards every call to `inner` (a RecorderWrapper) and fires the
// plan at after_claim, before_complete and during_complete (see the table at the top). Give it
// to an IdempotentHandler in place of the recorder it wraps.
//
// The batch calls crash the whole window at once, as a process crash in the middle of a batch
// settlement would: is_processed_many fires after_claim when it let at least one event through;
// mark_processed_many fires before_complete before the batch is written and during_complete
// after all of it is durable. The backend's own batch path runs in between.
class CrashingRecorder final : public RecorderWrapper {
 public:
  // Throws InvalidArgument for a null `inner`.
  CrashingRecorder(std::shared_ptr<IdempotencyRecorder> inner, CrashPlan plan)
      : RecorderWrapper(inner), inner_(std::move(inner)), trigger_(plan) {}

  const CrashPlan& plan() const noexcept { return trigger_.plan(); }
  // How many times the plan fired (and threw) so far.
  std::uint64_t fired() const noexcept { return trigger_.fired(); }
  const std::shared_ptr<IdempotencyRecorder>& inner() const noexcept { return inner_; }

 private:
  bool do_is_processed(std::string_view consumer, std::string_view event_id) override {
    const bool processed = RecorderWrapper::do_is_processed(consumer, event_id);
    // check_then_mark's "claim" is the check that lets the event through.
    if (!processed) trigger_.at(CrashPoint::after_claim);
    return processed;
  }

  void do_mark_processed(std::string_view consumer, std::string_view event_id) override {
    trigger_.at(CrashPoint::before_complete);
    RecorderWrapper::do_mark_processed(consumer, event_id);
    trigger_.at(CrashPoint::during_complete);
  }

  std::vector<bool> do_is_processed_many(std::string_view consumer,
                                         std::span<const std::string> event_ids) override {
    std::vector<bool> processed = RecorderWrapper::do_is_processed_many(consumer, event_ids);
    for (const bool seen : processed) {
      if (!seen) {
        trigger_.at(CrashPoint::after_claim);
        break;
      }
    }
    return processed;
  }

  void do_mark_processed_many(std::string_view consumer,
                              std::span<const std::string> event_ids) override {
    trigger_.at(CrashPoint::before_complete);
    RecorderWrapper::do_mark_processed_many(consumer, event_ids);
    trigger_.at(CrashPoint::during_complete);
  }

  Claim do_claim(std::string_view consumer, std::string_view event_id, Millis lease) override {
    Claim claim = RecorderWrapper::do_claim(consumer, event_id, lease);
    if (claim.status == Claim::Status::acquired) trigger_.at(CrashPoint::after_claim);
    return claim;
  }

  bool do_complete(std::string_view consumer, std::string_view event_id,
                   std::uint64_t token) override {
    trigger_.at(CrashPoint::before_complete);
    const bool completed = RecorderWrapper::do_complete(consumer, event_id, token);
    if (completed) trigger_.at(CrashPoint::during_complete);
    return completed;
  }

  // after_claim and before_complete fire inside the transaction (so kill leaves it uncommitted
  // and throw_ rolls it back); during_complete fires after the commit.
  bool do_run_transactional(std::string_view consumer, std::string_view event_id,
                            const std::function<void(Transaction&)>& fn) override {
    const bool ran =
        RecorderWrapper::do_run_transactional(consumer, event_id, [&](Transaction& tx) {
          trigger_.at(CrashPoint::after_claim);
          fn(tx);
          trigger_.at(CrashPoint::before_complete);
        });
    if (ran) trigger_.at(CrashPoint::during_complete);
    return ran;
  }

  std::shared_ptr<IdempotencyRecorder> inner_;
  detail::CrashTrigger trigger_;
};

// An IdempotencyStore that forwards every call to `inner` (a StoreWrapper) and fires the plan at
// after_claim (claim() acquired), before_complete and during_complete (complete() returned
// true). Give it to idem::resilient / idem::operation as their idempotency store.
//
// Note for throw_: the coordinator treats a failing complete() as "the value is real, only the
// record is missing" — it releases the key and returns the value (recorded = false), so a throw
// at before_complete / during_complete does not reach the caller. A throw at after_claim leaves
// the claim in the store until its lease passes (nobody learnt the token to release it).
class CrashingStore final : public StoreWrapper {
 public:
  // Throws InvalidArgument for a null `inner`.
  CrashingStore(std::shared_ptr<IdempotencyStore> inner, CrashPlan plan)
      : StoreWrapper(inner), inner_(std::move(inner)), trigger_(plan) {}

  const CrashPlan& plan() const noexcept { return trigger_.plan(); }
  std::uint64_t fired() const noexcept { return trigger_.fired(); }
  const std::shared_ptr<IdempotencyStore>& inner() const noexcept { return inner_; }

 private:
  ClaimOutcome do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                        Millis lease) override {
    ClaimOutcome outcome = StoreWrapper::do_claim(key, fingerprint, lease);
    if (outcome.status == ClaimOutcome::Status::acquired) trigger_.at(CrashPoint::after_claim);
    return outcome;
  }

  bool do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                   const ExecutionReport& report, Millis ttl) override {
    trigger_.at(CrashPoint::before_complete);
    const bool completed = StoreWrapper::do_complete(key, token, std::move(value), report, ttl);
    if (completed) trigger_.at(CrashPoint::during_complete);
    return completed;
  }

  std::shared_ptr<IdempotencyStore> inner_;
  detail::CrashTrigger trigger_;
};

}  // namespace idem::testing
