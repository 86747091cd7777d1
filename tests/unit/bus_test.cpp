#include "idem/bus.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <latch>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "../core_names.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace idem::test::core_names;
using Sleeps = std::vector<std::chrono::nanoseconds>;

struct PaymentDeclined : std::runtime_error {
  PaymentDeclined() : std::runtime_error("payment declined") {}
};

// Dead letters, collected across threads.
class DeadLetterBox {
 public:
  std::function<void(const DeadLetter&)> sink() {
    return [this](const DeadLetter& letter) {
      std::lock_guard lock(mutex_);
      letters_.push_back(letter);
    };
  }
  std::vector<DeadLetter> letters() const {
    std::lock_guard lock(mutex_);
    return letters_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<DeadLetter> letters_;
};

class BusTest : public ::testing::Test {
 protected:
  BusOptions options(BusOptions base = {}) {
    base.clock = clock_;
    base.on_dead_letter = dead_letters_.sink();
    return base;
  }
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>();
  std::shared_ptr<idem::InMemoryIdempotencyRecorder> recorder_ =
      std::make_shared<idem::InMemoryIdempotencyRecorder>(
          idem::InMemoryRecorderOptions{.clock = clock_});
  DeadLetterBox dead_letters_;
};

TEST_F(BusTest, RejectsUnusableOptions) {
  EXPECT_THROW(Bus({.max_attempts = 0}), idem::ConfigError);
  EXPECT_THROW(Bus({.initial_backoff = -1ms}), idem::ConfigError);
  EXPECT_THROW(Bus({.max_backoff = -1ms}), idem::ConfigError);
  EXPECT_THROW(Bus({.backoff_multiplier = 0.5}), idem::ConfigError);
  EXPECT_THROW(Bus({.backoff_multiplier = std::numeric_limits<double>::quiet_NaN()}),
               idem::ConfigError);
  EXPECT_THROW(Bus({.max_in_progress_requeues = -1}), idem::ConfigError);
  EXPECT_THROW(Bus({.worker_threads = 0}), idem::ConfigError);
}

TEST_F(BusTest, RejectsBadSubscriptionsAndEvents) {
  Bus bus(options());
  auto noop = [](const Event&, BusProxy&) {};
  EXPECT_THROW(bus.subscribe("", "billing", noop), idem::InvalidArgument);
  EXPECT_THROW(bus.subscribe("order.created", "", noop), idem::InvalidKey);
  EXPECT_THROW(bus.subscribe("order.created", "billing", nullptr), idem::InvalidArgument);
  EXPECT_THROW(bus.subscribe("order.created", std::shared_ptr<idem::EventHandler>()),
               idem::InvalidArgument);
  bus.subscribe("order.created", "billing", noop);
  EXPECT_THROW(bus.subscribe("order.created", "billing", noop), idem::InvalidArgument)
      << "one consumer name, one subscription per type: they would share markers";
  bus.subscribe("order.paid", "billing", noop);  // another type is fine

  Event no_id = Event::make("order.created", "{}");
  no_id.id = "";
  EXPECT_THROW(bus.publish(no_id), idem::InvalidKey);
  no_id.id = "bad\nid";
  EXPECT_THROW(bus.publish(no_id), idem::InvalidKey);
  EXPECT_THROW(bus.publish(Event::make("", "{}")), idem::InvalidArgument);
  EXPECT_EQ(bus.stats().published, 0u);
}

TEST_F(BusTest, FansOutOneDeliveryPerConsumer) {
  Bus bus(options({.worker_threads = 2}));
  std::atomic<int> billing{0};
  std::atomic<int> shipping{0};
  std::atomic<int> other{0};
  bus.subscribe("order.created", idem::make_idempotent_handler(
                                     "billing", recorder_, [&](const std::string&) { billing++; }));
  bus.subscribe("order.created",
                idem::make_idempotent_handler("shipping", recorder_,
                                              [&](const std::string&) { shipping++; }));
  bus.subscribe("order.cancelled", "audit", [&](const Event&, BusProxy&) { other++; });
  const Event event = Event::make("order.created", "{}");
  bus.publish(event);
  bus.wait_idle();
  EXPECT_EQ(billing.load(), 1);
  EXPECT_EQ(shipping.load(), 1);
  EXPECT_EQ(other.load(), 0);
  EXPECT_TRUE(recorder_->is_processed("billing", event.id));
  EXPECT_TRUE(recorder_->is_processed("shipping", event.id));
  const auto stats = bus.stats();
  EXPECT_EQ(stats.published, 1u);
  EXPECT_EQ(stats.delivered, 2u);
  EXPECT_EQ(stats.duplicates, 0u);
  EXPECT_TRUE(clock_->sleeps().empty()) << "no retry, no wait";
}

TEST_F(BusTest, RedeliveredEventIsDroppedAsDuplicate) {
  Bus bus(options());
  int runs = 0;
  bus.subscribe("order.created", idem::make_idempotent_handler(
                                     "billing", recorder_, [&](const std::string&) { ++runs; }));
  const Event event = Event::make("order.created", "{}");
  for (int i = 0; i < 3; ++i)
    bus.publish(event);  // the same id three times: a redelivering broker
  bus.wait_idle();
  EXPECT_EQ(runs, 1);
  const auto stats = bus.stats();
  EXPECT_EQ(stats.delivered, 3u);
  EXPECT_EQ(stats.duplicates, 2u);
}

TEST_F(BusTest, UnroutedEventsAreCountedAndDropped) {
  Bus bus(options());
  bus.publish(Event::make("nobody.listens", "{}"));
  bus.wait_idle();
  EXPECT_EQ(bus.stats().published, 1u);
  EXPECT_EQ(bus.stats().unrouted, 1u);
}

TEST_F(BusTest, ThrowingHandlerIsRedeliveredWithBackoff) {
  Bus bus(options());
  int runs = 0;
  bus.subscribe("order.created",
                idem::make_idempotent_handler("billing", recorder_, [&](const std::string&) {
                  if (++runs < 3) throw PaymentDeclined();
                }));
  const Event event = Event::make("order.created", "{}");
  bus.publish(event);
  bus.wait_idle();
  EXPECT_EQ(runs, 3);
  EXPECT_TRUE(recorder_->is_processed("billing", event.id));
  EXPECT_EQ(clock_->sleeps(), (Sleeps{10ms, 20ms}));
  const auto stats = bus.stats();
  EXPECT_EQ(stats.redeliveries, 2u);
  EXPECT_EQ(stats.delivered, 1u);
  EXPECT_EQ(stats.dead_lettered, 0u);
  EXPECT_TRUE(dead_letters_.letters().empty());
}

TEST_F(BusTest, GivesUpAfterMaxAttemptsWithADeadLetter) {
  Bus bus(options({.max_attempts = 4}));
  int runs = 0;
  bus.subscribe("order.created",
                idem::make_idempotent_handler("billing", recorder_, [&](const std::string&) {
                  ++runs;
                  throw PaymentDeclined();
                }));
  const Event event = Event::make("order.created", R"({"amount":1})");
  bus.publish(event);
  bus.wait_idle();
  EXPECT_EQ(runs, 4);
  EXPECT_EQ(clock_->sleeps(), (Sleeps{10ms, 20ms, 40ms}));
  const auto letters = dead_letters_.letters();
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].event.id, event.id);
  EXPECT_EQ(letters[0].event.payload, event.payload);
  EXPECT_EQ(letters[0].consumer, "billing");
  EXPECT_EQ(letters[0].attempts, 4);
  EXPECT_EQ(letters[0].reason, "payment declined");
  EXPECT_THROW(std::rethrow_exception(letters[0].error), PaymentDeclined);
  EXPECT_FALSE(recorder_->is_processed("billing", event.id));
  const auto stats = bus.stats();
  EXPECT_EQ(stats.redeliveries, 3u);
  EXPECT_EQ(stats.dead_lettered, 1u);
  EXPECT_EQ(stats.delivered, 0u);
}

TEST_F(BusTest, BackoffIsCappedAtMaxBackoff) {
  Bus bus(options(
      {.max_attempts = 5, .initial_backoff = 400ms, .backoff_multiplier = 2.0, .max_backoff = 1s}));
  bus.subscribe("t", "c", [](const Event&, BusProxy&) { throw PaymentDeclined(); });
  bus.publish(Event::make("t", ""));
  bus.wait_idle();
  EXPECT_EQ(clock_->sleeps(), (Sleeps{400ms, 800ms, 1s, 1s}));
}

TEST_F(BusTest, ZeroBackoffRedeliversWithoutWaiting) {
  Bus bus(options({.max_attempts = 3, .initial_backoff = 0ms}));
  int runs = 0;
  bus.subscribe("t", "c", [&](const Event&, BusProxy&) {
    if (++runs < 3) throw PaymentDeclined();
  });
  bus.publish(Event::make("t", ""));
  bus.wait_idle();
  EXPECT_EQ(runs, 3);
  EXPECT_TRUE(clock_->sleeps().empty());
}

TEST_F(BusTest, AThrowingDeadLetterSinkDoesNotStopTheBus) {
  Bus bus({.max_attempts = 1, .clock = clock_, .on_dead_letter = [](const DeadLetter&) {
             throw std::runtime_error("sink down");
           }});
  int good = 0;
  bus.subscribe("bad", "c", [](const Event&, BusProxy&) { throw PaymentDeclined(); });
  bus.subscribe("good", "c", [&](const Event&, BusProxy&) { ++good; });
  bus.publish(Event::make("bad", ""));
  bus.publish(Event::make("good", ""));
  bus.wait_idle();
  EXPECT_EQ(good, 1);
  EXPECT_EQ(bus.stats().dead_lettered, 1u);
}

thread_local bool t_inside_order_handler = false;

TEST_F(BusTest, PublishFromAHandlerEnqueuesAndWaitIdleCoversFollowUps) {
  Bus bus(options());
  std::vector<std::string> log;
  bool follow_up_ran_on_publishers_stack = false;
  bus.subscribe("order.created", "billing", [&](const Event& event, BusProxy& proxy) {
    t_inside_order_handler = true;
    EXPECT_EQ(proxy.consumer(), "billing");
    proxy.publish(Event::make("payment.requested", event.id));
    log.push_back("order handled");
    t_inside_order_handler = false;
  });
  bus.subscribe("payment.requested", "payments", [&](const Event&, BusProxy& proxy) {
    if (t_inside_order_handler) follow_up_ran_on_publishers_stack = true;
    log.push_back("payment requested");
    // A chain: each follow-up publishes the next, wait_idle waits for all of them.
    proxy.publish(Event::make("payment.done", ""));
  });
  int done = 0;
  bus.subscribe("payment.done", "notify", [&](const Event&, BusProxy&) { ++done; });
  bus.publish(Event::make("order.created", "{}"));
  bus.wait_idle();
  EXPECT_FALSE(follow_up_ran_on_publishers_stack);
  EXPECT_EQ(log, (std::vector<std::string>{"order handled", "payment requested"}));
  EXPECT_EQ(done, 1);
  EXPECT_EQ(bus.stats().published, 3u);
}

TEST_F(BusTest, WaitIdleFromAHandlerIsRefused) {
  Bus bus(options());
  bool refused = false;
  bus.subscribe("t", "c", [&](const Event&, BusProxy&) {
    try {
      bus.wait_idle();
    } catch (const idem::InvalidArgument&) {
      refused = true;
    }
  });
  bus.publish(Event::make("t", ""));
  bus.wait_idle();
  EXPECT_TRUE(refused);
}

// Throws AlreadyInProgress `times` times, then succeeds.
class BusyHandler : public idem::EventHandler {
 public:
  explicit BusyHandler(int times) : times_(times) {}
  const std::string& consumer() const noexcept override { return consumer_; }
  HandleResult operator()(const Event&, BusProxy&) override {
    if (calls_++ < times_) throw idem::AlreadyInProgress("held elsewhere");
    return HandleResult::processed;
  }
  int calls() const { return calls_; }

 private:
  std::string consumer_ = "billing";
  int times_;
  int calls_ = 0;
};

TEST_F(BusTest, InProgressRequeuesDoNotCountAsAttempts) {
  Bus bus(options({.max_attempts = 1}));
  auto handler = std::make_shared<BusyHandler>(10);
  bus.subscribe("t", handler);
  bus.publish(Event::make("t", ""));
  bus.wait_idle();
  EXPECT_EQ(handler->calls(), 11);
  const auto stats = bus.stats();
  EXPECT_EQ(stats.in_progress_requeued, 10u);
  EXPECT_EQ(stats.redeliveries, 0u);
  EXPECT_EQ(stats.delivered, 1u);
  EXPECT_EQ(stats.dead_lettered, 0u);
  // The same backoff schedule, capped.
  const auto sleeps = clock_->sleeps();
  ASSERT_EQ(sleeps.size(), 10u);
  EXPECT_EQ(sleeps[0], 10ms);
  EXPECT_EQ(sleeps[6], 640ms);
  EXPECT_EQ(sleeps[9], 1s);
}

TEST_F(BusTest, InProgressRequeuesAreBounded) {
  Bus bus(options({.max_in_progress_requeues = 3}));
  auto handler = std::make_shared<BusyHandler>(1'000'000);
  bus.subscribe("t", handler);
  bus.publish(Event::make("t", ""));
  bus.wait_idle();
  EXPECT_EQ(handler->calls(), 4);
  const auto letters = dead_letters_.letters();
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].attempts, 0) << "no failed attempt, only requeues";
  EXPECT_THROW(std::rethrow_exception(letters[0].error), idem::AlreadyInProgress);
  EXPECT_EQ(bus.stats().in_progress_requeued, 3u);
}

// Wraps a handler and reports each AlreadyInProgress it sees.
class InProgressProbe : public idem::EventHandler {
 public:
  explicit InProgressProbe(std::shared_ptr<idem::EventHandler> inner) : inner_(std::move(inner)) {}
  const std::string& consumer() const noexcept override { return inner_->consumer(); }
  HandleResult operator()(const Event& event, BusProxy& bus) override {
    try {
      return (*inner_)(event, bus);
    } catch (const idem::AlreadyInProgress&) {
      {
        std::lock_guard lock(mutex_);
        ++seen_;
      }
      cv_.notify_all();
      throw;
    }
  }
  void wait_for_in_progress() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return seen_ > 0; });
  }

 private:
  std::shared_ptr<idem::EventHandler> inner_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int seen_ = 0;
};

TEST_F(BusTest, ConcurrentDuplicateIsRequeuedThenDropped) {
  Bus bus(options({.worker_threads = 2}));
  std::latch entered(1);
  std::latch finish(1);
  std::atomic<int> runs{0};
  auto probe = std::make_shared<InProgressProbe>(idem::make_idempotent_handler(
      "billing", recorder_,
      [&](const std::string&) {
        runs++;
        entered.count_down();
        finish.wait();
      },
      // Requeue backoff moves the ManualClock; a long lease keeps it from expiring meanwhile.
      {.mode = idem::HandlerMode::exclusive, .lease = std::chrono::hours(1000)}));
  bus.subscribe("order.created", probe);
  const Event event = Event::make("order.created", "{}");
  bus.publish(event);
  entered.wait();
  bus.publish(event);  // the broker redelivers while the first delivery still runs
  probe->wait_for_in_progress();
  finish.count_down();
  bus.wait_idle();
  EXPECT_EQ(runs.load(), 1);
  const auto stats = bus.stats();
  EXPECT_GE(stats.in_progress_requeued, 1u);
  EXPECT_EQ(stats.delivered, 2u);
  EXPECT_EQ(stats.duplicates, 1u);
  EXPECT_EQ(stats.dead_lettered, 0u);
}

TEST_F(BusTest, ManyWorkersManyEventsEachHandledOnce) {
  constexpr int kEvents = 2'000;
  Bus bus(options({.worker_threads = 4}));
  std::vector<std::atomic<int>> effects(kEvents);
  bus.subscribe(
      "n", idem::make_idempotent_handler<int>(
               "counter", recorder_, [&](const int& i) { effects[static_cast<std::size_t>(i)]++; },
               {.lease = std::chrono::hours(1000)}));
  std::vector<Event> events;
  for (int i = 0; i < kEvents; ++i)
    events.push_back(Event::make("n", std::to_string(i)));
  for (const auto& e : events)
    bus.publish(e);
  for (const auto& e : events)
    bus.publish(e);  // every event delivered twice
  bus.wait_idle();
  for (int i = 0; i < kEvents; ++i)
    ASSERT_EQ(effects[static_cast<std::size_t>(i)].load(), 1) << i;
  const auto stats = bus.stats();
  EXPECT_EQ(stats.delivered, 2u * kEvents);
  EXPECT_EQ(stats.duplicates, static_cast<std::uint64_t>(kEvents));
  EXPECT_EQ(stats.dead_lettered, 0u);
}

TEST_F(BusTest, SubscriptionsApplyToLaterEvents) {
  Bus bus(options());
  std::atomic<int> late{0};
  bus.subscribe("t", "early", [](const Event&, BusProxy&) {});
  bus.publish(Event::make("t", ""));
  bus.wait_idle();
  bus.subscribe("t", "late", [&](const Event&, BusProxy&) { late++; });
  bus.publish(Event::make("t", ""));
  bus.wait_idle();
  EXPECT_EQ(late.load(), 1);
}

TEST(BusShutdown, DestructionDropsWaitingRetriesWithoutWaitingThemOut) {
  // The real clock and a ten-minute backoff: the destructor must interrupt the wait, not sit it
  // out (a hang here fails the test by its ctest timeout).
  std::latch failed(1);
  {
    Bus bus({.initial_backoff = std::chrono::minutes(10)});
    bus.subscribe("t", "c", [&](const Event&, BusProxy&) {
      failed.count_down();
      throw PaymentDeclined();
    });
    bus.publish(Event::make("t", ""));
    failed.wait();
  }
  SUCCEED();
}

}  // namespace
