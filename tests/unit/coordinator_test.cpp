// IdempotencyCoordinator: join, replay, execute — and every way a caller can fail or give up.
//
// No test sleeps to synchronise: owners are held with gates, joiners are counted with
// IdempotencyCoordinator::waiters(), time moves with ManualClock, and store calls are observed
// through a forwarding store.
#include "idem/idempotency.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <typeindex>
#include <vector>

#include "../eventually.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/memory_store.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;
using idem::ClaimHold;
using idem::CoordinatedResult;
using idem::Execution;
using idem::IdempotencyStatus;

// A one-shot event: wait() blocks until open().
class Gate {
 public:
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

using idem::test::eventually;

// Forwards to another store, counting and optionally pausing calls, and optionally pretending
// to be a durable store (needs_bytes: objects are dropped, only bytes are kept).
class ForwardingStore final : public idem::IdempotencyStore {
 public:
  ForwardingStore(std::shared_ptr<idem::IdempotencyStore> inner, bool bytes_only)
      : inner_(std::move(inner)), bytes_only_(bytes_only) {}

  bool do_needs_bytes() const noexcept override { return bytes_only_; }

  idem::ClaimOutcome do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                              idem::Millis lease) override {
    if (hold_claims_) {
      count(claims_entered_);
      claim_gate_.wait();
    }
    return inner_->claim(key, fingerprint, lease);
  }
  bool do_complete(std::string_view key, std::uint64_t token, idem::StoredValue value,
                   const idem::ExecutionReport& report, idem::Millis ttl) override {
    if (bytes_only_) {
      value.object.reset();
      value.type.reset();
    }
    return inner_->complete(key, token, std::move(value), report, ttl);
  }
  bool do_release(std::string_view key, std::uint64_t token) override {
    return inner_->release(key, token);
  }
  bool do_renew(std::string_view key, std::uint64_t token, idem::Millis lease) override {
    const bool renewed = inner_->renew(key, token, lease);
    count(renewals_);
    return renewed;
  }
  std::optional<idem::IdempotencyRecord> do_lookup(std::string_view key) override {
    return inner_->lookup(key);
  }
  std::size_t do_purge_expired(const idem::PurgeProgress& progress) override {
    return inner_->purge_expired(progress);
  }
  std::size_t do_entry_count() override { return inner_->entry_count(); }
  std::optional<idem::IdempotencyRecord> do_wait(std::string_view key, idem::SteadyTime deadline,
                                                 std::stop_token stop) override {
    count(waits_);
    return inner_->wait(key, deadline, std::move(stop));
  }

  // Blocks claims (after counting them) until open_claims().
  void hold_claims() { hold_claims_ = true; }
  void open_claims() { claim_gate_.open(); }

  int renewals() { return get(renewals_); }
  int waits() { return get(waits_); }
  int claims_entered() { return get(claims_entered_); }
  // Blocks until `counter` exceeds `than`.
  void await_renewals_above(int than) { await(renewals_, than); }
  void await_waits_above(int than) { await(waits_, than); }
  void await_claims_entered_above(int than) { await(claims_entered_, than); }

 private:
  void count(int& counter) {
    std::lock_guard lock(mutex_);
    ++counter;
    cv_.notify_all();
  }
  int get(const int& counter) {
    std::lock_guard lock(mutex_);
    return counter;
  }
  void await(const int& counter, int than) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return counter > than; });
  }

  std::shared_ptr<idem::IdempotencyStore> inner_;
  bool bytes_only_;
  std::atomic<bool> hold_claims_{false};
  Gate claim_gate_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int renewals_ = 0;
  int waits_ = 0;
  int claims_entered_ = 0;
};

idem::ExecutionReport report_of(const std::string& operation) {
  idem::ExecutionReport report;
  report.operation = operation;
  report.started_at = idem::WallTime(std::chrono::seconds(1893456000));
  report.duration = 1500ns;
  idem::AttemptRecord failed;
  failed.number = 1;
  failed.status = idem::AttemptStatus::failed;
  failed.error_type = "std::runtime_error";
  failed.error_message = "flaky";
  failed.retryable = true;
  idem::AttemptRecord succeeded;
  succeeded.number = 2;
  report.attempts = {failed, succeeded};
  report.metadata["custom"] = "kept";
  return report;
}

Execution int_result(int value) {
  return Execution{std::make_shared<const int>(value), report_of("create_payment")};
}

int as_int(const CoordinatedResult& result) {
  EXPECT_NE(result.value, nullptr);
  return result.value ? *std::static_pointer_cast<const int>(result.value) : -1;
}

void expect_metadata(const CoordinatedResult& result, const std::string& key,
                     const std::string& status) {
  const auto& metadata = result.report.metadata;
  EXPECT_EQ(metadata.at("idempotency_enabled"), "true");
  EXPECT_EQ(metadata.at("idempotency_key"), key);
  EXPECT_EQ(metadata.at("idempotency_status"), status);
  EXPECT_EQ(metadata.at("idempotency_cache_hit"), status == "executed" ? "false" : "true");
  EXPECT_EQ(idem::to_string(result.status), status);
}

class CoordinatorTest : public ::testing::Test {
 protected:
  idem::IdempotentCall call(const std::string& key) const {
    idem::IdempotentCall c;
    c.key = key;
    c.type = std::type_index(typeid(int));
    c.operation = "create_payment";
    return c;
  }

  // How a run on a thread ended: its result, or what it threw.
  struct Outcome {
    std::optional<CoordinatedResult> result;
    std::exception_ptr error;
  };

  // A run on a thread of its own. result() waits for it and hands back its result (rethrowing
  // what it threw: a test that expected a result fails); error() waits and hands back what it
  // threw (null when it returned).
  class OnThread {
   public:
    template <class Run>
    explicit OnThread(Run run)
        : thread_([this, run = std::move(run)]() mutable {
            try {
              outcome_.result = run();
            } catch (...) {
              outcome_.error = std::current_exception();
            }
          }) {}
    OnThread(const OnThread&) = delete;
    OnThread& operator=(const OnThread&) = delete;
    ~OnThread() { join(); }

    const CoordinatedResult& result() {
      join();
      if (outcome_.error) std::rethrow_exception(outcome_.error);
      return outcome_.result.value();
    }
    std::exception_ptr error() {
      join();
      return outcome_.error;
    }

   private:
    void join() {
      if (thread_.joinable()) thread_.join();
    }

    Outcome outcome_;
    std::thread thread_;  // last: it starts once the outcome exists
  };

  // An owner held inside its operation, on a thread of its own: the constructor returns once the
  // operation runs (the key claimed), and it stays there until release(). The operation then
  // ends with `finish` (by default the int 1). body() is that operation, for callers that must
  // join the owner and not run it; executions() counts how often it ran.
  class HeldOwner {
   public:
    HeldOwner(
        idem::IdempotencyCoordinator& coordinator, const idem::IdempotencyPolicy& policy,
        const idem::IdempotentCall& call,
        std::function<Execution()> finish = [] { return int_result(1); })
        : finish_(std::move(finish)), owner_([this, &coordinator, policy, call] {
            return coordinator.run(policy, call, body());
          }) {
      running_.wait();
    }
    HeldOwner(const HeldOwner&) = delete;
    HeldOwner& operator=(const HeldOwner&) = delete;
    ~HeldOwner() { release_.open(); }  // before owner_ joins its thread

    std::function<Execution(ClaimHold&)> body() {
      return [this](ClaimHold&) {
        ++executions_;
        running_.open();
        release_.wait();
        return finish_();
      };
    }
    int executions() const { return executions_.load(); }
    // Lets the operation end; the owner's run, to wait for.
    OnThread& release() {
      release_.open();
      return owner_;
    }

   private:
    std::function<Execution()> finish_;
    std::atomic<int> executions_{0};
    Gate running_;
    Gate release_;
    OnThread owner_;  // last: it starts once the rest exists
  };

  // Another process: a second coordinator over the same store.
  std::shared_ptr<idem::IdempotencyCoordinator> other_process() const {
    return idem::make_idempotency_coordinator(store_);
  }
  // policy_, refusing a key in progress instead of waiting for it.
  idem::IdempotencyPolicy rejecting() const {
    auto policy = policy_;
    policy.in_progress = idem::InProgressPolicy::reject;
    return policy;
  }

  std::shared_ptr<idem::testing::ManualClock> clock_ =
      std::make_shared<idem::testing::ManualClock>();
  std::shared_ptr<idem::InMemoryIdempotencyStore> memory_ =
      std::make_shared<idem::InMemoryIdempotencyStore>(idem::InMemoryStoreOptions{.clock = clock_});
  std::shared_ptr<ForwardingStore> store_ = std::make_shared<ForwardingStore>(memory_, false);
  std::shared_ptr<idem::IdempotencyCoordinator> coordinator_ =
      idem::IdempotencyCoordinator::for_store(store_);
  idem::IdempotencyPolicy policy_{.store = store_, .clock = clock_};
};

// ---- executed, replayed, metadata ------------------------------------------------------------

TEST_F(CoordinatorTest, ExecutesOnceThenReplaysWithTheOriginalReport) {
  int executions = 0;
  auto execute = [&](ClaimHold&) {
    ++executions;
    return int_result(2499);
  };
  const CoordinatedResult first = coordinator_->run(policy_, call("pay:1"), execute);
  EXPECT_EQ(first.status, IdempotencyStatus::executed);
  EXPECT_EQ(as_int(first), 2499);
  EXPECT_FALSE(first.took_over);
  EXPECT_TRUE(first.recorded);
  expect_metadata(first, "pay:1", "executed");
  EXPECT_EQ(first.report.metadata.at("custom"), "kept");

  clock_->advance(10min);
  const CoordinatedResult second = coordinator_->run(policy_, call("pay:1"), execute);
  EXPECT_EQ(executions, 1);
  EXPECT_EQ(second.status, IdempotencyStatus::replayed);
  EXPECT_EQ(second.value, first.value) << "an in-process replay hands back the same object";
  expect_metadata(second, "pay:1", "replayed");
  // The replay carries the report of the execution that produced the value.
  EXPECT_EQ(second.report.operation, "create_payment");
  EXPECT_EQ(second.report.started_at, first.report.started_at);
  EXPECT_EQ(second.report.duration, first.report.duration);
  ASSERT_EQ(second.report.attempts.size(), 2u);
  EXPECT_EQ(second.report.attempts[0].error_message, "flaky");
  EXPECT_EQ(second.report.metadata.at("custom"), "kept");
  EXPECT_EQ(second.report.metadata.count("idempotency_recorded"), 0u);
}

// The idempotency_* entries the coordinator writes replace any the execution's report already
// had (executed and replayed alike); every other entry, idempotency_* or not, is kept as it was.
TEST_F(CoordinatorTest, ItsMetadataReplacesStaleEntriesAndKeepsTheRest) {
  auto execute = [&](ClaimHold&) {
    Execution execution = int_result(7);
    execution.report.metadata = {{"a_first", "kept"},
                                 {"idempotency_a", "kept"},
                                 {"idempotency_cache_hit", "stale"},
                                 {"idempotency_enabled", "stale"},
                                 {"idempotency_k", "kept"},
                                 {"idempotency_key", "stale"},
                                 {"idempotency_recorded", "kept"},
                                 {"idempotency_status", "stale"},
                                 {"idempotency_zz", "kept"},
                                 {"z_last", "kept"}};
    return execution;
  };
  auto expected = [](const std::string& status) {
    return std::map<std::string, std::string>{
        {"a_first", "kept"},
        {"idempotency_a", "kept"},
        {"idempotency_cache_hit", status == "executed" ? "false" : "true"},
        {"idempotency_enabled", "true"},
        {"idempotency_k", "kept"},
        {"idempotency_key", "pay:stale"},
        {"idempotency_recorded", "kept"},
        {"idempotency_status", status},
        {"idempotency_zz", "kept"},
        {"z_last", "kept"}};
  };
  const CoordinatedResult first = coordinator_->run(policy_, call("pay:stale"), execute);
  EXPECT_EQ(first.report.metadata, expected("executed"));
  const CoordinatedResult second = coordinator_->run(policy_, call("pay:stale"), execute);
  EXPECT_EQ(second.status, IdempotencyStatus::replayed);
  EXPECT_EQ(second.report.metadata, expected("replayed"));
}

TEST_F(CoordinatorTest, VoidResultsAreReplayed) {
  int executions = 0;
  auto c = call("void-op");
  c.type = std::type_index(typeid(void));
  auto execute = [&](ClaimHold&) {
    ++executions;
    return Execution{nullptr, report_of("void_op")};
  };
  EXPECT_EQ(coordinator_->run(policy_, c, execute).value, nullptr);
  const auto replay = coordinator_->run(policy_, c, execute);
  EXPECT_EQ(replay.status, IdempotencyStatus::replayed);
  EXPECT_EQ(replay.value, nullptr);
  EXPECT_EQ(executions, 1);
}

TEST_F(CoordinatorTest, KeysAreIndependent) {
  int executions = 0;
  auto execute = [&](ClaimHold&) { return int_result(++executions); };
  EXPECT_EQ(as_int(coordinator_->run(policy_, call("a"), execute)), 1);
  EXPECT_EQ(as_int(coordinator_->run(policy_, call("b"), execute)), 2);
  EXPECT_EQ(as_int(coordinator_->run(policy_, call("a"), execute)), 1);
}

// ---- joining ----------------------------------------------------------------------------------

TEST_F(CoordinatorTest, SixtyFourCallersOneExecution) {
  constexpr int kCallers = 64;
  HeldOwner owner(*coordinator_, policy_, call("pay:64"), [] { return int_result(7); });
  std::vector<std::unique_ptr<OnThread>> joiners;
  for (int i = 1; i < kCallers; ++i) {
    joiners.push_back(std::make_unique<OnThread>(
        [&] { return coordinator_->run(policy_, call("pay:64"), owner.body()); }));
  }
  EXPECT_TRUE(eventually([&] { return coordinator_->waiters("pay:64") == kCallers - 1; }));
  const CoordinatedResult& first = owner.release().result();
  EXPECT_EQ(first.status, IdempotencyStatus::executed);
  EXPECT_EQ(as_int(first), 7);
  for (auto& joiner : joiners) {
    const CoordinatedResult& joined = joiner->result();
    EXPECT_EQ(joined.status, IdempotencyStatus::joined);
    EXPECT_EQ(as_int(joined), 7);
    expect_metadata(joined, "pay:64", "joined");
    EXPECT_EQ(joined.report.metadata.at("custom"), "kept");
    EXPECT_EQ(joined.value, first.value) << "joiners share the object";
  }
  EXPECT_EQ(owner.executions(), 1);
  EXPECT_EQ(coordinator_->waiters("pay:64"), 0u);
}

template <class Thrown, class Check>
void every_caller_gets_the_exception(idem::IdempotencyCoordinator& coordinator,
                                     const idem::IdempotencyPolicy& policy,
                                     const idem::IdempotentCall& call, Thrown thrown, Check check) {
  constexpr int kCallers = 64;
  Gate owner_running;
  Gate release_owner;
  std::atomic<int> executions{0};
  auto execute = [&](ClaimHold&) -> Execution {
    ++executions;
    owner_running.open();
    release_owner.wait();
    throw thrown;
  };
  std::atomic<int> caught{0};
  std::atomic<int> wrong{0};
  // Every caller catches the same exception object; the test keeps a reference to it until the
  // threads are joined, so it is freed here and not by whichever catch ends last. (libstdc++'s
  // exception reference count is not instrumented, so TSan would report that free as racing
  // with another thread's read of the object.)
  std::mutex kept_mutex;
  std::vector<std::exception_ptr> kept;
  auto caller = [&] {
    try {
      coordinator.run(policy, call, execute);
      ++wrong;
    } catch (const Thrown& e) {
      {
        const std::lock_guard lock(kept_mutex);
        kept.push_back(std::current_exception());
      }
      if (check(e)) {
        ++caught;
      } else {
        ++wrong;
      }
    } catch (...) {
      ++wrong;
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(caller);
  owner_running.wait();
  for (int i = 1; i < kCallers; ++i)
    threads.emplace_back(caller);
  ASSERT_TRUE(eventually([&] { return coordinator.waiters(call.key) == kCallers - 1; }));
  release_owner.open();
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(executions.load(), 1);
  EXPECT_EQ(caught.load(), kCallers);
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(CoordinatorTest, AStdExceptionReachesEveryJoiner) {
  every_caller_gets_the_exception(
      *coordinator_, policy_, call("boom"), std::runtime_error("gateway down"),
      [](const std::runtime_error& e) { return std::string(e.what()) == "gateway down"; });
}

TEST_F(CoordinatorTest, ANonStdExceptionReachesEveryJoiner) {
  every_caller_gets_the_exception(*coordinator_, policy_, call("boom-42"), 42,
                                  [](int value) { return value == 42; });
}

TEST_F(CoordinatorTest, FailuresAreNotCached) {
  int executions = 0;
  auto failing = [&](ClaimHold&) -> Execution {
    ++executions;
    throw std::runtime_error("first try fails");
  };
  EXPECT_THROW(coordinator_->run(policy_, call("retry-me"), failing), std::runtime_error);
  EXPECT_FALSE(memory_->lookup("retry-me").has_value()) << "a failure releases the key";
  auto succeeding = [&](ClaimHold&) {
    ++executions;
    return int_result(5);
  };
  const auto second = coordinator_->run(policy_, call("retry-me"), succeeding);
  EXPECT_EQ(second.status, IdempotencyStatus::executed);
  EXPECT_EQ(as_int(second), 5);
  EXPECT_EQ(executions, 2);
}

TEST_F(CoordinatorTest, TheLeaderRegistersBeforeItClaims) {
  // The leader is stuck inside store.claim(); an in-process duplicate must join it, never see
  // the store's in_progress and mistake its own process for another (it would then reject).
  policy_.in_progress = idem::InProgressPolicy::reject;
  store_->hold_claims();
  int executions = 0;
  auto execute = [&](ClaimHold&) {
    ++executions;
    return int_result(11);
  };
  OnThread leader([&] { return coordinator_->run(policy_, call("k"), execute); });
  store_->await_claims_entered_above(0);
  OnThread joiner([&] { return coordinator_->run(policy_, call("k"), execute); });
  EXPECT_TRUE(eventually([&] { return coordinator_->waiters("k") == 1; }));
  store_->open_claims();
  EXPECT_EQ(leader.result().status, IdempotencyStatus::executed);
  EXPECT_EQ(joiner.result().status, IdempotencyStatus::joined);
  EXPECT_EQ(as_int(joiner.result()), 11);
  EXPECT_EQ(executions, 1);
  EXPECT_EQ(store_->claims_entered(), 1) << "the joiner never went to the store";
}

TEST_F(CoordinatorTest, JoinersOfAReplayAreReplayed) {
  coordinator_->run(policy_, call("done"), [](ClaimHold&) { return int_result(3); });
  store_->hold_claims();
  auto never = [](ClaimHold&) -> Execution { throw std::logic_error("must not execute"); };
  OnThread leader([&] { return coordinator_->run(policy_, call("done"), never); });
  store_->await_claims_entered_above(0);
  OnThread joiner([&] { return coordinator_->run(policy_, call("done"), never); });
  EXPECT_TRUE(eventually([&] { return coordinator_->waiters("done") == 1; }));
  store_->open_claims();
  EXPECT_EQ(leader.result().status, IdempotencyStatus::replayed);
  EXPECT_EQ(joiner.result().status, IdempotencyStatus::replayed);
  expect_metadata(joiner.result(), "done", "replayed");
  EXPECT_EQ(as_int(joiner.result()), 3);
}

// ---- giving up --------------------------------------------------------------------------------

TEST_F(CoordinatorTest, AWaiterStoppedByItsTokenDoesNotStopTheOwner) {
  HeldOwner owner(*coordinator_, policy_, call("k"), [] { return int_result(9); });
  std::stop_source stop;
  auto cancellable = call("k");
  cancellable.stop = stop.get_token();
  OnThread cancelled([&] { return coordinator_->run(policy_, cancellable, owner.body()); });
  EXPECT_TRUE(eventually([&] { return coordinator_->waiters("k") == 1; }));
  stop.request_stop();
  EXPECT_THROW(std::rethrow_exception(cancelled.error()), idem::Cancelled);
  EXPECT_EQ(coordinator_->waiters("k"), 0u);

  // The owner runs on, and a later caller still joins it.
  OnThread later([&] { return coordinator_->run(policy_, call("k"), owner.body()); });
  EXPECT_TRUE(eventually([&] { return coordinator_->waiters("k") == 1; }));
  EXPECT_EQ(owner.release().result().status, IdempotencyStatus::executed);
  EXPECT_EQ(later.result().status, IdempotencyStatus::joined);
  EXPECT_EQ(owner.executions(), 1);
}

TEST_F(CoordinatorTest, AWaiterPastItsDeadlineDoesNotStopTheOwner) {
  HeldOwner owner(*coordinator_, policy_, call("k"), [] { return int_result(9); });

  // A deadline already passed gives up at once, without waiting.
  auto impatient = call("k");
  impatient.wait_deadline = clock_->steady_now();
  EXPECT_THROW(coordinator_->run(policy_, impatient, owner.body()), idem::TimeoutError);

  // A deadline in the future gives up when the (manual) clock reaches it.
  auto bounded = call("k");
  bounded.wait_deadline = clock_->steady_now() + 5s;
  OnThread timed_out([&] { return coordinator_->run(policy_, bounded, owner.body()); });
  EXPECT_TRUE(eventually([&] { return coordinator_->waiters("k") == 1; }));
  clock_->advance(5s);
  EXPECT_THROW(std::rethrow_exception(timed_out.error()), idem::TimeoutError);

  OnThread later([&] { return coordinator_->run(policy_, call("k"), owner.body()); });
  EXPECT_TRUE(eventually([&] { return coordinator_->waiters("k") == 1; }));
  EXPECT_EQ(owner.release().result().status, IdempotencyStatus::executed);
  EXPECT_EQ(later.result().status, IdempotencyStatus::joined);
  EXPECT_EQ(owner.executions(), 1);
}

// ---- ClaimHold ----------------------------------------------------------------------------------

TEST_F(CoordinatorTest, ClaimHoldKeepsAFailedKeyClaimedUntilTheLastTokenGoes) {
  std::shared_ptr<void> lingering;  // the "attempt still running after a timeout"
  auto failing = [&](ClaimHold& hold) -> Execution {
    lingering = hold.retain();
    throw idem::TimeoutError("attempt timed out");
  };
  EXPECT_THROW(coordinator_->run(policy_, call("held"), failing), idem::TimeoutError);

  // The key is still claimed: another process sees it in progress ...
  auto record = memory_->lookup("held");
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::in_progress);
  EXPECT_THROW(other_process()->run(rejecting(), call("held"), failing), idem::AlreadyInProgress);

  // ... and a new caller in this process waits for the release, then executes once.
  std::atomic<int> executions{0};
  OnThread next([&] {
    return coordinator_->run(policy_, call("held"), [&](ClaimHold&) {
      ++executions;
      return int_result(1);
    });
  });
  EXPECT_TRUE(eventually([&] { return coordinator_->waiters("held") == 1; }));
  EXPECT_EQ(executions.load(), 0) << "never beside the lingering attempt";
  lingering.reset();
  EXPECT_EQ(next.result().status, IdempotencyStatus::executed);
  EXPECT_EQ(executions.load(), 1);
}

TEST_F(CoordinatorTest, ClaimHoldTokensOfASuccessDoNotMatter) {
  std::shared_ptr<void> lingering;
  const auto result = coordinator_->run(policy_, call("ok"), [&](ClaimHold& hold) {
    lingering = hold.retain();
    return int_result(4);
  });
  EXPECT_EQ(result.status, IdempotencyStatus::executed);
  lingering.reset();
  EXPECT_EQ(memory_->lookup("ok")->state, idem::IdempotencyRecord::State::completed);
  EXPECT_EQ(coordinator_->run(policy_, call("ok"), [](ClaimHold&) { return int_result(0); }).status,
            IdempotencyStatus::replayed);
}

TEST_F(CoordinatorTest, WaitingForALingeringClaimCanBeCancelled) {
  std::shared_ptr<void> lingering;
  EXPECT_THROW(coordinator_->run(policy_, call("held"),
                                 [&](ClaimHold& hold) -> Execution {
                                   lingering = hold.retain();
                                   throw std::runtime_error("failed");
                                 }),
               std::runtime_error);
  auto bounded = call("held");
  bounded.wait_deadline = clock_->steady_now();
  EXPECT_THROW(coordinator_->run(policy_, bounded, [](ClaimHold&) { return int_result(0); }),
               idem::TimeoutError);
  lingering.reset();
  EXPECT_FALSE(memory_->lookup("held").has_value());
}

// ---- re-entrancy
// ----------------------------------------------------------------------------------

TEST_F(CoordinatorTest, ReentryIsAnErrorNotADeadlock) {
  std::optional<std::string> nested_error;
  std::optional<IdempotencyStatus> other_key_status;
  const auto result = coordinator_->run(policy_, call("outer"), [&](ClaimHold&) {
    try {
      coordinator_->run(policy_, call("outer"), [](ClaimHold&) { return int_result(0); });
    } catch (const idem::ReentryError& e) {
      nested_error = e.key();
    }
    // Another key from inside the owner is fine.
    other_key_status =
        coordinator_->run(policy_, call("inner"), [](ClaimHold&) { return int_result(2); }).status;
    return int_result(1);
  });
  EXPECT_EQ(result.status, IdempotencyStatus::executed);
  EXPECT_EQ(nested_error, std::optional<std::string>("outer"));
  EXPECT_EQ(other_key_status, std::optional<IdempotencyStatus>(IdempotencyStatus::executed));
}

TEST_F(CoordinatorTest, ReentryIsCaughtOnAWorkerThreadCarryingTheContext) {
  std::exception_ptr worker_error;
  coordinator_->run(policy_, call("outer"), [&](ClaimHold&) {
    std::thread worker([&, context = idem::current_owned_keys()] {
      idem::OwnedKeysScope scope(context);
      try {
        coordinator_->run(policy_, call("outer"), [](ClaimHold&) { return int_result(0); });
      } catch (...) {
        worker_error = std::current_exception();
      }
    });
    worker.join();
    return int_result(1);
  });
  EXPECT_THROW(std::rethrow_exception(worker_error), idem::ReentryError);
  EXPECT_EQ(idem::current_owned_keys(), nullptr) << "the scope ends with the execution";
}

TEST_F(CoordinatorTest, ReentryThroughAnotherCoordinatorOfTheSameStoreIsCaught) {
  const auto other = other_process();
  std::exception_ptr error;
  coordinator_->run(policy_, call("outer"), [&](ClaimHold&) {
    try {
      other->run(policy_, call("outer"), [](ClaimHold&) { return int_result(0); });
    } catch (...) {
      error = std::current_exception();
    }
    return int_result(1);
  });
  EXPECT_THROW(std::rethrow_exception(error), idem::ReentryError);
}

// ---- fingerprints, keys, types ----------------------------------------------------------------

TEST_F(CoordinatorTest, AJoinerWithOtherArgumentsIsRefused) {
  auto first = call("pay:2");
  first.fingerprint = "fp-a";
  HeldOwner owner(*coordinator_, policy_, first);
  auto other = call("pay:2");
  other.fingerprint = "fp-b";
  try {
    coordinator_->run(policy_, other, owner.body());
    ADD_FAILURE() << "expected KeyReuseError";
  } catch (const idem::KeyReuseError& e) {
    EXPECT_EQ(e.key(), "pay:2");
    EXPECT_NE(std::string(e.what()).find("pay:2"), std::string::npos);
  }
  EXPECT_EQ(owner.release().result().status, IdempotencyStatus::executed);
}

TEST_F(CoordinatorTest, ACompletedKeyWithOtherArgumentsIsRefused) {
  auto first = call("pay:3");
  first.fingerprint = "fp-a";
  coordinator_->run(policy_, first, [](ClaimHold&) { return int_result(1); });
  auto other = call("pay:3");
  other.fingerprint = "fp-b";
  bool executed = false;
  EXPECT_THROW(coordinator_->run(policy_, other,
                                 [&](ClaimHold&) {
                                   executed = true;
                                   return int_result(2);
                                 }),
               idem::KeyReuseError);
  EXPECT_FALSE(executed);
  auto same = call("pay:3");
  same.fingerprint = "fp-a";
  EXPECT_EQ(coordinator_->run(policy_, same, [](ClaimHold&) { return int_result(2); }).status,
            IdempotencyStatus::replayed);
}

TEST_F(CoordinatorTest, InvalidKeysRunNothing) {
  bool executed = false;
  auto execute = [&](ClaimHold&) {
    executed = true;
    return int_result(1);
  };
  for (const std::string& key :
       {std::string(), std::string("   "), std::string(idem::kMaxKeyLength + 1, 'k'),
        std::string("a\0b", 3), std::string("tab\t")}) {
    EXPECT_THROW(coordinator_->run(policy_, call(key), execute), idem::InvalidKey);
  }
  EXPECT_FALSE(executed);
  EXPECT_EQ(memory_->entry_count(), 0u);
}

TEST_F(CoordinatorTest, BadPoliciesAreConfigErrors) {
  auto execute = [](ClaimHold&) { return int_result(1); };
  auto bad = policy_;
  bad.lease = 0ms;
  EXPECT_THROW(coordinator_->run(bad, call("k"), execute), idem::ConfigError);
  bad = policy_;
  bad.ttl = -1ms;
  EXPECT_THROW(coordinator_->run(bad, call("k"), execute), idem::ConfigError);
  bad = policy_;
  bad.max_wait = -1ms;
  EXPECT_THROW(coordinator_->run(bad, call("k"), execute), idem::ConfigError);
}

TEST_F(CoordinatorTest, AReplayOfAnotherTypeIsADecodeError) {
  coordinator_->run(policy_, call("shared-key"), [](ClaimHold&) { return int_result(1); });
  auto as_string = call("shared-key");
  as_string.type = std::type_index(typeid(std::string));
  try {
    coordinator_->run(policy_, as_string, [](ClaimHold&) { return int_result(0); });
    ADD_FAILURE() << "expected DecodeError";
  } catch (const idem::DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("int"), std::string::npos) << e.what();
  }
}

TEST_F(CoordinatorTest, AJoinerExpectingAnotherTypeIsADecodeError) {
  HeldOwner owner(*coordinator_, policy_, call("k"));
  auto as_string = call("k");
  as_string.type = std::type_index(typeid(std::string));
  EXPECT_THROW(coordinator_->run(policy_, as_string, owner.body()), idem::DecodeError);
  EXPECT_EQ(owner.release().result().status, IdempotencyStatus::executed);
}

// ---- TTL ----------------------------------------------------------------------------------------

TEST_F(CoordinatorTest, TtlCountsFromCompletionAndEndsAtTheBoundary) {
  policy_.ttl = 10s;
  int executions = 0;
  auto execute = [&](ClaimHold&) {
    clock_->advance(3s);  // a slow operation: the TTL starts when it completes
    return int_result(++executions);
  };
  EXPECT_EQ(coordinator_->run(policy_, call("k"), execute).status, IdempotencyStatus::executed);
  clock_->advance(10s - 1ms);
  EXPECT_EQ(coordinator_->run(policy_, call("k"), execute).status, IdempotencyStatus::replayed);
  clock_->advance(1ms);  // exactly expires_at: expired
  const auto again = coordinator_->run(policy_, call("k"), execute);
  EXPECT_EQ(again.status, IdempotencyStatus::executed);
  EXPECT_EQ(as_int(again), 2);
  clock_->advance(10s + 1ms);
  EXPECT_EQ(coordinator_->run(policy_, call("k"), execute).status, IdempotencyStatus::executed);
  EXPECT_EQ(executions, 3);
}

// ---- leases -------------------------------------------------------------------------------------

TEST_F(CoordinatorTest, TheHeartbeatKeepsALongOwnersClaim) {
  policy_.lease = 300ms;  // renewed every 100 ms of the policy's (manual) clock
  HeldOwner owner(*coordinator_, policy_, call("long"));
  const auto other = other_process();
  for (int i = 0; i < 5; ++i) {
    clock_->advance(200ms);  // 1 s in all: more than three leases
    store_->await_renewals_above(store_->renewals());
    EXPECT_THROW(other->run(rejecting(), call("long"), owner.body()), idem::AlreadyInProgress)
        << "round " << i;
  }
  const CoordinatedResult& result = owner.release().result();
  EXPECT_EQ(result.status, IdempotencyStatus::executed);
  EXPECT_TRUE(result.recorded);
}

TEST_F(CoordinatorTest, AnOwnerWhoseClaimWasTakenOverIsNotRecorded) {
  // The lease lapses (no renewal comes within it), another process takes the key over, and the
  // first owner's complete() is fenced off: its value is returned but not recorded.
  policy_.lease = 1h;
  policy_.clock = nullptr;  // renewals on real time: the first would come after 20 minutes
  const auto result = coordinator_->run(policy_, call("fenced"), [&](ClaimHold&) {
    clock_->advance(1h);
    const auto takeover = memory_->claim("fenced", std::nullopt, 1h);
    EXPECT_EQ(takeover.status, idem::ClaimOutcome::Status::acquired);
    EXPECT_TRUE(takeover.took_over);
    return int_result(1);
  });
  EXPECT_EQ(result.status, IdempotencyStatus::executed);
  EXPECT_FALSE(result.recorded);
  EXPECT_EQ(result.report.metadata.at("idempotency_recorded"), "false");
  EXPECT_EQ(memory_->lookup("fenced")->state, idem::IdempotencyRecord::State::in_progress)
      << "the new owner's claim is untouched";
}

// ---- another process (a second coordinator over the same store) ----------------------------

TEST_F(CoordinatorTest, RejectPolicySaysWhoHoldsTheKeyUntilWhen) {
  HeldOwner owner(*coordinator_, policy_, call("busy"));
  const auto other = other_process();
  try {
    other->run(rejecting(), call("busy"), owner.body());
    ADD_FAILURE() << "expected AlreadyInProgress";
  } catch (const idem::AlreadyInProgress& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'busy'"), std::string::npos) << message;
    EXPECT_NE(message.find("2030-01-01T00:00:30.000Z"), std::string::npos) << message;
    EXPECT_TRUE(e.retryable());
  }
  (void)owner.release().result();
  // Once completed, the other process replays.
  const auto replay = other->run(rejecting(), call("busy"), owner.body());
  EXPECT_EQ(replay.status, IdempotencyStatus::replayed);
  EXPECT_EQ(as_int(replay), 1);
}

TEST_F(CoordinatorTest, WaitPolicyReplaysWhatTheOtherProcessCompletes) {
  HeldOwner owner(*coordinator_, policy_, call("shared"), [] { return int_result(77); });
  const auto other = other_process();
  bool other_executed = false;
  OnThread waiter([&] {
    return other->run(policy_, call("shared"), [&](ClaimHold&) {
      other_executed = true;
      return int_result(0);
    });
  });
  store_->await_waits_above(0);
  owner.release();
  EXPECT_EQ(waiter.result().status, IdempotencyStatus::replayed);
  EXPECT_EQ(as_int(waiter.result()), 77);
  EXPECT_FALSE(other_executed);
}

TEST_F(CoordinatorTest, WaitPolicyExecutesWhenTheOtherProcessFails) {
  HeldOwner owner(*coordinator_, policy_, call("shared"),
                  []() -> Execution { throw std::runtime_error("owner failed"); });
  const auto other = other_process();
  OnThread waiter([&] {
    return other->run(policy_, call("shared"), [](ClaimHold&) { return int_result(5); });
  });
  store_->await_waits_above(0);
  EXPECT_THROW(std::rethrow_exception(owner.release().error()), std::runtime_error);
  EXPECT_EQ(waiter.result().status, IdempotencyStatus::executed);
  EXPECT_EQ(as_int(waiter.result()), 5);
}

TEST_F(CoordinatorTest, WaitPolicyTakesOverADeadOwnersKey) {
  // "Another process" claims the key and dies (no heartbeat, no release).
  const auto dead = memory_->claim("orphan", std::nullopt, 30s);
  ASSERT_EQ(dead.status, idem::ClaimOutcome::Status::acquired);
  policy_.max_wait = 1min;
  OnThread waiter([&] {
    return coordinator_->run(policy_, call("orphan"), [](ClaimHold&) { return int_result(8); });
  });
  store_->await_waits_above(0);
  clock_->advance(30s);  // the dead owner's lease ends
  EXPECT_EQ(waiter.result().status, IdempotencyStatus::executed);
  EXPECT_TRUE(waiter.result().took_over);
  EXPECT_FALSE(memory_->complete("orphan", dead.token, {}, {}, 1h)) << "the dead owner is fenced";
}

TEST_F(CoordinatorTest, WaitPolicyGivesUpAfterMaxWait) {
  const auto other = memory_->claim("stuck", std::nullopt, 1h);
  ASSERT_EQ(other.status, idem::ClaimOutcome::Status::acquired);
  policy_.max_wait = 2s;
  OnThread waiter([&] {
    return coordinator_->run(policy_, call("stuck"), [](ClaimHold&) { return int_result(0); });
  });
  store_->await_waits_above(0);
  clock_->advance(2s);
  try {
    std::rethrow_exception(waiter.error());
  } catch (const idem::AlreadyInProgress& e) {
    EXPECT_NE(std::string(e.what()).find("2000 ms"), std::string::npos) << e.what();
  } catch (...) {
    ADD_FAILURE() << "expected AlreadyInProgress";
  }
}

TEST_F(CoordinatorTest, ALeaderThatStopsWaitingForAnotherProcessLeavesItsJoinersWaiting) {
  const auto other = memory_->claim("elsewhere", std::nullopt, 1h);
  ASSERT_EQ(other.status, idem::ClaimOutcome::Status::acquired);
  policy_.max_wait = 10min;
  std::stop_source stop;
  auto leader_call = call("elsewhere");
  leader_call.stop = stop.get_token();
  OnThread leader([&] {
    return coordinator_->run(policy_, leader_call, [](ClaimHold&) { return int_result(0); });
  });
  store_->await_waits_above(0);
  OnThread joiner([&] {
    return coordinator_->run(policy_, call("elsewhere"), [](ClaimHold&) { return int_result(6); });
  });
  EXPECT_TRUE(eventually([&] { return coordinator_->waiters("elsewhere") == 1; }));
  stop.request_stop();
  EXPECT_THROW(std::rethrow_exception(leader.error()), idem::Cancelled);
  // The joiner now leads and waits itself; the other process finishes by releasing.
  store_->await_waits_above(1);
  EXPECT_TRUE(memory_->release("elsewhere", other.token));
  EXPECT_EQ(joiner.result().status, IdempotencyStatus::executed);
  EXPECT_EQ(as_int(joiner.result()), 6);
}

// ---- coordinators and stores -----------------------------------------------------------------

TEST(CoordinatorRegistry, OneCoordinatorPerStore) {
  auto a = std::make_shared<idem::InMemoryIdempotencyStore>();
  auto b = std::make_shared<idem::InMemoryIdempotencyStore>();
  EXPECT_EQ(idem::IdempotencyCoordinator::for_store(a), idem::IdempotencyCoordinator::for_store(a));
  EXPECT_NE(idem::IdempotencyCoordinator::for_store(a), idem::IdempotencyCoordinator::for_store(b));
  EXPECT_EQ(idem::IdempotencyCoordinator::for_store(nullptr),
            idem::IdempotencyCoordinator::for_store(idem::default_idempotency_store()));
  EXPECT_NE(idem::make_idempotency_coordinator(a), idem::IdempotencyCoordinator::for_store(a));
  EXPECT_EQ(idem::default_idempotency_store(), idem::default_idempotency_store());
}

TEST(CoordinatorRegistry, TheRegistryDoesNotKeepStoresAlive) {
  auto store = std::make_shared<idem::InMemoryIdempotencyStore>();
  std::weak_ptr<idem::InMemoryIdempotencyStore> weak = store;
  auto coordinator = idem::IdempotencyCoordinator::for_store(store);
  idem::IdempotencyPolicy policy{.store = store};
  idem::IdempotentCall call{.key = "k"};
  coordinator->run(policy, call, [](ClaimHold&) { return Execution{}; });
  policy.store.reset();
  store.reset();
  EXPECT_TRUE(weak.expired());
  EXPECT_THROW(coordinator->run(policy, call, [](ClaimHold&) { return Execution{}; }),
               idem::ConfigError);
}

TEST(CoordinatorRegistry, TheDefaultStoreServesPoliciesWithoutAStore) {
  auto coordinator = idem::IdempotencyCoordinator::for_store(nullptr);
  const std::string key = "default-store-" + std::to_string(std::random_device{}());
  idem::IdempotentCall call{.key = key};
  int executions = 0;
  auto execute = [&](ClaimHold&) {
    ++executions;
    return Execution{};
  };
  coordinator->run({}, call, execute);
  EXPECT_EQ(coordinator->run({}, call, execute).status, IdempotencyStatus::replayed);
  EXPECT_EQ(executions, 1);
  EXPECT_TRUE(idem::default_idempotency_store()->lookup(key).has_value());
}

// ---- stores that need bytes
// ----------------------------------------------------------------------

TEST(CoordinatorBytes, DurableStoresGetBytesThroughTheCodec) {
  auto clock = std::make_shared<idem::testing::ManualClock>();
  auto memory =
      std::make_shared<idem::InMemoryIdempotencyStore>(idem::InMemoryStoreOptions{.clock = clock});
  auto store = std::make_shared<ForwardingStore>(memory, /*bytes_only=*/true);
  auto coordinator = idem::IdempotencyCoordinator::for_store(store);
  idem::IdempotencyPolicy policy{.store = store, .clock = clock};

  idem::ErasedCodec codec{
      [](const void* object) { return std::to_string(*static_cast<const int*>(object)); },
      [](std::string_view bytes) -> std::shared_ptr<const void> {
        return std::make_shared<const int>(std::stoi(std::string(bytes)));
      }};
  idem::IdempotentCall call{.key = "bytes", .codec = &codec, .type = typeid(int)};
  const auto first = coordinator->run(policy, call, [](ClaimHold&) { return int_result(2499); });
  EXPECT_EQ(first.status, IdempotencyStatus::executed);
  EXPECT_EQ(memory->lookup("bytes")->value.bytes, std::optional<std::string>("2499"));
  EXPECT_EQ(memory->lookup("bytes")->value.object, nullptr);

  const auto replay = coordinator->run(policy, call, [](ClaimHold&) { return int_result(0); });
  EXPECT_EQ(replay.status, IdempotencyStatus::replayed);
  EXPECT_EQ(as_int(replay), 2499);
  EXPECT_EQ(replay.report.metadata.at("custom"), "kept");

  idem::IdempotentCall without_codec{.key = "no-codec"};
  bool executed = false;
  EXPECT_THROW(coordinator->run(policy, without_codec,
                                [&](ClaimHold&) {
                                  executed = true;
                                  return int_result(1);
                                }),
               idem::ConfigError);
  EXPECT_FALSE(executed);
}

}  // namespace
