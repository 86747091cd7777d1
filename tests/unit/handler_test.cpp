#include "idem/handler.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <latch>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "../in_memory_transactional_recorder.hpp"
#include "../run_together.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/testing/manual_clock.hpp"

// Linked with other test files into one executable: file-local, like everything here.
namespace {
namespace shop {
struct Order {
  std::string id;
  int amount = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Order, id, amount)
}  // namespace shop
}  // namespace

namespace {

using idem::BusProxy;
using idem::Claim;
using idem::Event;
using idem::HandleResult;
using idem::HandlerMode;
using idem::HandlerOptions;
using idem::InMemoryIdempotencyRecorder;
using idem::testing::ManualClock;
using namespace std::chrono_literals;

struct PaymentDeclined : std::runtime_error {
  PaymentDeclined() : std::runtime_error("payment declined") {}
};

// Forwards to an in-memory recorder; counts renewals, can pretend to renew (a stalled
// heartbeat), and can hide its claim support (a check/mark-only recorder).
class WrappedRecorder : public idem::IdempotencyRecorder {
 public:
  WrappedRecorder(std::shared_ptr<ManualClock> clock, bool claims = true)
      : inner_(std::make_shared<InMemoryIdempotencyRecorder>(
            idem::InMemoryRecorderOptions{.clock = std::move(clock)})),
        claims_(claims) {}

  bool do_is_processed(std::string_view c, std::string_view e) override {
    return inner_->is_processed(c, e);
  }
  void do_mark_processed(std::string_view c, std::string_view e) override {
    inner_->mark_processed(c, e);
  }
  idem::RecorderCapabilities do_capabilities() const noexcept override {
    return {.claims = claims_};
  }
  Claim do_claim(std::string_view c, std::string_view e, idem::Millis lease) override {
    return inner_->claim(c, e, lease);
  }
  bool do_complete(std::string_view c, std::string_view e, std::uint64_t t) override {
    return inner_->complete(c, e, t);
  }
  bool do_release(std::string_view c, std::string_view e, std::uint64_t t) override {
    releases_.fetch_add(1);
    return inner_->release(c, e, t);
  }
  bool do_renew(std::string_view c, std::string_view e, std::uint64_t t,
                idem::Millis lease) override {
    bool result = true;
    if (renew_enabled_.load()) result = inner_->renew(c, e, t, lease);
    {
      std::lock_guard lock(mutex_);
      ++renewals_;
    }
    cv_.notify_all();
    return result;
  }
  std::size_t do_purge(std::chrono::system_clock::duration d,
                       const idem::PurgeProgress& progress) override {
    return inner_->purge(d, progress);
  }

  // Waits (on a condition variable, not a sleep) until `n` renewals happened. The generous
  // bound only keeps a broken heartbeat from hanging the test run.
  bool wait_for_renewals(int n) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, 60s, [&] { return renewals_ >= n; });
  }

  InMemoryIdempotencyRecorder& inner() { return *inner_; }
  std::atomic<bool> renew_enabled_{true};
  std::atomic<int> releases_{0};

 private:
  std::shared_ptr<InMemoryIdempotencyRecorder> inner_;
  bool claims_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int renewals_ = 0;
};

// A recorder with transactions: writes made through FakeTransaction become visible only when
// the transaction commits, exactly like a database's.
class FakeTransaction : public idem::Transaction {
 public:
  void write(std::string row) { rows.push_back(std::move(row)); }
  std::vector<std::string> rows;
};

class TransactionalRecorder final
    : public idem::test::InMemoryTransactionalRecorder<FakeTransaction> {
 public:
  std::vector<std::string> committed;

 private:
  void commit(FakeTransaction& tx) override {
    for (auto& row : tx.rows)
      committed.push_back(std::move(row));
  }
};

Event order_event(std::string payload = R"({"id":"o-1","amount":2499})") {
  return Event::make("order.created", std::move(payload));
}

// ---- construction -------------------------------------------------------------------------

TEST(IdempotentHandler, ModeAndResultNames) {
  EXPECT_EQ(idem::to_string(HandlerMode::automatic), "automatic");
  EXPECT_EQ(idem::to_string(HandlerMode::check_then_mark), "check_then_mark");
  EXPECT_EQ(idem::to_string(HandlerMode::exclusive), "exclusive");
  EXPECT_EQ(idem::to_string(HandlerMode::transactional), "transactional");
  EXPECT_EQ(idem::to_string(HandleResult::processed), "processed");
  EXPECT_EQ(idem::to_string(HandleResult::duplicate), "duplicate");
}

TEST(IdempotentHandler, AutomaticModeResolvesFromTheRecorderCapabilities) {
  auto clock = std::make_shared<ManualClock>();
  auto noop = [](const std::string&) {};
  {
    idem::detail::FunctionHandler<std::string, decltype(noop)> handler(
        "billing", std::make_shared<WrappedRecorder>(clock, /*claims=*/true), noop, {});
    EXPECT_EQ(handler.mode(), HandlerMode::exclusive);
    EXPECT_EQ(handler.consumer(), "billing");
  }
  {
    idem::detail::FunctionHandler<std::string, decltype(noop)> handler(
        "billing", std::make_shared<WrappedRecorder>(clock, /*claims=*/false), noop, {});
    EXPECT_EQ(handler.mode(), HandlerMode::check_then_mark);
  }
  {
    // Transactional is never chosen automatically: the handler must be written for it.
    idem::detail::FunctionHandler<std::string, decltype(noop)> handler(
        "billing", std::make_shared<TransactionalRecorder>(), noop, {});
    EXPECT_EQ(handler.mode(), HandlerMode::check_then_mark);
  }
}

TEST(IdempotentHandler, RejectsBadConstruction) {
  auto memory = std::make_shared<InMemoryIdempotencyRecorder>();
  auto noop = [](const std::string&) {};
  using idem::make_idempotent_handler;
  EXPECT_THROW(make_idempotent_handler("", memory, noop), idem::InvalidKey);
  EXPECT_THROW(make_idempotent_handler("bad\nname", memory, noop), idem::InvalidKey);
  EXPECT_THROW(make_idempotent_handler(std::string(256, 'c'), memory, noop), idem::InvalidKey);
  EXPECT_THROW(make_idempotent_handler("billing", nullptr, noop), idem::InvalidArgument);
  EXPECT_THROW(make_idempotent_handler("billing", memory, noop,
                                       {.mode = HandlerMode::exclusive, .lease = 0ms}),
               idem::ConfigError);
  EXPECT_THROW(
      make_idempotent_handler("billing", memory, noop, {.mode = HandlerMode::transactional}),
      idem::NotSupported);
  auto check_only = std::make_shared<WrappedRecorder>(std::make_shared<ManualClock>(), false);
  EXPECT_THROW(
      make_idempotent_handler("billing", check_only, noop, {.mode = HandlerMode::exclusive}),
      idem::NotSupported);
}

// ---- behaviour common to check_then_mark and exclusive ------------------------------------

class EveryMode : public ::testing::TestWithParam<HandlerMode> {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>();
  std::shared_ptr<WrappedRecorder> recorder_ =
      std::make_shared<WrappedRecorder>(clock_, /*claims=*/true);
  HandlerOptions options() const { return {.mode = GetParam(), .clock = clock_}; }
};

TEST_P(EveryMode, ProcessesOnceAndDropsDuplicates) {
  int runs = 0;
  auto handler = idem::make_idempotent_handler<shop::Order>(
      "billing", recorder_,
      [&](const shop::Order& order, BusProxy& bus, const Event& event) {
        ++runs;
        EXPECT_EQ(order.id, "o-1");
        EXPECT_EQ(order.amount, 2499);
        EXPECT_EQ(bus.consumer(), "billing-proxy");
        EXPECT_EQ(event.type, "order.created");
        EXPECT_EQ(bus.transaction(), nullptr) << "only transactional mode has a transaction";
      },
      options());
  idem::CollectingBusProxy bus("billing-proxy");
  const Event event = order_event();
  EXPECT_EQ((*handler)(event, bus), HandleResult::processed);
  EXPECT_TRUE(recorder_->is_processed("billing", event.id));
  EXPECT_EQ((*handler)(event, bus), HandleResult::duplicate);
  EXPECT_EQ((*handler)(event, bus), HandleResult::duplicate);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(recorder_->inner().claim_count(), 0u) << "no claim left behind";
}

TEST_P(EveryMode, ThrowingHandlerIsNotMarkedAndRethrows) {
  int runs = 0;
  auto handler = idem::make_idempotent_handler(
      "billing", recorder_,
      [&](const std::string&) {
        if (++runs == 1) throw PaymentDeclined();
      },
      options());
  idem::CollectingBusProxy bus;
  const Event event = order_event();
  EXPECT_THROW((*handler)(event, bus), PaymentDeclined);
  EXPECT_FALSE(recorder_->is_processed("billing", event.id));
  // The redelivery runs again (no lease to wait out in exclusive mode: the claim was released).
  EXPECT_EQ((*handler)(event, bus), HandleResult::processed);
  EXPECT_EQ(runs, 2);
  EXPECT_TRUE(recorder_->is_processed("billing", event.id));
  if (GetParam() == HandlerMode::exclusive) {
    EXPECT_EQ(recorder_->releases_.load(), 1);
  }
}

TEST_P(EveryMode, ConsumersKeepTheirOwnMarkers) {
  int billing = 0;
  int shipping = 0;
  auto billing_handler = idem::make_idempotent_handler(
      "billing", recorder_, [&](const std::string&) { ++billing; }, options());
  auto shipping_handler = idem::make_idempotent_handler(
      "shipping", recorder_, [&](const std::string&) { ++shipping; }, options());
  idem::CollectingBusProxy bus;
  const Event event = order_event();
  for (int i = 0; i < 3; ++i) {
    (*billing_handler)(event, bus);
    (*shipping_handler)(event, bus);
  }
  EXPECT_EQ(billing, 1);
  EXPECT_EQ(shipping, 1);
}

TEST_P(EveryMode, InvalidEventIdIsRejectedBeforeAnything) {
  int runs = 0;
  auto handler = idem::make_idempotent_handler(
      "billing", recorder_, [&](const std::string&) { ++runs; }, options());
  idem::CollectingBusProxy bus;
  for (const std::string& bad : {std::string(), std::string("  "), std::string("a\0b", 3),
                                 std::string("x\ty"), std::string(256, 'e')}) {
    Event event = order_event();
    event.id = bad;
    EXPECT_THROW((*handler)(event, bus), idem::InvalidKey);
  }
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(recorder_->inner().marker_count(), 0u);
  EXPECT_EQ(recorder_->inner().claim_count(), 0u);
}

TEST_P(EveryMode, UndecodablePayloadThrowsDecodeErrorAndMarksNothing) {
  int runs = 0;
  auto handler = idem::make_idempotent_handler<shop::Order>(
      "billing", recorder_, [&](const shop::Order&) { ++runs; }, options());
  idem::CollectingBusProxy bus;
  for (const std::string& bad :
       std::vector<std::string>{"not json", R"({"id": 7})", R"([1,2])", ""}) {
    const Event event = order_event(bad);
    try {
      (*handler)(event, bus);
      ADD_FAILURE() << "payload '" << bad << "' decoded";
    } catch (const idem::DecodeError& e) {
      EXPECT_EQ(e.code(), idem::ErrorCode::decode_error);
      EXPECT_NE(std::string(e.what()).find(event.id), std::string::npos) << e.what();
    }
    EXPECT_FALSE(recorder_->is_processed("billing", event.id));
  }
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(recorder_->inner().claim_count(), 0u);
}

TEST_P(EveryMode, FollowUpsArePublishedThroughTheProxy) {
  auto handler = idem::make_idempotent_handler<nlohmann::json>(
      "billing", recorder_,
      [](const nlohmann::json& order, BusProxy& bus) {
        bus.publish(Event::make("payment.requested", order.dump()));
      },
      options());
  idem::CollectingBusProxy bus;
  const Event event = order_event();
  (*handler)(event, bus);
  (*handler)(event, bus);  // duplicate: publishes nothing
  const auto published = bus.published();
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published[0].type, "payment.requested");
  EXPECT_EQ(nlohmann::json::parse(published[0].payload)["amount"], 2499);
}

TEST_P(EveryMode, SubclassFormWorks) {
  class Billing : public idem::IdempotentHandler<shop::Order> {
   public:
    using IdempotentHandler::IdempotentHandler;
    int total = 0;

   protected:
    void handle(const shop::Order& order, BusProxy&, const Event&) override {
      total += order.amount;
    }
  };
  Billing billing("billing", recorder_, options());
  EXPECT_EQ(billing.mode(), GetParam());
  idem::CollectingBusProxy bus;
  const Event event = order_event();
  billing(event, bus);
  billing(event, bus);
  EXPECT_EQ(billing.total, 2499);
}

INSTANTIATE_TEST_SUITE_P(Modes, EveryMode,
                         ::testing::Values(HandlerMode::check_then_mark, HandlerMode::exclusive),
                         [](const auto& param_info) {
                           return std::string(idem::to_string(param_info.param));
                         });

// ---- exclusive mode -----------------------------------------------------------------------

TEST(ExclusiveMode, ConcurrentDuplicateGetsAlreadyInProgress) {
  auto clock = std::make_shared<ManualClock>();
  auto recorder = std::make_shared<WrappedRecorder>(clock);
  std::latch entered(1);
  std::latch finish(1);
  int runs = 0;
  auto handler = idem::make_idempotent_handler("billing", recorder,
                                               [&](const std::string&) {
                                                 ++runs;
                                                 entered.count_down();
                                                 finish.wait();
                                               },
                                               {.mode = HandlerMode::exclusive, .clock = clock});
  const Event event = order_event();
  HandleResult first_result = HandleResult::duplicate;
  std::thread first([&] {
    idem::CollectingBusProxy bus;
    first_result = (*handler)(event, bus);
  });
  entered.wait();
  idem::CollectingBusProxy bus;
  try {
    (*handler)(event, bus);
    ADD_FAILURE() << "a concurrent duplicate ran";
  } catch (const idem::AlreadyInProgress& e) {
    EXPECT_TRUE(e.retryable());
    EXPECT_NE(std::string(e.what()).find(event.id), std::string::npos);
  }
  finish.count_down();
  first.join();
  EXPECT_EQ(first_result, HandleResult::processed);
  // The redelivery of the duplicate is now dropped.
  EXPECT_EQ((*handler)(event, bus), HandleResult::duplicate);
  EXPECT_EQ(runs, 1);
}

TEST(ExclusiveMode, CrashedOwnersClaimIsTakenOverAfterItsLease) {
  auto clock = std::make_shared<ManualClock>();
  auto recorder = std::make_shared<WrappedRecorder>(clock);
  int runs = 0;
  auto handler =
      idem::make_idempotent_handler("billing", recorder, [&](const std::string&) { ++runs; },
                                    {.mode = HandlerMode::exclusive, .lease = 10s, .clock = clock});
  const Event event = order_event();
  // Another process claimed the event and died.
  const Claim crashed = recorder->claim("billing", event.id, 10s);
  ASSERT_EQ(crashed.status, Claim::Status::acquired);

  idem::CollectingBusProxy bus;
  EXPECT_THROW((*handler)(event, bus), idem::AlreadyInProgress);
  clock->advance(11s);
  EXPECT_EQ((*handler)(event, bus), HandleResult::processed);
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(recorder->complete("billing", event.id, crashed.token)) << "old token fenced";
  EXPECT_EQ((*handler)(event, bus), HandleResult::duplicate);
}

TEST(ExclusiveMode, HeartbeatKeepsALongHandlersClaim) {
  auto clock = std::make_shared<ManualClock>();
  auto recorder = std::make_shared<WrappedRecorder>(clock);
  const Event event = order_event();
  Claim during;
  auto handler = idem::make_idempotent_handler(
      "billing", recorder,
      [&](const std::string&) {
        // Run for longer than the 3 s lease; the heartbeat renews every second.
        for (int i = 1; i <= 3; ++i) {
          clock->advance(1100ms);
          ASSERT_TRUE(recorder->wait_for_renewals(i)) << "no heartbeat";
        }
        during = recorder->claim("billing", event.id, 3s);  // 3.3 s after our claim
      },
      {.mode = HandlerMode::exclusive, .lease = 3s, .clock = clock});
  idem::CollectingBusProxy bus;
  EXPECT_EQ((*handler)(event, bus), HandleResult::processed);
  EXPECT_EQ(during.status, Claim::Status::in_progress) << "the lease lapsed while running";
  EXPECT_TRUE(recorder->is_processed("billing", event.id));
}

TEST(ExclusiveMode, FencedCompleteIsReportedAsLeaseLost) {
  auto clock = std::make_shared<ManualClock>();
  auto recorder = std::make_shared<WrappedRecorder>(clock);
  recorder->renew_enabled_ = false;  // a stalled process: its heartbeat does not get through
  const Event event = order_event();
  Claim successor;
  auto handler =
      idem::make_idempotent_handler("billing", recorder,
                                    [&](const std::string&) {
                                      clock->advance(4s);  // past the 3 s lease
                                      successor = recorder->claim("billing", event.id, 3s);
                                    },
                                    {.mode = HandlerMode::exclusive, .lease = 3s, .clock = clock});
  idem::CollectingBusProxy bus;
  try {
    (*handler)(event, bus);
    ADD_FAILURE() << "a fenced complete was hidden";
  } catch (const idem::LeaseLost& e) {
    EXPECT_TRUE(e.in_doubt());
    EXPECT_TRUE(e.retryable());
  }
  ASSERT_EQ(successor.status, Claim::Status::acquired);
  EXPECT_TRUE(successor.took_over);
  EXPECT_FALSE(recorder->is_processed("billing", event.id)) << "the fenced owner marked";
  EXPECT_TRUE(recorder->complete("billing", event.id, successor.token));
  EXPECT_EQ((*handler)(event, bus), HandleResult::duplicate);
}

TEST(ExclusiveMode, EightThreadsRaceOverTheSameEventsAndEachRunsOnce) {
  constexpr int kThreads = 8;
  constexpr int kEvents = 10'000;
  auto recorder = std::make_shared<InMemoryIdempotencyRecorder>();
  std::vector<Event> events;
  for (int i = 0; i < kEvents; ++i)
    events.push_back(order_event(std::to_string(i)));
  std::vector<std::atomic<int>> effects(kEvents);
  auto handler = idem::make_idempotent_handler<int>(
      "billing", recorder, [&](const int& i) { effects[static_cast<std::size_t>(i)]++; },
      {.mode = HandlerMode::exclusive});
  std::atomic<int> processed{0};
  std::atomic<int> in_progress{0};
  std::atomic<int> errors{0};
  idem::test::run_together(kThreads, [&](int t) {
    idem::CollectingBusProxy bus;
    for (int n = 0; n < kEvents; ++n) {
      const auto& event = events[static_cast<std::size_t>(t % 2 == 0 ? n : kEvents - 1 - n)];
      // A transport redelivers an AlreadyInProgress event until it is processed or dropped.
      while (true) {
        try {
          if ((*handler)(event, bus) == HandleResult::processed) processed++;
          break;
        } catch (const idem::AlreadyInProgress&) {
          in_progress++;
          std::this_thread::yield();
        } catch (...) {
          errors++;
          break;
        }
      }
    }
  });
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(processed.load(), kEvents);
  for (int i = 0; i < kEvents; ++i) {
    ASSERT_EQ(effects[static_cast<std::size_t>(i)].load(), 1) << "event #" << i;
  }
  EXPECT_EQ(recorder->marker_count(), static_cast<std::size_t>(kEvents));
  EXPECT_EQ(recorder->claim_count(), 0u);
}

// ---- transactional mode -------------------------------------------------------------------

TEST(TransactionalMode, HandlerWritesAndMarkerCommitTogether) {
  auto recorder = std::make_shared<TransactionalRecorder>();
  idem::CollectingBusProxy bus("billing");
  auto handler = idem::make_idempotent_handler<shop::Order>(
      "billing", recorder,
      [&](const shop::Order& order, BusProxy& tx_bus) {
        auto* tx = dynamic_cast<FakeTransaction*>(tx_bus.transaction());
        ASSERT_NE(tx, nullptr);
        tx->write("charge " + order.id);
        EXPECT_EQ(tx_bus.consumer(), "billing");
        tx_bus.publish(Event::make("payment.charged", order.id));
        EXPECT_TRUE(bus.published().empty()) << "published before the commit";
      },
      {.mode = HandlerMode::transactional});
  const Event event = order_event();
  EXPECT_EQ((*handler)(event, bus), HandleResult::processed);
  EXPECT_EQ(recorder->committed, std::vector<std::string>{"charge o-1"});
  ASSERT_EQ(bus.published().size(), 1u);
  EXPECT_EQ(bus.published()[0].type, "payment.charged");
  EXPECT_EQ((*handler)(event, bus), HandleResult::duplicate);
  EXPECT_EQ(recorder->committed.size(), 1u);
  EXPECT_EQ(bus.published().size(), 1u);
}

TEST(TransactionalMode, RollbackDiscardsWritesMarkerAndFollowUps) {
  auto recorder = std::make_shared<TransactionalRecorder>();
  idem::CollectingBusProxy bus("billing");
  int runs = 0;
  auto handler = idem::make_idempotent_handler(
      "billing", recorder,
      [&](const std::string&, BusProxy& tx_bus) {
        static_cast<FakeTransaction*>(tx_bus.transaction())->write("row");
        tx_bus.publish(Event::make("payment.charged", "x"));
        if (++runs == 1) throw PaymentDeclined();
      },
      {.mode = HandlerMode::transactional});
  const Event event = order_event();
  EXPECT_THROW((*handler)(event, bus), PaymentDeclined);
  EXPECT_TRUE(recorder->committed.empty());
  EXPECT_TRUE(bus.published().empty()) << "a rolled-back handler's follow-up escaped";
  EXPECT_FALSE(recorder->is_processed("billing", event.id));
  EXPECT_EQ((*handler)(event, bus), HandleResult::processed);
  EXPECT_EQ(recorder->committed.size(), 1u);
  EXPECT_EQ(bus.published().size(), 1u);
}

TEST(TransactionalMode, UndecodablePayloadRollsBack) {
  auto recorder = std::make_shared<TransactionalRecorder>();
  auto handler = idem::make_idempotent_handler<shop::Order>(
      "billing", recorder, [](const shop::Order&) {}, {.mode = HandlerMode::transactional});
  idem::CollectingBusProxy bus;
  const Event event = order_event("{");
  EXPECT_THROW((*handler)(event, bus), idem::DecodeError);
  EXPECT_FALSE(recorder->is_processed("billing", event.id));
}

// ---- CollectingBusProxy -------------------------------------------------------------------

TEST(CollectingBusProxy, KeepsEventsInOrderAndTakeEmptiesIt) {
  idem::CollectingBusProxy bus("audit");
  EXPECT_EQ(bus.consumer(), "audit");
  bus.publish(Event::make("a", "1"));
  bus.publish(Event::make("b", "2"));
  EXPECT_EQ(bus.published().size(), 2u);
  const auto taken = bus.take();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].type, "a");
  EXPECT_EQ(taken[1].type, "b");
  EXPECT_TRUE(bus.published().empty());
}

}  // namespace
