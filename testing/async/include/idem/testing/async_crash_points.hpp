// Crash points on the coroutine face: AsyncCrashingRecorder and AsyncCrashingStore decorate an
// idem::async::AsyncRecorder / AsyncStore (through idem/async/wrapper.hpp) and fire a CrashPlan at
// the points the protocol passes through, exactly where CrashingRecorder and CrashingStore fire
// it on the blocking face (idem/testing/crash_points.hpp has the plan, the actions, crash_point()
// for the points only the caller knows, and the table of where each point fires):
//
//   after_claim      the check let the event through (is_processed false; a batch with at
//                    least one unseen id); claim() acquired; transactional: inside the
//                    transaction, marker inserted, before the handler's coroutine runs
//   before_complete  before mark_processed() / complete(); transactional: after the handler's
//                    coroutine, before COMMIT
//   during_complete  mark_processed() / complete() / run_transactional() committed, before the
//                    call returns to its caller
//
// kill ends the process at once (SIGKILL) from inside the coroutine; throw_ throws InjectedCrash
// out of the awaited call, as a failing backend call would.
//
//   auto recorder = std::make_shared<idem::testing::AsyncCrashingRecorder>(
//       backend, idem::testing::CrashPlan::from_env());   // IDEM_CRASH_POINT=before_complete ...
//
// Thread safety: as thread-safe as the object they wrap (they add only an atomic counter).
//
// Needs idem::async (standalone Asio): link idem::testing_async.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/async/recorder.hpp"
#include "idem/async/store.hpp"
#include "idem/async/task.hpp"
#include "idem/async/wrapper.hpp"
#include "idem/testing/crash_points.hpp"

namespace idem::testing {

class AsyncCrashingRecorder final : public idem::async::RecorderWrapper {
 public:
  // Throws InvalidArgument for a null `inner`.
  AsyncCrashingRecorder(std::shared_ptr<idem::async::AsyncRecorder> inner, CrashPlan plan)
      : RecorderWrapper(inner), inner_(std::move(inner)), trigger_(plan) {}

  const CrashPlan& plan() const noexcept { return trigger_.plan(); }
  // How many times the plan fired (and threw) so far.
  std::uint64_t fired() const noexcept { return trigger_.fired(); }
  const std::shared_ptr<idem::async::AsyncRecorder>& inner() const noexcept { return inner_; }

 private:
  idem::async::Task<bool> do_is_processed(std::string_view consumer,
                                          std::string_view event_id) override {
    const bool processed = co_await RecorderWrapper::do_is_processed(consumer, event_id);
    if (!processed) trigger_.at(CrashPoint::after_claim);
    co_return processed;
  }

  idem::async::Task<void> do_mark_processed(std::string_view consumer,
                                            std::string_view event_id) override {
    trigger_.at(CrashPoint::before_complete);
    co_await RecorderWrapper::do_mark_processed(consumer, event_id);
    trigger_.at(CrashPoint::during_complete);
  }

  idem::async::Task<std::vector<bool>> do_is_processed_many(
      std::string_view consumer, std::span<const std::string> event_ids) override {
    std::vector<bool> processed =
        co_await RecorderWrapper::do_is_processed_many(consumer, event_ids);
    for (const bool seen : processed) {
      if (!seen) {
        trigger_.at(CrashPoint::after_claim);
        break;
      }
    }
    co_return processed;
  }

  idem::async::Task<void> do_mark_processed_many(std::string_view consumer,
                                                 std::span<const std::string> event_ids) override {
    trigger_.at(CrashPoint::before_complete);
    co_await RecorderWrapper::do_mark_processed_many(consumer, event_ids);
    trigger_.at(CrashPoint::during_complete);
  }

  idem::async::Task<Claim> do_claim(std::string_view consumer, std::string_view event_id,
                                    Millis lease) override {
    Claim claim = co_await RecorderWrapper::do_claim(consumer, event_id, lease);
    if (claim.status == Claim::Status::acquired) trigger_.at(CrashPoint::after_claim);
    co_return claim;
  }

  idem::async::Task<bool> do_complete(std::string_view consumer, std::string_view event_id,
                                      std::uint64_t token) override {
    trigger_.at(CrashPoint::before_complete);
    const bool completed = co_await RecorderWrapper::do_complete(consumer, event_id, token);
    if (completed) trigger_.at(CrashPoint::during_complete);
    co_return completed;
  }

  // after_claim and before_complete fire inside the transaction (so kill leaves it uncommitted
  // and throw_ rolls it back); during_complete fires after the commit.
  idem::async::Task<bool> do_run_transactional(std::string_view consumer, std::string_view event_id,
                                               TransactionalFn fn) override {
    idem::testing::detail::CrashTrigger* trigger = &trigger_;
    // A named function, not a lambda converted inside the co_await expression: g++ 12 destroys
    // such a temporary twice.
    TransactionalFn guarded = [trigger, fn = std::move(fn)](idem::async::AsyncSqlTransaction& tx) {
      return inside_transaction(*trigger, fn, tx);
    };
    const bool ran =
        co_await RecorderWrapper::do_run_transactional(consumer, event_id, std::move(guarded));
    if (ran) trigger_.at(CrashPoint::during_complete);
    co_return ran;
  }

  // A coroutine of its own (not a capturing lambda coroutine): its frame holds what it uses.
  static idem::async::Task<void> inside_transaction(idem::testing::detail::CrashTrigger& trigger,
                                                    TransactionalFn fn,
                                                    idem::async::AsyncSqlTransaction& tx) {
    trigger.at(CrashPoint::after_claim);
    co_await fn(tx);
    trigger.at(CrashPoint::before_complete);
  }

  std::shared_ptr<idem::async::AsyncRecorder> inner_;
  idem::testing::detail::CrashTrigger trigger_;
};

// Fires the plan at after_claim (claim() acquired), before_complete and during_complete
// (complete() returned true). Give it to idem::async::resilient / idem::async::operation as their
// store. As with CrashingStore, a throw_ at before_complete or during_complete does not reach
// the caller: the coordinator releases the key and returns the value (recorded = false).
class AsyncCrashingStore final : public idem::async::StoreWrapper {
 public:
  // Throws InvalidArgument for a null `inner`.
  AsyncCrashingStore(std::shared_ptr<idem::async::AsyncStore> inner, CrashPlan plan)
      : StoreWrapper(inner), inner_(std::move(inner)), trigger_(plan) {}

  const CrashPlan& plan() const noexcept { return trigger_.plan(); }
  std::uint64_t fired() const noexcept { return trigger_.fired(); }
  const std::shared_ptr<idem::async::AsyncStore>& inner() const noexcept { return inner_; }

 private:
  idem::async::Task<ClaimOutcome> do_claim(std::string_view key,
                                           std::optional<std::string_view> fingerprint,
                                           Millis lease) override {
    ClaimOutcome outcome = co_await StoreWrapper::do_claim(key, fingerprint, lease);
    if (outcome.status == ClaimOutcome::Status::acquired) trigger_.at(CrashPoint::after_claim);
    co_return outcome;
  }

  idem::async::Task<ClaimOutcome> do_claim_without_report(
      std::string_view key, std::optional<std::string_view> fingerprint, Millis lease) override {
    ClaimOutcome outcome = co_await StoreWrapper::do_claim_without_report(key, fingerprint, lease);
    if (outcome.status == ClaimOutcome::Status::acquired) trigger_.at(CrashPoint::after_claim);
    co_return outcome;
  }

  idem::async::Task<bool> do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                                      const ExecutionReport& report, Millis ttl) override {
    trigger_.at(CrashPoint::before_complete);
    const bool completed =
        co_await StoreWrapper::do_complete(key, token, std::move(value), report, ttl);
    if (completed) trigger_.at(CrashPoint::during_complete);
    co_return completed;
  }

  std::shared_ptr<idem::async::AsyncStore> inner_;
  idem::testing::detail::CrashTrigger trigger_;
};

}  // namespace idem::testing
