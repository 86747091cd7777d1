// idem::testing crash points: plan parsing (strings and environment, bad values name what was
// wrong), the throw_ action at every point of every handler mode and of the operation face
// (where it fires, what the protocol then leaves behind), and that the decorators forward every
// other call unchanged. The kill action in a child process is in
// tests/process/sqlite_child_process_test.cpp; across real backends it is the crash matrix's job
// (tests/process/crash_matrix_test.cpp).
#include "idem/testing/crash_points.hpp"
#include "idem/operation_idempotency.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../in_memory_transactional_recorder.hpp"
#include "../run_together.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/memory_store.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using idem::testing::CrashAction;
using idem::testing::CrashingRecorder;
using idem::testing::CrashingStore;
using idem::testing::CrashPlan;
using idem::testing::CrashPoint;
using idem::testing::InjectedCrash;
using namespace std::chrono_literals;

// Sets (or unsets, with nullptr) an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const idem::ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

// ---- plans --------------------------------------------------------------------------------

TEST(CrashPlanParsing, EveryPointAndActionRoundTrips) {
  EXPECT_EQ(idem::testing::parse_crash_point("none"), CrashPoint::none);
  for (const CrashPoint point : idem::testing::kCrashPoints) {
    EXPECT_EQ(idem::testing::parse_crash_point(idem::testing::to_string(point)), point);
  }
  EXPECT_EQ(idem::testing::parse_crash_action("kill"), CrashAction::kill);
  EXPECT_EQ(idem::testing::parse_crash_action("throw"), CrashAction::throw_);
  EXPECT_EQ(idem::testing::parse_crash_action("throw_"), CrashAction::throw_);
  EXPECT_EQ(idem::testing::parse_crash_action(idem::testing::to_string(CrashAction::throw_)),
            CrashAction::throw_);
}

TEST(CrashPlanParsing, BadValuesAreConfigErrorsNamingTheValueAndTheChoices) {
  const std::string point = message_of([] { idem::testing::parse_crash_point("after_clam"); });
  EXPECT_NE(point.find("'after_clam'"), std::string::npos) << point;
  EXPECT_NE(point.find("after_commit_before_ack"), std::string::npos) << point;
  const std::string action = message_of([] { idem::testing::parse_crash_action("abort"); });
  EXPECT_NE(action.find("'abort'"), std::string::npos) << action;
  EXPECT_NE(action.find("kill, throw"), std::string::npos) << action;
  // Case and spaces are not guessed at: a plan that does not parse must not silently be none.
  EXPECT_THROW(idem::testing::parse_crash_point("After_Claim"), idem::ConfigError);
  EXPECT_THROW(idem::testing::parse_crash_point(" after_claim"), idem::ConfigError);
  EXPECT_THROW(idem::testing::parse_crash_point(std::string_view("after_claim\0x", 13)),
               idem::ConfigError);
}

TEST(CrashPlanParsing, EmptyStringsMeanNoneAndKill) {
  const CrashPlan plan = CrashPlan::parse("", "");
  EXPECT_EQ(plan.point, CrashPoint::none);
  EXPECT_EQ(plan.action, CrashAction::kill);
  EXPECT_FALSE(plan.fires_at(CrashPoint::none)) << "none never fires";
  const CrashPlan armed = CrashPlan::parse("during_complete", "throw");
  EXPECT_TRUE(armed.fires_at(CrashPoint::during_complete));
  EXPECT_FALSE(armed.fires_at(CrashPoint::before_complete));
}

TEST(CrashPlanFromEnv, UnsetOrEmptyVariablesGiveAPlanThatNeverFires) {
  ScopedEnv point("IDEM_CRASH_POINT", nullptr);
  ScopedEnv action("IDEM_CRASH_ACTION", "");
  const CrashPlan plan = CrashPlan::from_env();
  EXPECT_EQ(plan.point, CrashPoint::none);
  EXPECT_EQ(plan.action, CrashAction::kill);
}

TEST(CrashPlanFromEnv, ReadsBothVariables) {
  ScopedEnv point("IDEM_CRASH_POINT", "before_complete");
  ScopedEnv action("IDEM_CRASH_ACTION", "throw");
  const CrashPlan plan = CrashPlan::from_env();
  EXPECT_EQ(plan.point, CrashPoint::before_complete);
  EXPECT_EQ(plan.action, CrashAction::throw_);
}

TEST(CrashPlanFromEnv, BadValuesNameTheVariable) {
  {
    ScopedEnv point("IDEM_CRASH_POINT", "sometime");
    ScopedEnv action("IDEM_CRASH_ACTION", nullptr);
    const std::string message = message_of([] { CrashPlan::from_env(); });
    EXPECT_NE(message.find("IDEM_CRASH_POINT"), std::string::npos) << message;
    EXPECT_NE(message.find("'sometime'"), std::string::npos) << message;
  }
  {
    ScopedEnv point("IDEM_CRASH_POINT", "after_claim");
    ScopedEnv action("IDEM_CRASH_ACTION", "segfault");
    const std::string message = message_of([] { CrashPlan::from_env(); });
    EXPECT_NE(message.find("IDEM_CRASH_ACTION"), std::string::npos) << message;
    EXPECT_NE(message.find("'segfault'"), std::string::npos) << message;
  }
}

TEST(CrashPlanFromEnv, OtherVariableNamesCanBeUsed) {
  ScopedEnv point("MY_APP_CRASH_AT", "after_side_effect");
  ScopedEnv action("MY_APP_CRASH_HOW", "throw");
  const CrashPlan plan = CrashPlan::from_env("MY_APP_CRASH_AT", "MY_APP_CRASH_HOW");
  EXPECT_EQ(plan.point, CrashPoint::after_side_effect);
  EXPECT_EQ(plan.action, CrashAction::throw_);
}

// ---- crash_point() --------------------------------------------------------------------------

TEST(CrashPointFunction, ThrowsOnlyAtItsPoint) {
  const CrashPlan plan{CrashPoint::after_side_effect, CrashAction::throw_};
  EXPECT_NO_THROW(idem::testing::crash_point(CrashPoint::after_claim, plan));
  EXPECT_NO_THROW(idem::testing::crash_point(CrashPoint::none, CrashPlan{}));
  try {
    idem::testing::crash_point(CrashPoint::after_side_effect, plan);
    FAIL() << "did not throw";
  } catch (const InjectedCrash& e) {
    EXPECT_EQ(e.point(), CrashPoint::after_side_effect);
    EXPECT_STREQ(e.what(), "injected crash at after_side_effect");
  }
}

TEST(CrashPointFunction, InjectedCrashIsNotAnIdemError) {
  // Retry loops and workers treat idem::Error specially (retryable, in doubt); an injected crash
  // must look like the user's own code failing.
  const CrashPlan plan{CrashPoint::after_claim, CrashAction::throw_};
  try {
    idem::testing::crash_point(CrashPoint::after_claim, plan);
  } catch (const idem::Error&) {
    FAIL() << "InjectedCrash derives from idem::Error";
  } catch (const std::runtime_error&) {
    SUCCEED();
  }
}

// ---- CrashingRecorder in every handler mode (throw_) -----------------------------------------

// A "transaction" whose writes are a counter.
struct WriteCountingTransaction : idem::Transaction {
  int writes = 0;
};

// A transactional recorder for the unit tests: the memory recorder's markers, and a transaction
// whose writes are kept (counted in committed_writes) only when fn returns.
class FakeTransactionalRecorder final
    : public idem::test::InMemoryTransactionalRecorder<WriteCountingTransaction> {
 public:
  using Tx = WriteCountingTransaction;

  std::atomic<int> committed_writes{0};

 private:
  void commit(Tx& tx) override { committed_writes += tx.writes; }
};

struct ModeCase {
  idem::HandlerMode mode;
  CrashPoint point;
  // What a process that survived the throw left behind, and what a redelivery then does.
  int effects_after_throw;  // side effects run by the failed delivery
  bool marked_after_throw;  // the event counts as processed after the failed delivery
};

class CrashingRecorderThrows : public ::testing::TestWithParam<ModeCase> {};

TEST_P(CrashingRecorderThrows, FailsTheDeliveryAtThePointAndTheRedeliveryFinishesOnce) {
  const ModeCase c = GetParam();
  auto clock = std::make_shared<idem::testing::ManualClock>();  // the recorder's leases
  std::shared_ptr<idem::IdempotencyRecorder> inner;
  FakeTransactionalRecorder* transactional = nullptr;
  if (c.mode == idem::HandlerMode::transactional) {
    auto fake = std::make_shared<FakeTransactionalRecorder>();
    transactional = fake.get();
    inner = fake;
  } else {
    idem::InMemoryRecorderOptions recorder_options;
    recorder_options.clock = clock;
    inner = std::make_shared<idem::InMemoryIdempotencyRecorder>(recorder_options);
  }
  const CrashPlan plan{c.point, CrashAction::throw_};
  auto crashing = std::make_shared<CrashingRecorder>(inner, plan);

  std::atomic<int> effects{0};
  CrashPlan active = plan;  // what the handler's own crash point fires
  auto handle = [&](const std::string&, idem::BusProxy& bus) {
    ++effects;
    if (auto* tx = dynamic_cast<FakeTransactionalRecorder::Tx*>(bus.transaction())) ++tx->writes;
    idem::testing::crash_point(CrashPoint::after_side_effect, active);
  };
  idem::HandlerOptions options;
  options.mode = c.mode;
  options.lease = 10s;  // renewed every 3.3 s of real time: never during this test
  auto handler = idem::make_idempotent_handler<std::string>("billing", crashing, handle, options);
  idem::CollectingBusProxy bus("billing");
  idem::Event event;
  event.id = idem::new_event_id();

  bool threw = false;
  try {
    (void)(*handler)(event, bus);
    idem::testing::crash_point(CrashPoint::after_commit_before_ack, plan);
  } catch (const InjectedCrash& e) {
    threw = true;
    EXPECT_EQ(e.point(), c.point);
  }
  EXPECT_TRUE(threw) << to_string(c.mode) << "/" << to_string(c.point) << " never fired";
  EXPECT_EQ(crashing->fired(), c.point == CrashPoint::after_side_effect ||
                                       c.point == CrashPoint::after_commit_before_ack
                                   ? 0u
                                   : 1u)
      << "user-side points are fired by crash_point(), not by the decorator";
  EXPECT_EQ(effects.load(), c.effects_after_throw);
  EXPECT_EQ(inner->is_processed("billing", event.id), c.marked_after_throw);
  if (c.mode == idem::HandlerMode::exclusive &&
      (c.point == CrashPoint::after_claim || c.point == CrashPoint::before_complete)) {
    // The throw came out of claim() (after acquiring) or complete() (before it ran): the handler
    // releases a claim only when `handle` fails, so the claim holds until its lease passes, as
    // after a kill.
    const auto left = inner->inspect("billing", event.id);
    ASSERT_TRUE(left.claim.has_value());
    EXPECT_TRUE(left.claim->live);
    clock->advance(options.lease + 1s);
  } else if (c.mode == idem::HandlerMode::exclusive && !c.marked_after_throw) {
    // A throw inside `handle` lets the handler release its claim (unlike a kill): no lease to
    // wait for.
    EXPECT_FALSE(inner->inspect("billing", event.id).claim.has_value());
  }

  // The redelivery, in a process without a plan.
  active = CrashPlan{};
  auto fixed = idem::make_idempotent_handler<std::string>("billing", inner, handle, options);
  const auto again = (*fixed)(event, bus);
  EXPECT_EQ(again,
            c.marked_after_throw ? idem::HandleResult::duplicate : idem::HandleResult::processed);
  EXPECT_TRUE(inner->is_processed("billing", event.id));
  const int expected_total = c.effects_after_throw + (c.marked_after_throw ? 0 : 1);
  EXPECT_EQ(effects.load(), expected_total);
  if (transactional) {
    EXPECT_EQ(transactional->committed_writes.load(), 1) << "the transaction's writes: once";
  }
}

using M = idem::HandlerMode;
using P = CrashPoint;
INSTANTIATE_TEST_SUITE_P(
    AllModes, CrashingRecorderThrows,
    ::testing::Values(ModeCase{M::check_then_mark, P::after_claim, 0, false},
                      ModeCase{M::check_then_mark, P::after_side_effect, 1, false},
                      ModeCase{M::check_then_mark, P::before_complete, 1, false},
                      ModeCase{M::check_then_mark, P::during_complete, 1, true},
                      ModeCase{M::check_then_mark, P::after_commit_before_ack, 1, true},
                      ModeCase{M::exclusive, P::after_claim, 0, false},
                      ModeCase{M::exclusive, P::after_side_effect, 1, false},
                      ModeCase{M::exclusive, P::before_complete, 1, false},
                      ModeCase{M::exclusive, P::during_complete, 1, true},
                      ModeCase{M::exclusive, P::after_commit_before_ack, 1, true},
                      ModeCase{M::transactional, P::after_claim, 0, false},
                      ModeCase{M::transactional, P::after_side_effect, 1, false},
                      ModeCase{M::transactional, P::before_complete, 1, false},
                      ModeCase{M::transactional, P::during_complete, 1, true},
                      ModeCase{M::transactional, P::after_commit_before_ack, 1, true}),
    [](const ::testing::TestParamInfo<ModeCase>& param_info) {
      return std::string(to_string(param_info.param.mode)) + "_" +
             std::string(idem::testing::to_string(param_info.param.point));
    });

TEST(CrashingRecorder, DoesNotFireOnDuplicatesOrRefusals) {
  auto inner = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  inner->mark_processed("c", "done");
  const auto held = inner->claim("c", "held", 30s);
  ASSERT_EQ(held.status, idem::Claim::Status::acquired);
  CrashingRecorder claims(inner, CrashPlan{CrashPoint::after_claim, CrashAction::throw_});
  EXPECT_EQ(claims.claim("c", "done", 1s).status, idem::Claim::Status::processed);
  EXPECT_EQ(claims.claim("c", "held", 1s).status, idem::Claim::Status::in_progress);
  EXPECT_TRUE(claims.is_processed("c", "done"));
  EXPECT_EQ(claims.fired(), 0u);

  // A fenced-off complete() committed nothing: during_complete does not fire.
  CrashingRecorder completes(inner, CrashPlan{CrashPoint::during_complete, CrashAction::throw_});
  EXPECT_FALSE(completes.complete("c", "held", held.token + 100));
  EXPECT_EQ(completes.fired(), 0u);
  EXPECT_THROW((void)completes.complete("c", "held", held.token), InjectedCrash);
  EXPECT_TRUE(inner->is_processed("c", "held")) << "during_complete fires after the commit";
  EXPECT_EQ(completes.fired(), 1u);
}

TEST(CrashingRecorder, ForwardsEveryOtherCallUnchanged) {
  auto clock = std::make_shared<idem::testing::ManualClock>();
  idem::InMemoryRecorderOptions options;
  options.clock = clock;
  auto inner = std::make_shared<idem::InMemoryIdempotencyRecorder>(options);
  // Armed at a point the forwarded calls never pass, so any firing would be a bug.
  CrashingRecorder recorder(inner, CrashPlan{CrashPoint::after_side_effect, CrashAction::throw_});
  EXPECT_TRUE(recorder.supports_claims());
  EXPECT_FALSE(recorder.supports_transactions());
  EXPECT_EQ(recorder.inner(), inner);
  EXPECT_EQ(recorder.plan().point, CrashPoint::after_side_effect);

  recorder.mark_processed("a", "e1");
  recorder.mark_processed("b", "e2");
  const auto claim = recorder.claim("a", "e3", 10s);
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  EXPECT_TRUE(recorder.renew("a", "e3", claim.token, 20s));
  EXPECT_EQ(inner->inspect("a", "e3").claim->lease_until, clock->wall_now() + 20s);
  EXPECT_EQ(recorder.inspect("a", "e3").claim->token, claim.token);
  EXPECT_TRUE(recorder.inspect("a", "e1").processed);

  const auto counts = recorder.consumer_counts();
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_EQ(counts[0].consumer, "a");
  EXPECT_EQ(counts[0].processed, 1u);
  EXPECT_EQ(counts[0].in_progress, 1u);
  EXPECT_TRUE(recorder.release("a", "e3", claim.token));
  EXPECT_FALSE(inner->inspect("a", "e3").claim.has_value());

  clock->advance(1h);
  recorder.mark_processed("a", "young");
  EXPECT_EQ(recorder.count_purgeable(30min), 2u);
  std::vector<std::size_t> progress;
  EXPECT_EQ(recorder.purge(30min, [&](std::size_t n) { progress.push_back(n); }), 2u);
  EXPECT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), 2u);
  EXPECT_FALSE(inner->is_processed("a", "e1"));
  EXPECT_TRUE(inner->is_processed("a", "young"));
  clock->advance(1h);
  EXPECT_EQ(recorder.purge(30min), 1u);
  EXPECT_EQ(recorder.fired(), 0u);

  // Bad keys reach the inner recorder's validation unchanged.
  EXPECT_THROW(recorder.mark_processed("", "e"), idem::InvalidKey);
  EXPECT_THROW((void)recorder.inspect("a", std::string_view("x\0y", 3)), idem::InvalidKey);
  // And what the inner one does not support stays unsupported.
  EXPECT_THROW((void)recorder.run_transactional("a", "e9", [](idem::Transaction&) {}),
               idem::NotSupported);
}

TEST(CrashingRecorder, NullInnerIsRefused) {
  EXPECT_THROW(CrashingRecorder(nullptr, CrashPlan{}), idem::InvalidArgument);
  EXPECT_THROW(CrashingStore(nullptr, CrashPlan{}), idem::InvalidArgument);
}

TEST(CrashingRecorder, ManyThreadsCountEveryFiring) {
  auto inner = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  auto crashing = std::make_shared<CrashingRecorder>(
      inner, CrashPlan{CrashPoint::during_complete, CrashAction::throw_});
  constexpr int kThreads = 8;
  constexpr int kEach = 50;
  std::atomic<int> thrown{0};
  idem::test::run_together(kThreads, [&](int t) {
    for (int i = 0; i < kEach; ++i) {
      try {
        crashing->mark_processed("c", "e" + std::to_string(t) + "-" + std::to_string(i));
      } catch (const InjectedCrash&) {
        ++thrown;
      }
    }
  });
  EXPECT_EQ(thrown.load(), kThreads * kEach);
  EXPECT_EQ(crashing->fired(), static_cast<std::uint64_t>(kThreads * kEach));
  EXPECT_EQ(inner->consumer_counts().at(0).processed, static_cast<std::uint64_t>(kThreads * kEach));
}

// ---- CrashingStore (throw_) -----------------------------------------------------------------

using Operation = std::string(const std::string&);

struct StoreRun {
  std::shared_ptr<idem::testing::ManualClock> clock =
      std::make_shared<idem::testing::ManualClock>();
  std::shared_ptr<idem::InMemoryIdempotencyStore> inner;
  std::atomic<int> effects{0};

  StoreRun() {
    idem::InMemoryStoreOptions options;
    options.clock = clock;
    inner = std::make_shared<idem::InMemoryIdempotencyStore>(options);
  }

  idem::Resilient<Operation> operation(std::shared_ptr<idem::IdempotencyStore> store,
                                       CrashPlan plan) {
    idem::ResilientOptions<Operation> options;
    options.name = "crash-unit";
    options.idempotency_key = [](const std::string& key) { return key; };
    options.idempotency_store = std::move(store);
    options.idempotency_lease = 10s;
    options.idempotency_in_progress = idem::InProgressPolicy::reject;
    options.clock = clock;
    return idem::resilient<Operation>(
        [this, plan](const std::string& key) {
          ++effects;
          idem::testing::crash_point(CrashPoint::after_side_effect, plan);
          return "value:" + key;
        },
        std::move(options));
  }
};

TEST(CrashingStore, ThrowAtAfterSideEffectFailsTheCallAndReleasesTheKey) {
  StoreRun run;
  const CrashPlan plan{CrashPoint::after_side_effect, CrashAction::throw_};
  auto crashing = std::make_shared<CrashingStore>(run.inner, plan);
  auto op = run.operation(crashing, plan);
  EXPECT_ANY_THROW((void)op("k1"));
  EXPECT_EQ(run.effects.load(), 1);
  EXPECT_FALSE(run.inner->lookup(idem::scoped_idempotency_key("crash-unit", "k1")).has_value())
      << "failures are not cached";
  auto fixed = run.operation(run.inner, CrashPlan{});
  EXPECT_EQ(fixed("k1").report.metadata.at("idempotency_status"), "executed");
  EXPECT_EQ(run.effects.load(), 2);
}

TEST(CrashingStore, ThrowAroundCompleteIsSwallowedByTheCoordinator) {
  for (const CrashPoint point : {CrashPoint::before_complete, CrashPoint::during_complete}) {
    SCOPED_TRACE(std::string(idem::testing::to_string(point)));
    StoreRun run;
    auto crashing =
        std::make_shared<CrashingStore>(run.inner, CrashPlan{point, CrashAction::throw_});
    auto op = run.operation(crashing, crashing->plan());
    const auto result = op("k");
    EXPECT_EQ(result.value, "value:k") << "the work is done; its value is returned";
    EXPECT_EQ(crashing->fired(), 1u);
    EXPECT_EQ(run.effects.load(), 1);
    // before_complete: nothing recorded, key released. during_complete: the record committed,
    // then the coordinator's release with the (now completed) token changes nothing.
    const auto record = run.inner->lookup(idem::scoped_idempotency_key("crash-unit", "k"));
    if (point == CrashPoint::before_complete) {
      EXPECT_FALSE(record.has_value());
    } else {
      ASSERT_TRUE(record.has_value());
      EXPECT_EQ(record->state, idem::IdempotencyRecord::State::completed);
    }
    auto fixed = run.operation(run.inner, CrashPlan{});
    const auto again = fixed("k");
    EXPECT_EQ(again.report.metadata.at("idempotency_status"),
              point == CrashPoint::before_complete ? "executed" : "replayed");
    EXPECT_EQ(run.effects.load(), point == CrashPoint::before_complete ? 2 : 1);
  }
}

TEST(CrashingStore, ThrowAfterClaimLeavesTheClaimUntilItsLeasePasses) {
  StoreRun run;
  auto crashing = std::make_shared<CrashingStore>(
      run.inner, CrashPlan{CrashPoint::after_claim, CrashAction::throw_});
  auto op = run.operation(crashing, crashing->plan());
  EXPECT_ANY_THROW((void)op("k"));
  EXPECT_EQ(run.effects.load(), 0);
  auto fixed = run.operation(run.inner, CrashPlan{});
  EXPECT_THROW((void)fixed("k"), idem::AlreadyInProgress) << "the orphan claim holds the key";
  run.clock->advance(11s);
  EXPECT_EQ(fixed("k").report.metadata.at("idempotency_status"), "executed");
  EXPECT_EQ(run.effects.load(), 1);
}

TEST(CrashingStore, ForwardsEveryOtherCallUnchanged) {
  StoreRun run;
  CrashingStore store(run.inner, CrashPlan{CrashPoint::after_side_effect, CrashAction::throw_});
  EXPECT_EQ(store.needs_bytes(), run.inner->needs_bytes());
  EXPECT_EQ(store.inner(), run.inner);
  const auto claim = store.claim("k", std::string_view("fp"), 10s);
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_EQ(store.claim("k", std::string_view("other"), 10s).status,
            idem::ClaimOutcome::Status::mismatch);
  EXPECT_TRUE(store.renew("k", claim.token, 20s));
  EXPECT_EQ(store.lookup("k")->lease_until, run.clock->wall_now() + 20s);
  EXPECT_EQ(store.counts().in_progress, 1u);
  EXPECT_EQ(store.entry_count(), 1u);
  EXPECT_TRUE(store.release("k", claim.token));
  EXPECT_EQ(store.entry_count(), 0u);

  const auto second = store.claim("k2", std::nullopt, 10s);
  idem::StoredValue value;
  value.bytes = "v";
  value.object = std::make_shared<const std::string>("v");
  value.type = typeid(std::string);
  EXPECT_TRUE(store.complete("k2", second.token, value, {}, 1min));
  EXPECT_EQ(store.counts().completed, 1u);
  // wait() on a key that is not in progress returns at once with what it saw.
  const auto seen = store.wait("k2", run.clock->steady_now() + 1s, {});
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->state, idem::IdempotencyRecord::State::completed);
  run.clock->advance(2min);
  EXPECT_EQ(store.counts().expired, 1u);
  std::vector<std::size_t> progress;
  EXPECT_EQ(store.purge_expired([&](std::size_t n) { progress.push_back(n); }), 1u);
  EXPECT_EQ(store.purge_expired(), 0u);
  EXPECT_EQ(store.fired(), 0u);
  EXPECT_THROW((void)store.claim("", std::nullopt, 1s), idem::InvalidKey);
}

}  // namespace
