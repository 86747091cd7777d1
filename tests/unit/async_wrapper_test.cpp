// idem::async::RecorderWrapper / StoreWrapper forward every call — batch calls, capabilities, the
// store's wait and blocking twin included — and the non-virtual public calls check arguments
// before anything reaches a backend. AsyncCrashingRecorder / AsyncCrashingStore fire a crash
// plan where their blocking twins do.
#include <gtest/gtest.h>
#include <signal.h>

#include <asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/async/memory_recorder.hpp"
#include "idem/async/memory_store.hpp"
#include "idem/async/recorder.hpp"
#include "idem/async/wrapper.hpp"
#include "idem/error.hpp"
#include "idem/memory_store.hpp"
#include "idem/testing/async_crash_points.hpp"
#include "idem/testing/async_support.hpp"

namespace {

using namespace std::chrono_literals;
using idem::async::Task;
using idem::testing::async_detail::run;

idem::StoredValue bytes(std::string text) {
  idem::StoredValue value;
  value.bytes = std::move(text);
  return value;
}

// A backend that records which primitive was asked for.
class AsyncProbe final : public idem::async::AsyncRecorder {
 public:
  std::vector<std::string> calls;

 private:
  Task<bool> do_is_processed(std::string_view, std::string_view) override {
    calls.emplace_back("is_processed");
    co_return false;
  }
  Task<void> do_mark_processed(std::string_view, std::string_view) override {
    calls.emplace_back("mark_processed");
    co_return;
  }
  Task<std::vector<bool>> do_is_processed_many(std::string_view,
                                               std::span<const std::string> ids) override {
    calls.emplace_back("is_processed_many");
    co_return std::vector<bool>(ids.size(), true);
  }
  Task<void> do_mark_processed_many(std::string_view, std::span<const std::string>) override {
    calls.emplace_back("mark_processed_many");
    co_return;
  }
  idem::RecorderCapabilities do_capabilities() const noexcept override { return {.claims = true}; }
  Task<idem::Claim> do_claim(std::string_view, std::string_view, idem::Millis) override {
    calls.emplace_back("claim");
    co_return idem::Claim{};
  }
};

// A decorator that changes one call and inherits the rest.
class CountingMarks final : public idem::async::RecorderWrapper {
 public:
  using RecorderWrapper::RecorderWrapper;
  int marks = 0;

 private:
  Task<void> do_mark_processed(std::string_view consumer, std::string_view event_id) override {
    co_await RecorderWrapper::do_mark_processed(consumer, event_id);
    ++marks;
  }
};

TEST(AsyncRecorderWrapper, ForwardsBatchesAndCapabilitiesToTheBackendsOwnPath) {
  asio::io_context io;
  auto probe = std::make_shared<AsyncProbe>();
  CountingMarks wrapper(probe);
  const std::vector<std::string> ids{"a", "b"};
  EXPECT_EQ(run(io, wrapper.is_processed_many("billing", ids)), (std::vector<bool>{true, true}));
  run(io, wrapper.mark_processed_many("billing", ids));
  run(io, wrapper.mark_processed("billing", "c"));
  EXPECT_TRUE(wrapper.capabilities().claims);
  EXPECT_FALSE(wrapper.capabilities().transactions);
  EXPECT_EQ(run(io, wrapper.claim("billing", "c", 1s)).status, idem::Claim::Status::acquired);
  EXPECT_EQ(probe->calls, (std::vector<std::string>{"is_processed_many", "mark_processed_many",
                                                    "mark_processed", "claim"}));
  EXPECT_EQ(wrapper.marks, 1);
  EXPECT_EQ(&wrapper.target(), probe.get());
}

TEST(AsyncRecorderWrapper, BadArgumentsStopAtThePublicCall) {
  asio::io_context io;
  auto probe = std::make_shared<AsyncProbe>();
  idem::async::RecorderWrapper wrapper(probe);
  EXPECT_THROW(run(io, wrapper.mark_processed("", "e1")), idem::InvalidArgument);
  EXPECT_THROW(run(io, wrapper.is_processed("billing", "")), idem::InvalidArgument);
  EXPECT_THROW(run(io, wrapper.claim("billing", "e1", 0ms)), idem::InvalidArgument);
  EXPECT_TRUE(probe->calls.empty());
}

TEST(AsyncRecorderWrapper, ANullTargetIsRefused) {
  EXPECT_THROW(idem::async::RecorderWrapper(nullptr), idem::InvalidArgument);
  EXPECT_THROW(idem::async::StoreWrapper(nullptr), idem::InvalidArgument);
  EXPECT_THROW(idem::testing::AsyncCrashingRecorder(nullptr, {}), idem::InvalidArgument);
  EXPECT_THROW(idem::testing::AsyncCrashingStore(nullptr, {}), idem::InvalidArgument);
}

TEST(AsyncStoreWrapper, ForwardsEveryCallAndTheBlockingTwin) {
  asio::io_context io;
  auto blocking = std::make_shared<idem::InMemoryIdempotencyStore>();
  auto store = std::make_shared<idem::async::AsyncMemoryStore>(blocking);
  idem::async::StoreWrapper wrapper(store);
  EXPECT_EQ(wrapper.needs_bytes(), store->needs_bytes());
  EXPECT_EQ(wrapper.blocking_store(), blocking);
  const auto claim = run(io, wrapper.claim("order-1", std::nullopt, 1s));
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(run(io, wrapper.renew("order-1", claim.token, 1s)));
  EXPECT_TRUE(
      run(io, wrapper.complete("order-1", claim.token, bytes("42"), idem::ExecutionReport{}, 1h)));
  const auto record = run(io, wrapper.lookup("order-1"));
  ASSERT_TRUE(record.has_value());
  // The wrapped store holds it, and wait() (the store's own) sees it at once.
  EXPECT_TRUE(run(io, store->lookup("order-1")).has_value());
  EXPECT_TRUE(run(io, wrapper.wait("order-1", std::chrono::steady_clock::now() + 1s)).has_value());
  EXPECT_THROW(run(io, wrapper.claim("", std::nullopt, 1s)), idem::InvalidArgument);
  const auto second = run(io, wrapper.claim("order-2", std::nullopt, 1s));
  EXPECT_TRUE(run(io, wrapper.release("order-2", second.token)));
}

idem::testing::CrashPlan throw_at(idem::testing::CrashPoint point) {
  return {.point = point, .action = idem::testing::CrashAction::throw_};
}

TEST(AsyncCrashingRecorder, BeforeCompleteThrowsAndNothingIsMarked) {
  asio::io_context io;
  auto inner = std::make_shared<idem::async::AsyncMemoryRecorder>();
  idem::testing::AsyncCrashingRecorder recorder(
      inner, throw_at(idem::testing::CrashPoint::before_complete));
  EXPECT_THROW(run(io, recorder.mark_processed("billing", "e1")), idem::testing::InjectedCrash);
  EXPECT_FALSE(run(io, inner->is_processed("billing", "e1")));
  const auto claim = run(io, recorder.claim("billing", "e2", 1s));
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  EXPECT_THROW(run(io, recorder.complete("billing", "e2", claim.token)),
               idem::testing::InjectedCrash);
  EXPECT_FALSE(run(io, inner->is_processed("billing", "e2")));
  EXPECT_EQ(recorder.fired(), 2u);
}

TEST(AsyncCrashingRecorder, DuringCompleteThrowsAfterTheMarkerIsDurable) {
  asio::io_context io;
  auto inner = std::make_shared<idem::async::AsyncMemoryRecorder>();
  idem::testing::AsyncCrashingRecorder recorder(
      inner, throw_at(idem::testing::CrashPoint::during_complete));
  EXPECT_THROW(run(io, recorder.mark_processed("billing", "e1")), idem::testing::InjectedCrash);
  EXPECT_TRUE(run(io, inner->is_processed("billing", "e1")));
  const std::vector<std::string> ids{"e2", "e3"};
  EXPECT_THROW(run(io, recorder.mark_processed_many("billing", ids)), idem::testing::InjectedCrash);
  EXPECT_EQ(run(io, inner->is_processed_many("billing", ids)), (std::vector<bool>{true, true}));
  EXPECT_EQ(recorder.fired(), 2u);
}

TEST(AsyncCrashingRecorder, AfterClaimFiresWhenTheCheckOrTheClaimLetsTheEventThrough) {
  asio::io_context io;
  auto inner = std::make_shared<idem::async::AsyncMemoryRecorder>();
  run(io, inner->mark_processed("billing", "seen"));
  idem::testing::AsyncCrashingRecorder recorder(inner,
                                                throw_at(idem::testing::CrashPoint::after_claim));
  // A processed event is not let through: nothing fires.
  EXPECT_TRUE(run(io, recorder.is_processed("billing", "seen")));
  const std::vector<std::string> seen_only{"seen"};
  EXPECT_EQ(run(io, recorder.is_processed_many("billing", seen_only)), (std::vector<bool>{true}));
  EXPECT_EQ(recorder.fired(), 0u);
  // The check, a batch with one unseen id, and an acquired claim let it through.
  EXPECT_THROW(run(io, recorder.is_processed("billing", "new")), idem::testing::InjectedCrash);
  const std::vector<std::string> mixed{"seen", "new"};
  EXPECT_THROW(run(io, recorder.is_processed_many("billing", mixed)), idem::testing::InjectedCrash);
  EXPECT_THROW(run(io, recorder.claim("billing", "new", 1s)), idem::testing::InjectedCrash);
  EXPECT_EQ(recorder.fired(), 3u);
  // The claim was taken before the crash: it is held until its lease passes.
  EXPECT_EQ(run(io, inner->claim("billing", "new", 1s)).status, idem::Claim::Status::in_progress);
}

TEST(AsyncCrashingRecorder, ANonePlanNeverFiresAndForwardsEverything) {
  asio::io_context io;
  auto inner = std::make_shared<idem::async::AsyncMemoryRecorder>();
  idem::testing::AsyncCrashingRecorder recorder(inner, {});
  run(io, recorder.mark_processed("billing", "e1"));
  EXPECT_TRUE(run(io, recorder.is_processed("billing", "e1")));
  EXPECT_EQ(recorder.capabilities().claims, inner->capabilities().claims);
  EXPECT_EQ(recorder.fired(), 0u);
  EXPECT_EQ(recorder.inner(), inner);
}

TEST(AsyncCrashingStoreDeathTest, KillEndsTheProcessAfterTheClaim) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        asio::io_context io;
        idem::testing::AsyncCrashingStore store(std::make_shared<idem::async::AsyncMemoryStore>(),
                                                {.point = idem::testing::CrashPoint::after_claim,
                                                 .action = idem::testing::CrashAction::kill});
        static_cast<void>(run(io, store.claim("order-1", std::nullopt, 1s)));
      },
      ::testing::KilledBySignal(SIGKILL), "");
}

TEST(AsyncCrashingStore, BeforeCompleteThrowsAndTheClaimStaysInProgress) {
  asio::io_context io;
  auto inner = std::make_shared<idem::async::AsyncMemoryStore>();
  idem::testing::AsyncCrashingStore store(inner,
                                          throw_at(idem::testing::CrashPoint::before_complete));
  const auto claim = run(io, store.claim("order-1", std::nullopt, 1s));
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_THROW(
      run(io, store.complete("order-1", claim.token, bytes("1"), idem::ExecutionReport{}, 1h)),
      idem::testing::InjectedCrash);
  const auto again = run(io, inner->claim("order-1", std::nullopt, 1s));
  EXPECT_EQ(again.status, idem::ClaimOutcome::Status::in_progress);
  EXPECT_EQ(store.fired(), 1u);
}

}  // namespace
