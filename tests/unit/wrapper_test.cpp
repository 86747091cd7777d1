// RecorderWrapper / StoreWrapper forward every call — batch calls and capabilities included —
// and the non-virtual public calls check arguments before anything reaches a backend.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "idem/error.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/memory_store.hpp"
#include "idem/wrapper.hpp"

namespace {

using namespace std::chrono_literals;

// A backend that records which primitive was asked for.
class Probe final : public idem::IdempotencyRecorder {
 public:
  std::vector<std::string> calls;

 private:
  bool do_is_processed(std::string_view, std::string_view) override {
    calls.emplace_back("is_processed");
    return false;
  }
  void do_mark_processed(std::string_view, std::string_view) override {
    calls.emplace_back("mark_processed");
  }
  std::vector<bool> do_is_processed_many(std::string_view,
                                         std::span<const std::string> ids) override {
    calls.emplace_back("is_processed_many");
    return std::vector<bool>(ids.size(), true);
  }
  void do_mark_processed_many(std::string_view, std::span<const std::string>) override {
    calls.emplace_back("mark_processed_many");
  }
  idem::RecorderCapabilities do_capabilities() const noexcept override { return {.claims = true}; }
  idem::Claim do_claim(std::string_view, std::string_view, idem::Millis) override {
    calls.emplace_back("claim");
    return {};
  }
  std::size_t do_purge(std::chrono::system_clock::duration, const idem::PurgeProgress&) override {
    calls.emplace_back("purge");
    return 0;
  }
};

// A decorator that changes one call and inherits the rest.
class CountingMarks final : public idem::RecorderWrapper {
 public:
  using RecorderWrapper::RecorderWrapper;
  int marks = 0;

 private:
  void do_mark_processed(std::string_view consumer, std::string_view event_id) override {
    ++marks;
    RecorderWrapper::do_mark_processed(consumer, event_id);
  }
};

TEST(RecorderWrapper, ForwardsBatchesAndCapabilitiesToTheBackendsOwnPath) {
  auto probe = std::make_shared<Probe>();
  CountingMarks wrapper(probe);
  const std::vector<std::string> ids{"a", "b"};
  EXPECT_EQ(wrapper.is_processed_many("billing", ids), (std::vector<bool>{true, true}));
  wrapper.mark_processed_many("billing", ids);
  wrapper.mark_processed("billing", "c");
  EXPECT_TRUE(wrapper.capabilities().claims);
  EXPECT_FALSE(wrapper.capabilities().transactions);
  EXPECT_EQ(wrapper.claim("billing", "c", 1s).status, idem::Claim::Status::acquired);
  wrapper.purge(1h);
  EXPECT_EQ(probe->calls, (std::vector<std::string>{"is_processed_many", "mark_processed_many",
                                                    "mark_processed", "claim", "purge"}));
  EXPECT_EQ(wrapper.marks, 1);
}

TEST(RecorderWrapper, BadArgumentsStopAtThePublicCall) {
  auto probe = std::make_shared<Probe>();
  CountingMarks wrapper(probe);
  const std::vector<std::string> bad{"ok", std::string(1, '\0')};
  EXPECT_THROW(static_cast<void>(wrapper.is_processed("", "e")), idem::InvalidKey);
  EXPECT_THROW(wrapper.mark_processed("billing", std::string(300, 'x')), idem::InvalidKey);
  EXPECT_THROW(wrapper.mark_processed_many("billing", bad), idem::InvalidKey);
  EXPECT_THROW(static_cast<void>(wrapper.claim("billing", "e", 0ms)), idem::InvalidArgument);
  EXPECT_THROW(wrapper.purge(-1s), idem::InvalidArgument);
  EXPECT_THROW(static_cast<void>(wrapper.count_purgeable(-1s)), idem::InvalidArgument);
  EXPECT_TRUE(probe->calls.empty());
  EXPECT_EQ(wrapper.marks, 0);
  // An empty batch reads and writes nothing.
  EXPECT_TRUE(wrapper.is_processed_many("billing", {}).empty());
  wrapper.mark_processed_many("billing", {});
  EXPECT_TRUE(probe->calls.empty());
}

TEST(RecorderWrapper, RefusesANullTarget) {
  EXPECT_THROW(idem::RecorderWrapper(nullptr), idem::InvalidArgument);
  EXPECT_THROW(idem::StoreWrapper(nullptr), idem::InvalidArgument);
}

TEST(StoreWrapper, ForwardsEveryCallToARealStore) {
  auto inner = std::make_shared<idem::InMemoryIdempotencyStore>();
  idem::StoreWrapper store(inner);
  EXPECT_FALSE(store.needs_bytes());
  const auto claim = store.claim("k", std::nullopt, 1s);
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(store.renew("k", claim.token, 2s));
  EXPECT_TRUE(store.complete("k", claim.token, idem::StoredValue{}, idem::ExecutionReport{}, 1h));
  EXPECT_EQ(inner->lookup("k")->state, idem::IdempotencyRecord::State::completed);
  EXPECT_EQ(store.entry_count(), 1u);
  EXPECT_EQ(store.counts().completed, 1u);
  EXPECT_THROW(static_cast<void>(store.claim("", std::nullopt, 1s)), idem::InvalidKey);
  EXPECT_THROW(static_cast<void>(store.complete("k", 1, {}, {}, -1ms)), idem::InvalidArgument);
  EXPECT_THROW(static_cast<void>(store.renew("k", 1, 0ms)), idem::InvalidArgument);
}

}  // namespace
