#include "idem/circuit_breaker.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "../run_together.hpp"
#include "../thrown_by.hpp"
#include "idem/events.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;
using idem::CircuitBreaker;
using idem::CircuitBreakerOptions;
using idem::CircuitOpenError;
using idem::CircuitState;
using idem::testing::ManualClock;

std::shared_ptr<CircuitBreaker> make_breaker(const std::shared_ptr<ManualClock>& clock,
                                             int threshold = 3,
                                             std::chrono::nanoseconds recovery = 10s) {
  return std::make_shared<CircuitBreaker>(CircuitBreakerOptions{.name = "gateway",
                                                                .failure_threshold = threshold,
                                                                .recovery_time = recovery,
                                                                .clock = clock});
}

void fail_once(CircuitBreaker& breaker) {
  breaker.acquire().failed();
}

TEST(CircuitBreaker, StartsClosedAndLetsCallsThrough) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock);
  EXPECT_EQ(breaker->state(), CircuitState::closed);
  auto permit = breaker->acquire();
  EXPECT_FALSE(permit.is_probe());
  EXPECT_FALSE(permit.succeeded().has_value());
  EXPECT_EQ(breaker->snapshot().consecutive_failures, 0);
}

TEST(CircuitBreaker, OpensAfterThresholdConsecutiveFailures) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock, 3);
  fail_once(*breaker);
  fail_once(*breaker);
  EXPECT_EQ(breaker->state(), CircuitState::closed);
  EXPECT_EQ(breaker->snapshot().consecutive_failures, 2);
  auto permit = breaker->acquire();
  const auto transition = permit.failed();
  ASSERT_TRUE(transition.has_value());
  EXPECT_EQ(transition->from, CircuitState::closed);
  EXPECT_EQ(transition->to, CircuitState::open);
  const auto snapshot = breaker->snapshot();
  EXPECT_EQ(snapshot.state, CircuitState::open);
  EXPECT_EQ(snapshot.opened_at, clock->steady_now());
  EXPECT_EQ(snapshot.retry_after, 10s);
}

TEST(CircuitBreaker, SuccessResetsTheFailureCount) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock, 3);
  fail_once(*breaker);
  fail_once(*breaker);
  breaker->acquire().succeeded();
  fail_once(*breaker);
  fail_once(*breaker);
  EXPECT_EQ(breaker->state(), CircuitState::closed);
  EXPECT_EQ(breaker->snapshot().consecutive_failures, 2);
}

TEST(CircuitBreaker, OpenRejectsWithTimeUntilTheNextProbe) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock, 1, 10s);
  fail_once(*breaker);
  clock->advance(4s);
  try {
    (void)breaker->acquire();
    FAIL() << "expected CircuitOpenError";
  } catch (const CircuitOpenError& e) {
    EXPECT_EQ(e.breaker(), "gateway");
    EXPECT_EQ(e.state(), CircuitState::open);
    EXPECT_EQ(e.retry_after(), 6s);
    EXPECT_EQ(e.code(), idem::ErrorCode::circuit_open);
    EXPECT_TRUE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("gateway"), std::string::npos);
  }
}

TEST(CircuitBreaker, HalfOpenAfterRecoveryTimeAndProbeSuccessCloses) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock, 1, 10s);
  fail_once(*breaker);
  clock->advance(10s);  // exactly at the boundary: the probe may go
  auto probe = breaker->acquire();
  EXPECT_TRUE(probe.is_probe());
  ASSERT_TRUE(probe.admission_transition().has_value());
  EXPECT_EQ(probe.admission_transition()->to, CircuitState::half_open);
  EXPECT_EQ(breaker->state(), CircuitState::half_open);
  // Everyone else is turned away while the probe runs.
  try {
    (void)breaker->acquire();
    FAIL() << "expected CircuitOpenError";
  } catch (const CircuitOpenError& e) {
    EXPECT_EQ(e.state(), CircuitState::half_open);
    EXPECT_EQ(e.retry_after(), 0s);
  }
  const auto transition = probe.succeeded();
  ASSERT_TRUE(transition.has_value());
  EXPECT_EQ(transition->to, CircuitState::closed);
  const auto snapshot = breaker->snapshot();
  EXPECT_EQ(snapshot.state, CircuitState::closed);
  EXPECT_EQ(snapshot.consecutive_failures, 0);
  EXPECT_FALSE(snapshot.opened_at.has_value());
}

TEST(CircuitBreaker, ProbeFailureReopensForAnotherRecoveryTime) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock, 1, 10s);
  fail_once(*breaker);
  clock->advance(11s);
  auto probe = breaker->acquire();
  clock->advance(1s);
  const auto transition = probe.failed();
  ASSERT_TRUE(transition.has_value());
  EXPECT_EQ(transition->from, CircuitState::half_open);
  EXPECT_EQ(transition->to, CircuitState::open);
  EXPECT_EQ(breaker->snapshot().opened_at, clock->steady_now());
  clock->advance(9s);
  EXPECT_THROW((void)breaker->acquire(), CircuitOpenError);
  clock->advance(1s);
  EXPECT_TRUE(breaker->acquire().is_probe());
}

TEST(CircuitBreaker, JustBeforeRecoveryTimeStillRejects) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock, 1, 10s);
  fail_once(*breaker);
  clock->advance(10s - 1ns);
  try {
    (void)breaker->acquire();
    FAIL();
  } catch (const CircuitOpenError& e) {
    EXPECT_EQ(e.retry_after(), 1ns);
  }
}

TEST(CircuitBreaker, DroppedProbeFreesTheSlotForTheNextCaller) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock, 1, 1s);
  fail_once(*breaker);
  clock->advance(1s);
  { auto probe = breaker->acquire(); }  // no outcome reported
  EXPECT_EQ(breaker->state(), CircuitState::half_open);
  auto next = breaker->acquire();
  EXPECT_TRUE(next.is_probe());
  next.succeeded();
  EXPECT_EQ(breaker->state(), CircuitState::closed);
}

TEST(CircuitBreaker, OutcomesOfCallsAdmittedBeforeATransitionAreIgnored) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock, 1, 1s);
  auto slow = breaker->acquire();  // admitted while closed
  fail_once(*breaker);             // opens
  EXPECT_FALSE(slow.succeeded().has_value());
  EXPECT_EQ(breaker->state(), CircuitState::open);  // a stale success does not close it
}

TEST(CircuitBreaker, ResetClosesAndForgetsFailures) {
  auto clock = std::make_shared<ManualClock>();
  std::vector<idem::CircuitTransition> seen;
  auto breaker = std::make_shared<CircuitBreaker>(CircuitBreakerOptions{
      .name = "b",
      .failure_threshold = 1,
      .recovery_time = 1s,
      .clock = clock,
      .on_state_change = [&](const idem::CircuitTransition& t) { seen.push_back(t); }});
  fail_once(*breaker);
  breaker->reset();
  EXPECT_EQ(breaker->state(), CircuitState::closed);
  EXPECT_EQ(breaker->snapshot().consecutive_failures, 0);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].to, CircuitState::open);
  EXPECT_EQ(seen[1].from, CircuitState::open);
  EXPECT_EQ(seen[1].to, CircuitState::closed);
}

TEST(CircuitBreaker, StateChangeCallbackSeesEveryTransitionAndMayThrow) {
  auto clock = std::make_shared<ManualClock>();
  std::vector<std::pair<CircuitState, CircuitState>> seen;
  auto breaker = std::make_shared<CircuitBreaker>(CircuitBreakerOptions{
      .name = "b",
      .failure_threshold = 2,
      .recovery_time = 5s,
      .clock = clock,
      .on_state_change = [&](const idem::CircuitTransition& t) {
        seen.emplace_back(t.from, t.to);
        throw std::runtime_error("observer bug");  // must not leak into the caller
      }});
  fail_once(*breaker);
  fail_once(*breaker);
  clock->advance(5s);
  auto probe = breaker->acquire();
  probe.failed();
  clock->advance(5s);
  breaker->acquire().succeeded();
  const std::vector<std::pair<CircuitState, CircuitState>> expected = {
      {CircuitState::closed, CircuitState::open},
      {CircuitState::open, CircuitState::half_open},
      {CircuitState::half_open, CircuitState::open},
      {CircuitState::open, CircuitState::half_open},
      {CircuitState::half_open, CircuitState::closed}};
  EXPECT_EQ(seen, expected);
}

TEST(CircuitBreaker, HalfOpenLetsExactlyOneOfEightConcurrentCallersProbe) {
  for (int round = 0; round < 20; ++round) {
    auto clock = std::make_shared<ManualClock>();
    auto breaker = make_breaker(clock, 1, 1s);
    fail_once(*breaker);
    clock->advance(1s);
    constexpr int kCallers = 8;
    std::atomic<int> probes{0};
    std::atomic<int> rejected{0};
    std::mutex permits_mutex;
    std::vector<CircuitBreaker::Permit> permits;  // hold every admission until all have tried
    idem::test::run_together(kCallers, [&](int) {
      try {
        auto permit = breaker->acquire();
        if (permit.is_probe()) ++probes;
        std::lock_guard lock(permits_mutex);
        permits.push_back(std::move(permit));
      } catch (const CircuitOpenError& e) {
        EXPECT_EQ(e.state(), CircuitState::half_open);
        ++rejected;
      }
    });
    EXPECT_EQ(probes.load(), 1);
    EXPECT_EQ(rejected.load(), kCallers - 1);
    ASSERT_EQ(permits.size(), 1u);
    permits.front().succeeded();
    EXPECT_EQ(breaker->state(), CircuitState::closed);
  }
}

TEST(CircuitBreaker, ConcurrentFailuresOpenItOnce) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> opened{0};
  auto breaker = std::make_shared<CircuitBreaker>(
      CircuitBreakerOptions{.name = "b",
                            .failure_threshold = 50,
                            .recovery_time = 1h,
                            .clock = clock,
                            .on_state_change = [&](const idem::CircuitTransition& t) {
                              if (t.to == CircuitState::open) ++opened;
                            }});
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 200; ++j) {
        try {
          breaker->acquire().failed();
        } catch (const CircuitOpenError&) {
        }
      }
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(opened.load(), 1);
  EXPECT_EQ(breaker->state(), CircuitState::open);
}

TEST(CircuitBreaker, RejectsBadOptions) {
  EXPECT_THROW(CircuitBreaker(CircuitBreakerOptions{.name = ""}), idem::ConfigError);
  EXPECT_THROW(CircuitBreaker(CircuitBreakerOptions{.failure_threshold = 0}), idem::ConfigError);
  EXPECT_THROW(CircuitBreaker(CircuitBreakerOptions{.recovery_time = 0s}), idem::ConfigError);
  EXPECT_THROW(CircuitBreaker(CircuitBreakerOptions{.recovery_time = -1s}), idem::ConfigError);
  CircuitBreaker defaults;
  EXPECT_EQ(defaults.name(), "circuit_breaker");
}

TEST(CircuitBreaker, ToString) {
  EXPECT_EQ(idem::to_string(CircuitState::closed), "closed");
  EXPECT_EQ(idem::to_string(CircuitState::open), "open");
  EXPECT_EQ(idem::to_string(CircuitState::half_open), "half_open");
}

// --- through a resilient operation ---

TEST(CircuitBreakerInOperation, EachFailedAttemptCountsAndARejectionEndsTheRetries) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock, 2, 30s);
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&](int) -> int {
        ++calls;
        throw std::runtime_error("gateway down");
      },
      {.retries = 5,
       .backoff = {.base = 1ms, .jitter = 0},
       .circuit_breaker = breaker,
       .clock = clock});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { op(1); });
  ASSERT_TRUE(error) << "expected OperationError";
  // Two failures open the breaker; the third attempt is rejected and ends the retries.
  EXPECT_EQ(calls.load(), 2);
  const auto& attempts = error->report().attempts;
  ASSERT_EQ(attempts.size(), 3u);
  EXPECT_EQ(attempts[0].status, idem::AttemptStatus::failed);
  EXPECT_EQ(attempts[1].status, idem::AttemptStatus::failed);
  EXPECT_EQ(attempts[2].status, idem::AttemptStatus::rejected);
  EXPECT_EQ(attempts[2].error_type, "idem::CircuitOpenError");
  EXPECT_FALSE(attempts[2].retryable);
  EXPECT_THROW(std::rethrow_exception(error->cause()), CircuitOpenError);
  EXPECT_EQ(breaker->state(), CircuitState::open);
  // Later calls are rejected without running the function.
  EXPECT_THROW(op(2), idem::OperationError);
  EXPECT_EQ(calls.load(), 2);
}

TEST(CircuitBreakerInOperation, SharedBetweenOperations) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock, 1, 30s);
  auto failing = idem::resilient([]() -> int { throw std::runtime_error("down"); },
                                 {.circuit_breaker = breaker, .clock = clock});
  std::atomic<int> other_calls{0};
  auto other = idem::resilient(
      [&] {
        ++other_calls;
        return 1;
      },
      {.circuit_breaker = breaker, .clock = clock});
  EXPECT_THROW(failing(), idem::OperationError);
  EXPECT_THROW(other(), idem::OperationError);
  EXPECT_EQ(other_calls.load(), 0);
  clock->advance(30s);
  EXPECT_EQ(other().value, 1);  // the probe succeeds and closes the shared breaker
  EXPECT_EQ(breaker->state(), CircuitState::closed);
}

TEST(CircuitBreakerInOperation, BadInputDoesNotTripTheBreaker) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock, 1, 30s);
  auto op = idem::resilient([](int) -> int { throw idem::InvalidArgument("amount must be > 0"); },
                            {.circuit_breaker = breaker, .clock = clock});
  EXPECT_THROW(op(-1), idem::OperationError);
  EXPECT_THROW(op(-1), idem::OperationError);
  EXPECT_EQ(breaker->state(), CircuitState::closed);
}

TEST(CircuitBreakerInOperation, EmitsRejectionAndStateChangeEvents) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = make_breaker(clock, 1, 30s);
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  auto op = idem::resilient(
      []() -> int { throw std::runtime_error("down"); },
      {.name = "charge", .circuit_breaker = breaker, .events = {sink}, .clock = clock});
  EXPECT_THROW(op(), idem::OperationError);
  EXPECT_THROW(op(), idem::OperationError);
  const auto events = sink->events();
  std::vector<idem::OperationEvent> changes, rejections;
  for (const auto& event : events) {
    if (event.type == idem::EventType::circuit_breaker_state_changed) changes.push_back(event);
    if (event.type == idem::EventType::circuit_breaker_rejected) rejections.push_back(event);
  }
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].fields.at("breaker"), "gateway");
  EXPECT_EQ(changes[0].fields.at("from"), "closed");
  EXPECT_EQ(changes[0].fields.at("to"), "open");
  ASSERT_EQ(rejections.size(), 1u);
  EXPECT_EQ(rejections[0].operation, "charge");
  EXPECT_EQ(rejections[0].fields.at("state"), "open");
  EXPECT_EQ(rejections[0].fields.at("retry_after_ms"), "30000");
}

}  // namespace
