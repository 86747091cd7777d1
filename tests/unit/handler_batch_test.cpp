// EventHandler::handle_batch: a window of deliveries at once. In check_then_mark mode an
// IdempotentHandler checks the window with one is_processed_many and marks its successes with
// one mark_processed_many; every outcome means what operator() would have returned or thrown.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "../core_names.hpp"
#include "idem/handler.hpp"
#include "idem/memory_recorder.hpp"

#include <nlohmann/json.hpp>

namespace {

using namespace idem::test::core_names;

// Forwards to an in-memory recorder, counting the calls of each kind; can fail the batch calls.
class CountingRecorder : public idem::IdempotencyRecorder {
 public:
  bool do_is_processed(std::string_view c, std::string_view e) override {
    ++single_checks;
    return inner_.is_processed(c, e);
  }
  void do_mark_processed(std::string_view c, std::string_view e) override {
    ++single_marks;
    inner_.mark_processed(c, e);
  }
  std::vector<bool> do_is_processed_many(std::string_view c,
                                         std::span<const std::string> ids) override {
    ++batch_checks;
    if (fail_checks) throw idem::StoreError("recorder unreachable", /*retryable=*/true);
    return inner_.is_processed_many(c, ids);
  }
  void do_mark_processed_many(std::string_view c, std::span<const std::string> ids) override {
    ++batch_marks;
    last_marked.assign(ids.begin(), ids.end());
    if (fail_marks) throw idem::StoreError("disk full", /*retryable=*/true);
    inner_.mark_processed_many(c, ids);
  }
  idem::RecorderCapabilities do_capabilities() const noexcept override { return {.claims = true}; }
  idem::Claim do_claim(std::string_view c, std::string_view e, idem::Millis lease) override {
    ++claims;
    return inner_.claim(c, e, lease);
  }
  bool do_complete(std::string_view c, std::string_view e, std::uint64_t t) override {
    return inner_.complete(c, e, t);
  }
  bool do_release(std::string_view c, std::string_view e, std::uint64_t t) override {
    return inner_.release(c, e, t);
  }
  bool do_renew(std::string_view c, std::string_view e, std::uint64_t t,
                idem::Millis lease) override {
    return inner_.renew(c, e, t, lease);
  }
  std::size_t do_purge(std::chrono::system_clock::duration older_than,
                       const idem::PurgeProgress& progress) override {
    return inner_.purge(older_than, progress);
  }

  int single_checks = 0;
  int single_marks = 0;
  int batch_checks = 0;
  int batch_marks = 0;
  int claims = 0;
  bool fail_checks = false;
  bool fail_marks = false;
  std::vector<std::string> last_marked;

 private:
  idem::InMemoryIdempotencyRecorder inner_;
};

struct Fixture {
  std::shared_ptr<CountingRecorder> recorder = std::make_shared<CountingRecorder>();
  std::map<std::string, int> effects;  // payload → times the side effect ran
  CollectingBusProxy bus{"billing"};

  std::shared_ptr<idem::EventHandler> handler(HandlerMode mode) {
    return idem::make_idempotent_handler("billing", recorder,
                                         [this](const std::string& payload) {
                                           if (payload.starts_with("fail"))
                                             throw std::runtime_error("declined: " + payload);
                                           ++effects[payload];
                                         },
                                         {mode});
  }
};

std::string error_of(const HandleOutcome& outcome) {
  if (!outcome.error) return "";
  try {
    std::rethrow_exception(outcome.error);
  } catch (const std::exception& e) {
    return e.what();
  }
}

template <class E>
bool error_is(const HandleOutcome& outcome) {
  if (!outcome.error) return false;
  try {
    std::rethrow_exception(outcome.error);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

TEST(HandleBatch, CheckThenMarkChecksAndMarksTheWholeWindowWithOneCallEach) {
  Fixture f;
  auto handler = f.handler(HandlerMode::check_then_mark);
  const Event seen = Event::make("t", "seen");
  f.recorder->mark_processed("billing", seen.id);
  const Event a = Event::make("t", "a");
  const Event b = Event::make("t", "b");
  const std::vector<Event> window = {a, seen, b, a};  // `a` again: delivered twice in the window

  const auto outcomes = handler->handle_batch(window, f.bus);

  ASSERT_EQ(outcomes.size(), 4u);
  EXPECT_EQ(outcomes[0].result, HandleResult::processed);
  EXPECT_EQ(outcomes[1].result, HandleResult::duplicate);
  EXPECT_EQ(outcomes[2].result, HandleResult::processed);
  EXPECT_EQ(outcomes[3].result, HandleResult::duplicate);
  for (const auto& outcome : outcomes)
    EXPECT_FALSE(outcome.error);
  EXPECT_EQ(f.effects, (std::map<std::string, int>{{"a", 1}, {"b", 1}}));
  EXPECT_EQ(f.recorder->batch_checks, 1);
  EXPECT_EQ(f.recorder->batch_marks, 1);
  EXPECT_EQ(f.recorder->single_checks, 0);
  EXPECT_EQ(f.recorder->last_marked, (std::vector<std::string>{a.id, b.id}));
  EXPECT_TRUE(f.recorder->is_processed("billing", a.id));
  EXPECT_TRUE(f.recorder->is_processed("billing", b.id));
}

TEST(HandleBatch, AFailingEventStaysUnmarkedAndTheOthersAreMarked) {
  Fixture f;
  auto handler = f.handler(HandlerMode::check_then_mark);
  const Event ok1 = Event::make("t", "ok1");
  const Event bad = Event::make("t", "fail-1");
  const Event ok2 = Event::make("t", "ok2");

  const auto outcomes = handler->handle_batch(std::vector<Event>{ok1, bad, ok2}, f.bus);

  EXPECT_EQ(outcomes[0].result, HandleResult::processed);
  EXPECT_FALSE(outcomes[1].result);
  EXPECT_EQ(error_of(outcomes[1]), "declined: fail-1");
  EXPECT_EQ(outcomes[2].result, HandleResult::processed);
  EXPECT_FALSE(f.recorder->is_processed("billing", bad.id));
  EXPECT_TRUE(f.recorder->is_processed("billing", ok1.id));
  EXPECT_TRUE(f.recorder->is_processed("billing", ok2.id));
}

TEST(HandleBatch, ARepeatOfAnEventThatFailedEarlierInTheWindowRunsAgain) {
  // As with one delivery at a time: a failed delivery leaves nothing marked, so the next
  // delivery of the same event is not a duplicate.
  Fixture f;
  int calls = 0;
  auto handler = idem::make_idempotent_handler("billing", f.recorder,
                                               [&](const std::string&) {
                                                 if (++calls == 1)
                                                   throw std::runtime_error("flaky");
                                               },
                                               {HandlerMode::check_then_mark});
  const Event event = Event::make("t", "x");

  const auto outcomes = handler->handle_batch(std::vector<Event>{event, event}, f.bus);

  EXPECT_TRUE(outcomes[0].error);
  EXPECT_EQ(outcomes[1].result, HandleResult::processed);
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(f.recorder->is_processed("billing", event.id));
}

TEST(HandleBatch, AFailedBatchMarkFailsEveryEventItWouldHaveMarked) {
  // Their side effects ran; reported as failed, the transport redelivers them and they run
  // again — check_then_mark's crash-before-mark window, over the batch.
  Fixture f;
  auto handler = f.handler(HandlerMode::check_then_mark);
  f.recorder->fail_marks = true;
  const Event seen = Event::make("t", "seen");
  f.recorder->mark_processed("billing", seen.id);
  const std::vector<Event> window = {Event::make("t", "a"), seen, Event::make("t", "fail-2")};

  const auto outcomes = handler->handle_batch(window, f.bus);

  EXPECT_TRUE(error_is<idem::StoreError>(outcomes[0]));
  EXPECT_NE(error_of(outcomes[0]).find("disk full"), std::string::npos);
  EXPECT_EQ(outcomes[1].result, HandleResult::duplicate);  // it needed no mark
  EXPECT_EQ(error_of(outcomes[2]), "declined: fail-2");
  EXPECT_EQ(f.effects, (std::map<std::string, int>{{"a", 1}}));
  EXPECT_FALSE(f.recorder->is_processed("billing", window[0].id));
}

TEST(HandleBatch, AFailedBatchCheckRunsNothing) {
  Fixture f;
  auto handler = f.handler(HandlerMode::check_then_mark);
  f.recorder->fail_checks = true;

  const auto outcomes = handler->handle_batch(
      std::vector<Event>{Event::make("t", "a"), Event::make("t", "b")}, f.bus);

  for (const auto& outcome : outcomes)
    EXPECT_TRUE(error_is<idem::StoreError>(outcome));
  EXPECT_TRUE(f.effects.empty());
  EXPECT_EQ(f.recorder->batch_marks, 0);
}

TEST(HandleBatch, AnInvalidEventIdFailsOnlyThatEvent) {
  Fixture f;
  auto handler = f.handler(HandlerMode::check_then_mark);
  Event bad = Event::make("t", "bad-id");
  bad.id = std::string("a\0b", 3);
  const Event good = Event::make("t", "good");

  const auto outcomes = handler->handle_batch(std::vector<Event>{bad, good}, f.bus);

  EXPECT_TRUE(error_is<idem::InvalidKey>(outcomes[0]));
  EXPECT_EQ(outcomes[1].result, HandleResult::processed);
  EXPECT_EQ(f.effects, (std::map<std::string, int>{{"good", 1}}));
}

TEST(HandleBatch, AnUndecodablePayloadFailsWithDecodeErrorAndIsNotMarked) {
  auto recorder = std::make_shared<CountingRecorder>();
  int handled = 0;
  auto handler = idem::make_idempotent_handler<nlohmann::json>(
      "billing", recorder, [&](const nlohmann::json&) { ++handled; },
      {HandlerMode::check_then_mark});
  CollectingBusProxy bus("billing");
  const Event broken = Event::make("t", "{not json");
  const Event fine = Event::make("t", R"({"n":1})");

  const auto outcomes = handler->handle_batch(std::vector<Event>{broken, fine}, bus);

  EXPECT_TRUE(error_is<idem::DecodeError>(outcomes[0]));
  EXPECT_EQ(outcomes[1].result, HandleResult::processed);
  EXPECT_EQ(handled, 1);
  EXPECT_FALSE(recorder->is_processed("billing", broken.id));
}

TEST(HandleBatch, ExclusiveModeClaimsEachEventAsOneDeliveryAtATimeWould) {
  Fixture f;
  auto handler = f.handler(HandlerMode::exclusive);
  const Event a = Event::make("t", "a");
  const Event failing = Event::make("t", "fail-3");

  const auto outcomes = handler->handle_batch(std::vector<Event>{a, failing, a}, f.bus);

  EXPECT_EQ(outcomes[0].result, HandleResult::processed);
  EXPECT_EQ(error_of(outcomes[1]), "declined: fail-3");
  EXPECT_EQ(outcomes[2].result, HandleResult::duplicate);
  EXPECT_EQ(f.recorder->claims, 3);
  EXPECT_EQ(f.recorder->batch_checks, 0);
  EXPECT_EQ(f.effects, (std::map<std::string, int>{{"a", 1}}));
  // The failed claim was released: the next delivery acquires it.
  EXPECT_EQ(f.recorder->claim("billing", failing.id, idem::Millis(1000)).status,
            idem::Claim::Status::acquired);
}

TEST(HandleBatch, ThePlainEventHandlerDefaultCallsOperatorForEachEvent) {
  class Counting final : public idem::EventHandler {
   public:
    const std::string& consumer() const noexcept override { return name_; }
    HandleResult operator()(const Event& event, idem::BusProxy&) override {
      if (event.payload == "boom") throw std::logic_error("boom");
      ++calls;
      return HandleResult::processed;
    }
    int calls = 0;

   private:
    std::string name_ = "plain";
  } handler;
  CollectingBusProxy bus("plain");

  const auto outcomes = handler.handle_batch(
      std::vector<Event>{Event::make("t", "1"), Event::make("t", "boom"), Event::make("t", "2")},
      bus);

  EXPECT_EQ(outcomes[0].result, HandleResult::processed);
  EXPECT_EQ(error_of(outcomes[1]), "boom");
  EXPECT_EQ(outcomes[2].result, HandleResult::processed);
  EXPECT_EQ(handler.calls, 2);
  EXPECT_TRUE(handler.handle_batch({}, bus).empty());
}

TEST(HandleBatch, AnEmptyWindowTouchesNothingItNeedNot) {
  Fixture f;
  auto handler = f.handler(HandlerMode::check_then_mark);
  EXPECT_TRUE(handler->handle_batch({}, f.bus).empty());
  EXPECT_TRUE(f.effects.empty());
}

}  // namespace
