// idem::resilient / idem::operation with an idempotency key: the coordinator wraps the whole
// resilience lifecycle. Owners are held with latches; joiners are counted with
// IdempotencyCoordinator::waiters(), never with sleeps.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../eventually.hpp"
#include "../thrown_by.hpp"
#include "idem/circuit_breaker.hpp"
#include "idem/events.hpp"
#include "idem/fingerprint.hpp"
#include "idem/idempotency.hpp"
#include "idem/memory_store.hpp"
#include "idem/operation.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;
using idem::IdempotencyCoordinator;
using idem::InMemoryIdempotencyStore;
using idem::InMemoryStoreOptions;
using idem::testing::ManualClock;

struct Receipt {
  std::string id;
  int amount = 0;
};

using idem::test::eventually;

// The key the coordinator sees for `key` of the operation named `name`.
std::string scoped(const std::string& name, const std::string& key) {
  return idem::scoped_idempotency_key(name, key);
}

// One exception object is shared by an owner, its joiners and the coordinator's bookkeeping.
// libstdc++ counts its references with atomics ThreadSanitizer cannot see (the library is not
// instrumented), so whichever thread drops the last reference seems to race with earlier reads
// in other threads. Tests therefore keep such exceptions alive in the main thread until every
// thread that touched them has been joined — or, for an attempt left running on a detached
// thread, until the process exits.
void keep_alive_until_exit(std::exception_ptr error) {
  static std::mutex mutex;
  static std::vector<std::exception_ptr> kept;
  std::lock_guard lock(mutex);
  kept.push_back(std::move(error));
}

class ResilientIdempotency : public ::testing::Test {
 protected:
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::shared_ptr<InMemoryIdempotencyStore> store =
      std::make_shared<InMemoryIdempotencyStore>(InMemoryStoreOptions{.clock = clock});
  std::shared_ptr<IdempotencyCoordinator> coordinator = IdempotencyCoordinator::for_store(store);
};

TEST_F(ResilientIdempotency, ExecutedThenReplayedWithTheOriginalReport) {
  std::atomic<int> calls{0};
  auto create_payment = idem::resilient(
      [&](const std::string& request_id, int amount) {
        ++calls;
        return Receipt{"rcpt-" + request_id, amount};
      },
      {.name = "create_payment",
       .retries = 2,
       .timeout = 10s,
       .idempotency_key = [](const std::string& id, int) { return "create-payment:" + id; },
       .idempotency_ttl = 1h,
       .idempotency_store = store,
       .clock = clock});
  const auto first = create_payment("request-123", 2499);
  const auto second = create_payment("request-123", 2499);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(first.value.id, "rcpt-request-123");
  EXPECT_EQ(second.value.id, first.value.id);
  EXPECT_EQ(second.value.amount, 2499);
  EXPECT_EQ(first.report.metadata.at("idempotency_status"), "executed");
  EXPECT_EQ(first.report.metadata.at("idempotency_cache_hit"), "false");
  EXPECT_EQ(first.report.metadata.at("idempotency_enabled"), "true");
  EXPECT_EQ(first.report.metadata.at("idempotency_key"), "create-payment:request-123");
  EXPECT_EQ(second.report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(second.report.metadata.at("idempotency_cache_hit"), "true");
  // The replay carries the report of the execution that produced the value.
  EXPECT_EQ(second.report.operation, first.report.operation);
  EXPECT_EQ(second.report.started_at, first.report.started_at);
  EXPECT_EQ(second.report.duration, first.report.duration);
  ASSERT_EQ(second.report.attempts.size(), first.report.attempts.size());
  EXPECT_EQ(second.report.attempts[0].status, first.report.attempts[0].status);
  // A different key executes.
  EXPECT_EQ(create_payment("request-456", 1).report.metadata.at("idempotency_status"), "executed");
  EXPECT_EQ(calls.load(), 2);
}

// Every replay gets a report of its own: the same fields each time, and changing one caller's
// copy changes neither the stored record nor what the next replay gets.
TEST_F(ResilientIdempotency, ReplaysOfOneKeyGetEqualButIndependentReports) {
  auto create_payment = idem::resilient(
      [](const std::string& request_id, int amount) {
        return Receipt{"rcpt-" + request_id, amount};
      },
      {.name = "create_payment",
       .idempotency_key = [](const std::string& id, int) { return "create-payment:" + id; },
       .idempotency_store = store,
       .clock = clock});
  const auto executed = create_payment("request-123", 2499);
  auto first = create_payment("request-123", 2499);
  const std::map<std::string, std::string> expected{
      {"circuit_breaker_open", "false"},
      {"fallback_used", "false"},
      {"idempotency_cache_hit", "true"},
      {"idempotency_enabled", "true"},
      {"idempotency_key", "create-payment:request-123"},
      {"idempotency_scope", "create_payment"},
      {"idempotency_status", "replayed"},
      {"idempotency_stored_key", scoped("create_payment", "create-payment:request-123")},
      {"rate_limit_encountered", "false"},
      {"rate_limit_wait_exceeded", "false"},
      {"rate_limit_wait_seconds", "0"},
      {"rate_limited", "false"},
      {"validation_performed", "false"}};
  EXPECT_EQ(first.report.metadata, expected);
  EXPECT_EQ(executed.report.metadata.at("idempotency_status"), "executed");

  first.report.metadata["idempotency_status"] = "changed by the caller";
  first.report.metadata["extra"] = "added by the caller";
  first.report.metadata.erase("idempotency_key");
  first.report.attempts.clear();
  first.report.operation = "renamed";

  const auto second = create_payment("request-123", 2499);
  EXPECT_EQ(second.report.metadata, expected);
  EXPECT_EQ(second.report.operation, "create_payment");
  ASSERT_EQ(second.report.attempts.size(), 1u);
  EXPECT_EQ(second.report.attempts[0].status, idem::AttemptStatus::succeeded);
  EXPECT_EQ(second.report.started_at, executed.report.started_at);
  EXPECT_EQ(second.value.id, "rcpt-request-123");
  const auto third = create_payment("request-123", 2499);
  EXPECT_EQ(third.report.metadata, second.report.metadata);
  EXPECT_NE(&third.report.metadata, &second.report.metadata);
}

TEST_F(ResilientIdempotency, ReplayLastsForTheTtlFromCompletion) {
  std::atomic<int> calls{0};
  auto op = idem::resilient([&](int x) { return x + ++calls; },
                            {.idempotency_key = [](int x) { return "ttl:" + std::to_string(x); },
                             .idempotency_ttl = 10min,
                             .idempotency_store = store});
  EXPECT_EQ(op(1).value, 2);
  clock->advance(10min - 1ns);
  EXPECT_EQ(op(1).value, 2);
  EXPECT_EQ(op(1).report.metadata.at("idempotency_status"), "replayed");
  clock->advance(1ns);
  const auto again = op(1);
  EXPECT_EQ(again.value, 3);
  EXPECT_EQ(again.report.metadata.at("idempotency_status"), "executed");
}

TEST_F(ResilientIdempotency, SixtyFourThreadsOneKeyOneExecution) {
  constexpr int kCallers = 64;
  std::atomic<int> calls{0};
  std::latch owner_entered(1);
  std::latch release(1);
  auto op = idem::resilient(
      [&](const std::string& id) {
        ++calls;
        owner_entered.count_down();
        release.wait();
        return "done:" + id;
      },
      {.name = "join",
       .idempotency_key = [](const std::string& id) { return "join:" + id; },
       .idempotency_store = store});
  std::vector<std::string> statuses(kCallers);
  std::vector<std::string> values(kCallers);
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    const auto result = op("x");
    values[0] = result.value;
    statuses[0] = result.report.metadata.at("idempotency_status");
  });
  owner_entered.wait();
  for (int i = 1; i < kCallers; ++i) {
    threads.emplace_back([&, i] {
      const auto result = op("x");
      values[i] = result.value;
      statuses[i] = result.report.metadata.at("idempotency_status");
    });
  }
  ASSERT_TRUE(
      eventually([&] { return coordinator->waiters(scoped("join", "join:x")) == kCallers - 1; }));
  release.count_down();
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(calls.load(), 1);
  int executed = 0, joined = 0;
  for (int i = 0; i < kCallers; ++i) {
    EXPECT_EQ(values[i], "done:x");
    executed += statuses[i] == "executed";
    joined += statuses[i] == "joined";
  }
  EXPECT_EQ(executed, 1);
  EXPECT_EQ(joined, kCallers - 1);
}

TEST_F(ResilientIdempotency, OwnersExceptionReachesEveryJoinerAndIsNotCached) {
  constexpr int kJoiners = 15;
  std::atomic<int> calls{0};
  std::latch owner_entered(1);
  std::latch release(1);
  auto op = idem::resilient(
      [&]() -> int {
        if (++calls == 1) {
          owner_entered.count_down();
          release.wait();
          throw std::runtime_error("gateway exploded");
        }
        return 7;
      },
      {.name = "boom",
       .idempotency_key = [] { return std::string("boom"); },
       .idempotency_store = store});
  std::mutex mutex;
  std::vector<const idem::OperationError*> errors;  // the exception objects each caller saw
  std::vector<std::exception_ptr> keep_alive;
  auto call = [&] {
    try {
      op();
      ADD_FAILURE() << "expected OperationError";
    } catch (const idem::OperationError& e) {
      EXPECT_THROW(std::rethrow_exception(e.cause()), std::runtime_error);
      std::lock_guard lock(mutex);
      errors.push_back(&e);
      keep_alive.push_back(std::current_exception());
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(call);
  owner_entered.wait();
  for (int i = 0; i < kJoiners; ++i)
    threads.emplace_back(call);
  ASSERT_TRUE(eventually([&] { return coordinator->waiters(scoped("boom", "boom")) == kJoiners; }));
  release.count_down();
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(calls.load(), 1);
  ASSERT_EQ(errors.size(), static_cast<std::size_t>(kJoiners + 1));
  for (const auto* error : errors)
    EXPECT_EQ(error, errors.front()) << "one shared exception";
  EXPECT_EQ(errors.front()->report().attempts.size(), 1u);
  // Failures are not cached: the next call executes again.
  const auto next = op();
  EXPECT_EQ(next.value, 7);
  EXPECT_EQ(next.report.metadata.at("idempotency_status"), "executed");
  EXPECT_EQ(calls.load(), 2);
}

TEST_F(ResilientIdempotency, AJoinerNeverRunsItsOwnRetries) {
  std::atomic<int> calls{0};
  std::latch owner_entered(1);
  std::latch release(1);
  auto op = idem::resilient(
      [&](idem::AttemptContext& context) -> int {
        ++calls;
        if (context.attempt == 1) {
          owner_entered.count_down();
          release.wait();
        }
        throw std::runtime_error("still down");
      },
      {.name = "retrying",
       .retries = 2,
       .backoff = {.base = 1ms, .jitter = 0.0},
       .idempotency_key = [] { return std::string("no-double-retries"); },
       .idempotency_store = store,
       .clock = clock});
  std::mutex mutex;
  std::vector<std::exception_ptr> errors;  // released here, after the joins (see below)
  auto call = [&] {
    try {
      op();
    } catch (const idem::OperationError& e) {
      EXPECT_EQ(e.report().attempts.size(), 3u);
      std::lock_guard lock(mutex);
      errors.push_back(std::current_exception());
    }
  };
  std::thread owner(call);
  owner_entered.wait();
  std::thread joiner(call);
  ASSERT_TRUE(eventually(
      [&] { return coordinator->waiters(scoped("retrying", "no-double-retries")) == 1; }));
  release.count_down();
  owner.join();
  joiner.join();
  EXPECT_EQ(calls.load(), 3) << "three attempts in all, made by the owner only";
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0], errors[1]) << "the joiner got the owner's exception";
  EXPECT_EQ(clock->sleeps().size(), 2u);
}

TEST_F(ResilientIdempotency, ReplayWorksWhileTheBreakerIsOpen) {
  auto breaker = std::make_shared<idem::CircuitBreaker>(
      idem::CircuitBreakerOptions{.failure_threshold = 1, .recovery_time = 1h, .clock = clock});
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&](int amount) {
        ++calls;
        return amount;
      },
      {.circuit_breaker = breaker,
       .idempotency_key = [](int amount) { return "breaker:" + std::to_string(amount); },
       .idempotency_store = store,
       .clock = clock});
  EXPECT_EQ(op(10).value, 10);
  breaker->acquire().failed();  // the dependency goes down; the breaker opens
  ASSERT_EQ(breaker->state(), idem::CircuitState::open);
  const auto replay = op(10);
  EXPECT_EQ(replay.value, 10);
  EXPECT_EQ(replay.report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(calls.load(), 1);
  // A new key does need the dependency, and the breaker refuses it.
  try {
    op(11);
    FAIL();
  } catch (const idem::OperationError& e) {
    EXPECT_EQ(e.report().attempts[0].status, idem::AttemptStatus::rejected);
  }
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(ResilientIdempotency, EdgeValuesAreReplayedExactly) {
  auto key = [](int i) { return "edge:" + std::to_string(i); };
  std::atomic<int> calls{0};
  auto empty_string = idem::resilient(
      [&](int) {
        ++calls;
        return std::string();
      },
      {.idempotency_key = key, .idempotency_store = store});
  auto zero = idem::resilient(
      [&](int) {
        ++calls;
        return 0;
      },
      {.idempotency_key = [](int i) { return "zero:" + std::to_string(i); },
       .idempotency_store = store});
  auto falsy = idem::resilient(
      [&](int) {
        ++calls;
        return false;
      },
      {.idempotency_key = [](int i) { return "false:" + std::to_string(i); },
       .idempotency_store = store});
  auto empty_vector = idem::resilient(
      [&](int) {
        ++calls;
        return std::vector<int>{};
      },
      {.idempotency_key = [](int i) { return "vector:" + std::to_string(i); },
       .idempotency_store = store});
  auto nothing = idem::resilient(
      [&](int) { ++calls; }, {.idempotency_key = [](int i) { return "void:" + std::to_string(i); },
                              .idempotency_store = store});
  for (int round = 0; round < 2; ++round) {
    const std::string expected = round == 0 ? "executed" : "replayed";
    const auto s = empty_string(1);
    EXPECT_EQ(s.value, "");
    EXPECT_EQ(s.report.metadata.at("idempotency_status"), expected);
    const auto z = zero(1);
    EXPECT_EQ(z.value, 0);
    EXPECT_EQ(z.report.metadata.at("idempotency_status"), expected);
    const auto f = falsy(1);
    EXPECT_FALSE(f.value);
    EXPECT_EQ(f.report.metadata.at("idempotency_status"), expected);
    const auto v = empty_vector(1);
    EXPECT_TRUE(v.value.empty());
    EXPECT_EQ(v.report.metadata.at("idempotency_status"), expected);
    const auto n = nothing(1);
    EXPECT_EQ(n.report.metadata.at("idempotency_status"), expected);
  }
  EXPECT_EQ(calls.load(), 5);
}

TEST_F(ResilientIdempotency, InvalidKeysSurfaceUnchangedAndNothingRuns) {
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&](const std::string&) {
        ++calls;
        return 1;
      },
      {.idempotency_key = [](const std::string& k) { return k; }, .idempotency_store = store});
  EXPECT_THROW(op(""), idem::InvalidKey);
  EXPECT_THROW(op("   "), idem::InvalidKey);
  EXPECT_THROW(op(std::string(300, 'k')), idem::InvalidKey);
  EXPECT_THROW(op(std::string("nul\0byte", 8)), idem::InvalidKey);
  EXPECT_EQ(calls.load(), 0);
}

TEST_F(ResilientIdempotency, FingerprintDetectsAKeyReusedWithOtherArguments) {
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&](const std::string&, int amount) {
        ++calls;
        return amount;
      },
      {.events = {sink},
       .idempotency_key = [](const std::string& id, int) { return "fp:" + id; },
       .idempotency_store = store,
       .idempotency_fingerprint = true});
  EXPECT_EQ(op("r1", 100).value, 100);
  EXPECT_EQ(op("r1", 100).report.metadata.at("idempotency_status"), "replayed");
  try {
    // Nine digits: a drawn token or a timestamp in the message cannot contain them by chance.
    op("r1", 987654321);
    FAIL() << "expected KeyReuseError";
  } catch (const idem::KeyReuseError& e) {
    EXPECT_EQ(e.key(), "fp:r1");
    EXPECT_EQ(std::string(e.what()).find("987654321"), std::string::npos) << "no argument values";
  }
  EXPECT_EQ(calls.load(), 1);
  const auto events = sink->events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().type, idem::EventType::idempotency_rejected);
  EXPECT_EQ(events.back().fields.at("reason"), "key_reuse");
  EXPECT_EQ(events.back().fields.at("key"), "fp:r1");
}

TEST_F(ResilientIdempotency, CustomFingerprintFunction) {
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&](const std::string&, int amount) {
        ++calls;
        return amount;
      },
      {.idempotency_key = [](const std::string& id, int) { return "cfp:" + id; },
       .idempotency_store = store,
       // Only the amount's sign matters for this caller.
       .idempotency_fingerprint = [](const std::string&,
                                     int amount) { return std::string(amount >= 0 ? "+" : "-"); }});
  EXPECT_EQ(op("a", 5).value, 5);
  EXPECT_EQ(op("a", 6).value, 5);  // same fingerprint: replayed
  EXPECT_THROW(op("a", -1), idem::KeyReuseError);
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(ResilientIdempotency, EventsForEveryStatus) {
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  auto op = idem::resilient([](int x) { return x; },
                            {.name = "ev",
                             .events = {sink},
                             .idempotency_key = [](int x) { return "ev:" + std::to_string(x); },
                             .idempotency_store = store});
  op(1);
  using ET = idem::EventType;
  EXPECT_EQ(sink->types(),
            (std::vector<ET>{ET::idempotency_executed, ET::operation_started, ET::attempt_started,
                             ET::attempt_succeeded, ET::operation_succeeded}));
  sink->clear();
  op(1);
  EXPECT_EQ(sink->types(), (std::vector<ET>{ET::idempotency_replayed}));
  const auto replayed = sink->events().front();
  EXPECT_EQ(replayed.operation, "ev");
  EXPECT_EQ(replayed.fields.at("key"), "ev:1");
  EXPECT_EQ(replayed.fields.at("status"), "replayed");
}

TEST_F(ResilientIdempotency, JoinedEventAndWaiterGivingUp) {
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  std::latch owner_entered(1);
  std::latch release(1);
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&] {
        ++calls;
        owner_entered.count_down();
        release.wait();
        return 1;
      },
      {.name = "waiter",
       .events = {sink},
       .idempotency_key = [] { return std::string("waiter"); },
       .idempotency_store = store,
       .clock = clock});
  std::thread owner([&] { op(); });
  owner_entered.wait();
  // A waiter whose deadline has passed gives up at once; the owner is unaffected.
  const idem::CallOptions give_up_now{.wait_deadline = clock->steady_now()};
  EXPECT_THROW(op.call_with(give_up_now), idem::TimeoutError);
  // A waiter whose stop token fires gives up too.
  std::stop_source stop;
  std::thread cancelled(
      [&] { EXPECT_THROW(op.call_with({.stop = stop.get_token()}), idem::Cancelled); });
  ASSERT_TRUE(eventually([&] { return coordinator->waiters(scoped("waiter", "waiter")) == 1; }));
  stop.request_stop();
  cancelled.join();
  // A later caller still joins the running owner.
  std::atomic<bool> joined{false};
  std::thread joiner([&] { joined = op().report.metadata.at("idempotency_status") == "joined"; });
  ASSERT_TRUE(eventually([&] { return coordinator->waiters(scoped("waiter", "waiter")) == 1; }));
  release.count_down();
  owner.join();
  joiner.join();
  EXPECT_TRUE(joined.load());
  EXPECT_EQ(calls.load(), 1);
  int joined_events = 0;
  for (const auto& event : sink->events()) {
    joined_events += event.type == idem::EventType::idempotency_joined;
  }
  EXPECT_EQ(joined_events, 1);
}

TEST_F(ResilientIdempotency, AnAbandonedAttemptKeepsTheKeyClaimedUntilItEnds) {
  std::atomic<int> running{0};
  std::atomic<int> max_running{0};
  std::atomic<int> calls{0};
  auto release = std::make_shared<std::latch>(1);
  auto first_finished = std::make_shared<std::atomic<bool>>(false);
  auto body = [&, release, first_finished](int) {
    const int now_running = ++running;
    int seen = max_running.load();
    while (now_running > seen && !max_running.compare_exchange_weak(seen, now_running)) {
    }
    const bool first = ++calls == 1;
    if (first) release->wait();  // ignores its stop token
    --running;
    if (first) {
      first_finished->store(true);
      first_finished->notify_all();
    }
    return 5;
  };
  auto key = [](int) { return std::string("abandoned"); };
  auto hasty = idem::resilient(body, {.name = "charge",
                                      .timeout = 20ms,
                                      .idempotency_key = key,
                                      .idempotency_store = store,
                                      .clock = clock});
  // Same operation name (so the same key scope) and store, no timeout: its own attempt cannot
  // be cut short on a slow machine.
  auto patient = idem::resilient(
      body, {.name = "charge", .idempotency_key = key, .idempotency_store = store, .clock = clock});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { hasty(1); });
  ASSERT_TRUE(error) << "expected a timeout";
  keep_alive_until_exit(std::current_exception());  // the abandoned attempt outlives the test
  EXPECT_THROW(std::rethrow_exception(error->cause()), idem::TimeoutError);
  // The owner failed, but its attempt still runs: the key stays claimed.
  const auto record = store->lookup(idem::scoped_idempotency_key("charge", "abandoned"));
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::in_progress);
  const idem::CallOptions give_up_now{.wait_deadline = clock->steady_now()};
  EXPECT_THROW(patient.call_with(give_up_now, 1), idem::TimeoutError);
  EXPECT_EQ(calls.load(), 1) << "no second copy beside the abandoned attempt";
  // A caller that waits executes once the abandoned attempt has ended — never beside it.
  std::thread next([&] {
    const auto result = patient(1);
    EXPECT_EQ(result.value, 5);
    EXPECT_EQ(result.report.metadata.at("idempotency_status"), "executed");
  });
  ASSERT_TRUE(eventually([&] { return coordinator->waiters(scoped("charge", "abandoned")) == 1; }));
  release->count_down();
  next.join();
  while (!first_finished->load())
    first_finished->wait(false);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(max_running.load(), 1);
}

TEST_F(ResilientIdempotency, ReentryIsAnErrorNotADeadlock) {
  std::function<int(int)> self;
  auto op = idem::resilient([&](int depth) { return depth == 0 ? self(1) : 1; },
                            {.retries = 3,
                             .idempotency_key = [](int) { return std::string("reentry"); },
                             .idempotency_store = store,
                             .clock = clock});
  self = [&](int depth) { return op(depth).value; };
  try {
    op(0);
    FAIL();
  } catch (const idem::OperationError& e) {
    EXPECT_EQ(e.report().attempts.size(), 1u) << "a re-entry is never retried";
    EXPECT_THROW(std::rethrow_exception(e.cause()), idem::ReentryError);
  }
}

TEST_F(ResilientIdempotency, ReentryIsCaughtInsideATimedAttemptToo) {
  std::function<int(int)> self;
  auto op = idem::resilient([&](int depth) { return depth == 0 ? self(1) : 1; },
                            {.timeout = 10s,
                             .idempotency_key = [](int) { return std::string("reentry-timed"); },
                             .idempotency_store = store});
  self = [&](int depth) { return op(depth).value; };
  try {
    op(0);
    FAIL();
  } catch (const idem::OperationError& e) {
    keep_alive_until_exit(std::current_exception());  // the detached attempt may still hold it
    EXPECT_THROW(std::rethrow_exception(e.cause()), idem::ReentryError);
  }
}

// A store that keeps results as bytes, as a durable store does (delegates to the memory store).
class BytesStore final : public idem::IdempotencyStore {
 public:
  explicit BytesStore(std::shared_ptr<idem::IdempotencyStore> inner) : inner_(std::move(inner)) {}
  bool do_needs_bytes() const noexcept override { return true; }
  idem::ClaimOutcome do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                              idem::Millis lease) override {
    return inner_->claim(key, fingerprint, lease);
  }
  bool do_complete(std::string_view key, std::uint64_t token, idem::StoredValue value,
                   const idem::ExecutionReport& report, idem::Millis ttl) override {
    EXPECT_TRUE(value.bytes.has_value());
    value.object.reset();  // only the bytes survive, as in a database
    value.type.reset();
    ++completes;
    return inner_->complete(key, token, std::move(value),
                            idem::ExecutionReport::from_json(report.to_json()), ttl);
  }
  bool do_release(std::string_view key, std::uint64_t token) override {
    return inner_->release(key, token);
  }
  bool do_renew(std::string_view key, std::uint64_t token, idem::Millis lease) override {
    return inner_->renew(key, token, lease);
  }
  std::optional<idem::IdempotencyRecord> do_lookup(std::string_view key) override {
    return inner_->lookup(key);
  }
  std::size_t do_purge_expired(const idem::PurgeProgress& progress) override {
    return inner_->purge_expired(progress);
  }
  std::size_t do_entry_count() override { return inner_->entry_count(); }

  std::atomic<int> completes{0};

 private:
  std::shared_ptr<idem::IdempotencyStore> inner_;
};

struct NoCodec {
  int value = 0;
};

TEST_F(ResilientIdempotency, ByteStoresUseTheCodecOfTheResultType) {
  auto bytes = std::make_shared<BytesStore>(store);
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&](int x) {
        ++calls;
        return std::vector<std::string>{"a", std::to_string(x), ""};
      },
      {.name = "bytes",
       .idempotency_key = [](int x) { return "bytes:" + std::to_string(x); },
       .idempotency_store = bytes});
  const auto first = op(3);
  const auto second = op(3);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(bytes->completes.load(), 1);
  EXPECT_EQ(second.value, first.value);
  EXPECT_EQ(second.report.metadata.at("idempotency_status"), "replayed");
  auto nothing = idem::resilient([&] { ++calls; },
                                 {.name = "bytes_void",
                                  .idempotency_key = [] { return std::string("bytes:void"); },
                                  .idempotency_store = bytes});
  nothing();
  EXPECT_EQ(nothing().report.metadata.at("idempotency_status"), "replayed");
  // A result type without a codec cannot be kept as bytes: refused at construction.
  EXPECT_THROW(
      idem::resilient([] { return NoCodec{}; }, {.name = "no_codec",
                                                 .idempotency_key = [] { return std::string("k"); },
                                                 .idempotency_store = bytes}),
      idem::ConfigError);
  // A byte store outlives the process: an unnamed operation has no stable scope for it.
  EXPECT_THROW(idem::resilient([](int x) { return x; },
                               {.idempotency_key = [](int) { return std::string("k"); },
                                .idempotency_store = bytes}),
               idem::ConfigError);
  // The in-memory store needs no codec.
  EXPECT_NO_THROW(idem::resilient(
      [] { return NoCodec{}; },
      {.idempotency_key = [] { return std::string("k"); }, .idempotency_store = store}));
}

TEST_F(ResilientIdempotency, DefaultStoreWhenNoneIsGiven) {
  std::atomic<int> calls{0};
  const std::string unique =
      "default-store:" + std::to_string(reinterpret_cast<std::uintptr_t>(&calls));
  auto op = idem::resilient(
      [&] {
        ++calls;
        return 1;
      },
      {.idempotency_key = [unique] { return unique; }});
  op();
  EXPECT_EQ(op().report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(ResilientIdempotency, OperationBuilderWithIdempotency) {
  std::atomic<int> calls{0};
  const auto op = idem::operation("builder",
                                  [&](const std::string& id) {
                                    ++calls;
                                    return id.size();
                                  })
                      .with_retry({.max_attempts = 2})
                      .with_idempotency({.key = [](const std::string& id) { return "b:" + id; },
                                         .ttl = 5min,
                                         .store = store,
                                         .fingerprint = true});
  EXPECT_EQ(op.run("abc").value, 3u);
  EXPECT_EQ(op.run("abc").report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(op.callable()("abc").report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(calls.load(), 1);
  const auto plain = op.without_idempotency();
  plain.run("abc");
  EXPECT_EQ(calls.load(), 2);
}

TEST_F(ResilientIdempotency, AlreadyInProgressInAnotherProcessWithRejectPolicy) {
  // A second coordinator over the same store behaves like another process.
  auto other_process = idem::make_idempotency_coordinator(store);
  std::latch owner_entered(1);
  std::latch release(1);
  std::thread owner([&] {
    idem::IdempotencyPolicy policy;
    policy.store = store;
    idem::IdempotentCall call;
    call.key = "cross-process";
    other_process->run(policy, call, [&](idem::ClaimHold&) {
      owner_entered.count_down();
      release.wait();
      return idem::Execution{std::make_shared<const int>(1), {}};
    });
  });
  owner_entered.wait();
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&] {
        ++calls;
        return 2;
      },
      {.events = {sink},
       .idempotency_key = [] { return std::string("cross-process"); },
       .idempotency_scope = "",  // the unscoped key the other process's coordinator claimed
       .idempotency_store = store,
       .idempotency_in_progress = idem::InProgressPolicy::reject});
  EXPECT_THROW(op(), idem::AlreadyInProgress);
  EXPECT_EQ(calls.load(), 0);
  ASSERT_FALSE(sink->events().empty());
  EXPECT_EQ(sink->events().back().fields.at("reason"), "already_in_progress");
  release.count_down();
  owner.join();
  EXPECT_EQ(op().value, 1) << "then the other process's result is replayed";
}

// ---- fingerprints by default ----------------------------------------------------------------

// What a payment gateway saw: one charge per execution.
struct Charges {
  std::atomic<int> calls{0};
};

auto payment_operation(std::shared_ptr<Charges> charges,
                       std::shared_ptr<InMemoryIdempotencyStore> store,
                       std::shared_ptr<ManualClock> clock) {
  return idem::resilient(
      [charges](const std::string& request_id, int amount) {
        ++charges->calls;
        return Receipt{"rcpt-" + request_id, amount};
      },
      {.name = "create_payment",
       .idempotency_key = [](const std::string& id, int) { return id; },
       .idempotency_store = std::move(store),
       .clock = std::move(clock)});
}

TEST_F(ResilientIdempotency, AKeyReusedWithOtherArgumentsIsRefusedByDefault) {
  auto charges = std::make_shared<Charges>();
  auto create_payment = payment_operation(charges, store, clock);
  EXPECT_EQ(create_payment("request-123", 2499).value.amount, 2499);
  try {
    create_payment("request-123", 1);
    FAIL() << "expected KeyReuseError";
  } catch (const idem::KeyReuseError& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.key(), "request-123") << "the caller's key, not the scoped one";
    EXPECT_EQ(e.operation(), "create_payment");
    EXPECT_NE(message.find("operation 'create_payment': idempotency key 'request-123' was first "
                           "used with different arguments"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("claim token "), std::string::npos) << message;
    EXPECT_NE(message.find("started 2030-01-01T00:00:00.000Z"), std::string::npos) << message;
    EXPECT_EQ(message.find("14:create_payment"), std::string::npos) << message;
    EXPECT_EQ(message.find("2499"), std::string::npos) << "no argument values: " << message;
  }
  EXPECT_EQ(create_payment("request-123", 2499).report.metadata.at("idempotency_status"),
            "replayed");
  EXPECT_EQ(charges->calls.load(), 1);
}

TEST_F(ResilientIdempotency, FingerprintFalseReplaysWhateverTheArguments) {
  std::atomic<int> calls{0};
  // A timestamp argument is noise: the caller opts out.
  auto op = idem::resilient(
      [&](const std::string& id, long long /*sent_at_ms*/) {
        ++calls;
        return id;
      },
      {.idempotency_key = [](const std::string& id, long long) { return id; },
       .idempotency_store = store,
       .idempotency_fingerprint = false});
  EXPECT_EQ(op("r", 1000).value, "r");
  EXPECT_EQ(op("r", 2000).report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(calls.load(), 1);
}

// No idem::Codec, no to_json: idem::fingerprint cannot encode it.
struct Opaque {
  int value = 0;
};

TEST_F(ResilientIdempotency, ArgumentsWithoutAnEncodingKeepNoFingerprint) {
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&](const std::string&, const Opaque& opaque) {
        ++calls;
        return opaque.value;
      },
      {.idempotency_key = [](const std::string& id, const Opaque&) { return id; },
       .idempotency_store = store});
  EXPECT_EQ(op("r", Opaque{1}).value, 1);
  EXPECT_EQ(op("r", Opaque{2}).value, 1) << "no fingerprint: the first result replays";
  EXPECT_EQ(calls.load(), 1);
  // `true` insists, and says why it cannot.
  EXPECT_THROW(
      idem::resilient([](const std::string&, const Opaque& o) { return o.value; },
                      {.idempotency_key = [](const std::string& id, const Opaque&) { return id; },
                       .idempotency_fingerprint = true}),
      idem::ConfigError);
}

TEST_F(ResilientIdempotency, AJoinerWithOtherArgumentsIsRefusedNamingTheRunningClaim) {
  std::latch owner_started(1);
  std::latch release_owner(1);
  auto op = idem::resilient(
      [&](const std::string& id, int amount) {
        owner_started.count_down();
        release_owner.wait();
        return Receipt{id, amount};
      },
      {.name = "create_payment",
       .idempotency_key = [](const std::string& id, int) { return id; },
       .idempotency_store = store,
       .clock = clock});
  std::thread owner([&] { EXPECT_EQ(op("request-9", 10).value.amount, 10); });
  owner_started.wait();
  try {
    op("request-9", 11);
    ADD_FAILURE() << "expected KeyReuseError";
  } catch (const idem::KeyReuseError& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.key(), "request-9");
    EXPECT_NE(message.find("operation 'create_payment': idempotency key 'request-9' is being "
                           "executed with different arguments"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("claim token "), std::string::npos) << message;
    EXPECT_NE(message.find("started 2030-01-01T00:00:00.000Z"), std::string::npos) << message;
  }
  release_owner.count_down();
  owner.join();
}

TEST_F(ResilientIdempotency, AClaimHeldElsewhereWithOtherArgumentsIsRefused) {
  // Another process claimed the key for other arguments; this call's claim fails and the store
  // answers with that claim: the mismatch is found there too (not only on replays).
  const idem::ClaimOutcome other = store->claim(scoped("create_payment", "request-5"),
                                                idem::fingerprint("request-5", 500), 1min);
  ASSERT_EQ(other.status, idem::ClaimOutcome::Status::acquired);
  auto charges = std::make_shared<Charges>();
  auto create_payment = payment_operation(charges, store, clock);
  try {
    create_payment("request-5", 1);
    FAIL() << "expected KeyReuseError";
  } catch (const idem::KeyReuseError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("operation 'create_payment': idempotency key 'request-5' is in progress "
                           "with different arguments"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("claim token " + std::to_string(other.token)), std::string::npos)
        << message;
    EXPECT_NE(message.find("its lease runs until 2030-01-01T00:01:00.000Z"), std::string::npos)
        << message;
  }
  EXPECT_EQ(charges->calls.load(), 0);
}

TEST_F(ResilientIdempotency, InProgressElsewhereNamesTheOperationKeyAndClaim) {
  const idem::ClaimOutcome other =
      store->claim(scoped("create_payment", "request-7"), std::nullopt, 1min);
  auto op = idem::resilient([](const std::string& id) { return id; },
                            {.name = "create_payment",
                             .idempotency_key = [](const std::string& id) { return id; },
                             .idempotency_store = store,
                             .idempotency_in_progress = idem::InProgressPolicy::reject,
                             .clock = clock});
  try {
    op("request-7");
    FAIL() << "expected AlreadyInProgress";
  } catch (const idem::AlreadyInProgress& e) {
    EXPECT_EQ(std::string(e.what()),
              "idem: already_in_progress: operation 'create_payment': idempotency key "
              "'request-7' is in progress in another process (claim token " +
                  std::to_string(other.token) + ", its lease runs until 2030-01-01T00:01:00.000Z)");
  }
}

}  // namespace
