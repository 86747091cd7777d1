// AsyncIdempotentHandler over the in-memory recorder: the three modes' guarantees, batches,
// cancellation mid-handle, many coroutines on one io_context and on two threads, and delivery
// from the in-process Bus.
#include "../async_test_support.hpp"
#include "../core_names.hpp"
#include "idem/async/handler.hpp"

#include <gtest/gtest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/async/bus.hpp"
#include "idem/async/memory_recorder.hpp"
#include "idem/bus.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace idem::test::core_names;
using idem::async::AsyncMemoryRecorder;
using idem::async::Task;

struct PaymentDeclined : std::runtime_error {
  PaymentDeclined() : std::runtime_error("payment declined") {}
};

Event make_event(std::string id, std::string payload = "{}") {
  Event e;
  e.id = std::move(id);
  e.type = "order.placed";
  e.payload = std::move(payload);
  return e;
}

using idem::test::run;

// Counts side effects per event id; can fail the first N runs, or wait on a timer.
class Counting {
 public:
  int runs(const std::string& id) {
    std::lock_guard lock(mutex_);
    return runs_[id];
  }
  int total() {
    std::lock_guard lock(mutex_);
    int n = 0;
    for (auto& [id, r] : runs_)
      n += r;
    return n;
  }
  void add(const std::string& id) {
    std::lock_guard lock(mutex_);
    ++runs_[id];
  }

  std::atomic<int> fail_first{0};
  std::atomic<bool> started{false};
  idem::Millis pause{0};

 private:
  std::mutex mutex_;
  std::map<std::string, int> runs_;
};

std::shared_ptr<idem::async::AsyncEventHandler> counting_handler(
    std::shared_ptr<idem::async::AsyncRecorder> recorder, std::shared_ptr<Counting> counts,
    HandlerMode mode, idem::Millis lease = 30s) {
  return idem::async::make_async_idempotent_handler(
      "billing", std::move(recorder),
      [counts](const std::string&, BusProxy& bus, const Event& event) -> Task<void> {
        counts->started = true;
        if (counts->pause > 0ms) {
          asio::steady_timer timer(co_await asio::this_coro::executor, counts->pause);
          co_await timer.async_wait(asio::use_awaitable);
        }
        if (counts->fail_first.fetch_sub(1) > 0) throw PaymentDeclined();
        counts->add(event.id);
        Event follow = make_event("f-" + event.id);
        bus.publish(std::move(follow));
      },
      HandlerOptions{.mode = mode, .lease = lease});
}

// An in-memory recorder on a ManualClock, its coroutine face, and an event to handle.
struct OnManualClock {
  std::shared_ptr<idem::testing::ManualClock> clock =
      std::make_shared<idem::testing::ManualClock>();
  std::shared_ptr<idem::InMemoryIdempotencyRecorder> memory =
      std::make_shared<idem::InMemoryIdempotencyRecorder>(
          idem::InMemoryRecorderOptions{.clock = clock});
  std::shared_ptr<AsyncMemoryRecorder> recorder = std::make_shared<AsyncMemoryRecorder>(memory);
  const Event e = make_event(idem::new_event_id());
};

// A counting handler in `mode` on a fresh in-memory recorder, the bus it publishes to, and the
// io_context to run it on (declared first: it outlives what runs on it).
struct CountingSetup {
  explicit CountingSetup(HandlerMode mode) : handler(counting_handler(recorder, counts, mode)) {}

  asio::io_context io;
  std::shared_ptr<AsyncMemoryRecorder> recorder = std::make_shared<AsyncMemoryRecorder>();
  std::shared_ptr<Counting> counts = std::make_shared<Counting>();
  std::shared_ptr<idem::async::AsyncEventHandler> handler;
  CollectingBusProxy bus{"billing"};
};

// One event's handle by a counting handler that waits inside handle until it is cancelled:
// started on `io` with a cancellation slot on `cancel`, and polled until handle runs (bounded:
// a test checks counts->started).
struct PausedHandle : CountingSetup {
  explicit PausedHandle(HandlerMode mode) : CountingSetup(mode) {
    counts->pause = 10min;
    call = asio::co_spawn(io, handler->handle_event(e, bus),
                          asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
    for (int i = 0; i < 1000 && !counts->started; ++i)
      io.poll_one();
  }

  const Event e = make_event(idem::new_event_id());
  asio::cancellation_signal cancel;
  std::future<HandleResult> call;
};

class AsyncHandlerModes : public ::testing::TestWithParam<HandlerMode> {};

TEST_P(AsyncHandlerModes, RunsOnceAndFailureMarksNothing) {
  asio::io_context io;
  auto memory = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  auto recorder = std::make_shared<AsyncMemoryRecorder>(memory);
  auto counts = std::make_shared<Counting>();
  auto handler = counting_handler(recorder, counts, GetParam());
  CollectingBusProxy bus("billing");
  const Event e = make_event(idem::new_event_id());

  counts->fail_first = 1;
  EXPECT_THROW(run(io, handler->handle_event(e, bus)), PaymentDeclined);
  EXPECT_FALSE(memory->is_processed("billing", e.id)) << "a failed delivery was marked";
  EXPECT_TRUE(memory->claim("billing", e.id, 1min).status == idem::Claim::Status::acquired)
      << "a failed delivery left its claim";

  // Redeliveries: the first runs, the rest are duplicates.
  auto fresh = std::make_shared<AsyncMemoryRecorder>();
  auto handler2 = counting_handler(fresh, counts, GetParam());
  EXPECT_EQ(run(io, handler2->handle_event(e, bus)), HandleResult::processed);
  EXPECT_EQ(run(io, handler2->handle_event(e, bus)), HandleResult::duplicate);
  EXPECT_EQ(run(io, handler2->handle_event(e, bus)), HandleResult::duplicate);
  EXPECT_EQ(counts->runs(e.id), 1);
  EXPECT_TRUE(fresh->blocking()->is_processed("billing", e.id));
  EXPECT_EQ(bus.published().size(), 1u) << "the follow-up event of the one run";
}

TEST_P(AsyncHandlerModes, CancelledMidHandleIsNotMarkedAndReleased) {
  PausedHandle paused(GetParam());
  ASSERT_TRUE(paused.counts->started);
  paused.cancel.emit(asio::cancellation_type::terminal);
  paused.io.run();
  try {
    paused.call.get();
    FAIL() << "a cancelled handle completed";
  } catch (const std::system_error& err) {
    EXPECT_EQ(err.code(), asio::error::operation_aborted);
  }
  auto& memory = *paused.recorder->blocking();
  const Event& e = paused.e;
  EXPECT_FALSE(memory.is_processed("billing", e.id));
  EXPECT_FALSE(memory.inspect("billing", e.id).claim.has_value()) << "the claim was not released";
  // The redelivery runs.
  paused.counts->pause = 0ms;
  EXPECT_EQ(run(paused.io, paused.handler->handle_event(e, paused.bus)), HandleResult::processed);
  EXPECT_EQ(paused.counts->runs(e.id), 1);
}

TEST_P(AsyncHandlerModes, ManyCoroutinesOnOneLoopRunEachEventOnce) {
  asio::io_context io;
  auto recorder = std::make_shared<AsyncMemoryRecorder>();
  auto counts = std::make_shared<Counting>();
  counts->pause = 1ms;  // every handle suspends, so deliveries interleave
  auto handler = counting_handler(recorder, counts, GetParam());
  CollectingBusProxy bus("billing");
  std::vector<Event> events;
  for (int i = 0; i < 100; ++i)
    events.push_back(make_event(idem::new_event_id()));
  std::atomic<int> in_progress{0};
  std::atomic<int> errors{0};
  // Every event delivered three times, all at once.
  for (int copy = 0; copy < 3; ++copy) {
    for (const auto& e : events) {
      asio::co_spawn(io, handler->handle_event(e, bus), [&](std::exception_ptr err, HandleResult) {
        if (!err) return;
        try {
          std::rethrow_exception(err);
        } catch (const idem::AlreadyInProgress&) {
          in_progress.fetch_add(1);
        } catch (...) {
          errors.fetch_add(1);
        }
      });
    }
  }
  io.run();
  EXPECT_EQ(errors.load(), 0);
  if (GetParam() == HandlerMode::exclusive) {
    // Exclusive: a concurrent duplicate is refused, never run twice.
    for (const auto& e : events)
      EXPECT_EQ(counts->runs(e.id), 1) << e.id;
    EXPECT_EQ(in_progress.load(), 200);
  } else {
    // check_then_mark's documented window: concurrent duplicates may all run; every event ran.
    for (const auto& e : events)
      EXPECT_GE(counts->runs(e.id), 1) << e.id;
  }
  for (const auto& e : events)
    EXPECT_TRUE(recorder->blocking()->is_processed("billing", e.id));
}

TEST_P(AsyncHandlerModes, TwoThreadLoop) {
  asio::io_context io(2);
  auto recorder = std::make_shared<AsyncMemoryRecorder>();
  auto counts = std::make_shared<Counting>();
  auto handler = counting_handler(recorder, counts, GetParam());
  CollectingBusProxy bus("billing");
  std::vector<Event> events;
  for (int i = 0; i < 200; ++i)
    events.push_back(make_event(idem::new_event_id()));
  // Delivers every event on two threads at once; returns how many deliveries ended as `wanted`.
  auto deliver_all = [&](HandleResult wanted) {
    std::atomic<int> ended_as_wanted{0};
    for (const auto& e : events) {
      asio::co_spawn(io, handler->handle_event(e, bus),
                     [&](std::exception_ptr err, HandleResult r) {
                       if (!err && r == wanted) ended_as_wanted.fetch_add(1);
                     });
    }
    idem::test::run_on_two_threads(io);
    return ended_as_wanted.load();
  };
  EXPECT_EQ(deliver_all(HandleResult::processed), 200);
  EXPECT_EQ(counts->total(), 200);
  // Redelivered on two threads: all duplicates.
  EXPECT_EQ(deliver_all(HandleResult::duplicate), 200);
  EXPECT_EQ(counts->total(), 200);
}

INSTANTIATE_TEST_SUITE_P(Modes, AsyncHandlerModes,
                         ::testing::Values(HandlerMode::check_then_mark, HandlerMode::exclusive),
                         [](const auto& param_info) {
                           return std::string(idem::to_string(param_info.param));
                         });

TEST(AsyncHandler, ExclusiveConcurrentDuplicateIsInProgress) {
  PausedHandle first(HandlerMode::exclusive);
  ASSERT_TRUE(first.counts->started);
  auto& io = first.io;
  auto second =
      asio::co_spawn(io, first.handler->handle_event(first.e, first.bus), asio::use_future);
  for (int i = 0; i < 100 && second.wait_for(0s) != std::future_status::ready; ++i)
    io.poll_one();
  EXPECT_THROW(second.get(), idem::AlreadyInProgress);
  first.cancel.emit(asio::cancellation_type::terminal);
  io.run();
  EXPECT_THROW(first.call.get(), std::system_error);
}

TEST(AsyncHandler, ExclusiveRenewsTheLeaseWhileHandleRuns) {
  asio::io_context io;
  auto memory = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  auto recorder = std::make_shared<AsyncMemoryRecorder>(memory);
  auto counts = std::make_shared<Counting>();
  const Event e = make_event(idem::new_event_id());
  std::vector<idem::Claim::Status> seen;
  // handle runs for several leases; a competitor probing the claim meanwhile must find it held.
  auto handler = idem::async::make_async_idempotent_handler(
      "billing", recorder,
      [&](const std::string&, BusProxy&, const Event& event) -> Task<void> {
        asio::steady_timer timer(co_await asio::this_coro::executor);
        for (int i = 0; i < 6; ++i) {
          timer.expires_after(100ms);
          co_await timer.async_wait(asio::use_awaitable);
          seen.push_back(memory->claim("billing", event.id, 1min).status);
        }
      },
      HandlerOptions{.mode = HandlerMode::exclusive, .lease = 150ms});
  CollectingBusProxy bus("billing");
  EXPECT_EQ(run(io, handler->handle_event(e, bus)), HandleResult::processed);
  ASSERT_EQ(seen.size(), 6u);
  for (auto status : seen)
    EXPECT_EQ(status, idem::Claim::Status::in_progress) << "the lease lapsed while handle ran";
  EXPECT_TRUE(memory->is_processed("billing", e.id));
}

TEST(AsyncHandler, ExclusiveRenewsOnTheInjectedClock) {
  asio::io_context io;
  OnManualClock on;
  int renewals = 0;
  // handle moves the clock a third of the lease at a time: each move makes a renewal due (no real
  // time needed); after two leases of the clock the claim is still held.
  auto handler = idem::async::make_async_idempotent_handler(
      "billing", on.recorder,
      [&](const std::string&, BusProxy&, const Event& event) -> Task<void> {
        asio::steady_timer timer(co_await asio::this_coro::executor);
        for (int i = 0; i < 6; ++i) {
          const idem::WallTime before = on.memory->inspect("billing", event.id).claim->lease_until;
          on.clock->advance(20s);
          const auto give_up = std::chrono::steady_clock::now() + 10s;
          while (on.memory->inspect("billing", event.id).claim->lease_until == before &&
                 std::chrono::steady_clock::now() < give_up) {
            timer.expires_after(1ms);
            co_await timer.async_wait(asio::use_awaitable);
          }
          if (on.memory->inspect("billing", event.id).claim->lease_until ==
              on.clock->wall_now() + 60s) {
            ++renewals;
          }
        }
        EXPECT_EQ(on.memory->claim("billing", event.id, 1min).status,
                  idem::Claim::Status::in_progress);
      },
      HandlerOptions{.mode = HandlerMode::exclusive, .lease = 60s, .clock = on.clock});
  CollectingBusProxy bus("billing");
  EXPECT_EQ(run(io, handler->handle_event(on.e, bus)), HandleResult::processed);
  EXPECT_EQ(renewals, 6);
  EXPECT_TRUE(on.memory->is_processed("billing", on.e.id));
}

TEST(AsyncHandler, ExclusiveTakenOverIsLeaseLost) {
  asio::io_context io;
  OnManualClock on;
  auto handler = idem::async::make_async_idempotent_handler(
      "billing", on.recorder,
      [&](const std::string&, BusProxy&, const Event& event) -> Task<void> {
        on.clock->advance(2min);  // the 1 min lease lapses; another delivery takes over
        EXPECT_EQ(on.memory->claim("billing", event.id, 1min).status,
                  idem::Claim::Status::acquired);
        co_return;
      },
      HandlerOptions{.mode = HandlerMode::exclusive, .lease = 1min});
  CollectingBusProxy bus("billing");
  EXPECT_THROW(run(io, handler->handle_event(on.e, bus)), idem::LeaseLost);
  EXPECT_FALSE(on.memory->is_processed("billing", on.e.id));
}

TEST(AsyncHandler, ConstructionChecks) {
  auto recorder = std::make_shared<AsyncMemoryRecorder>();
  auto fn = [](const std::string&) -> Task<void> { co_return; };
  EXPECT_THROW(idem::async::make_async_idempotent_handler("", recorder, fn), idem::InvalidKey);
  EXPECT_THROW(idem::async::make_async_idempotent_handler("billing", nullptr, fn),
               idem::InvalidArgument);
  EXPECT_THROW(idem::async::make_async_idempotent_handler(
                   "billing", recorder, fn, HandlerOptions{.mode = HandlerMode::transactional}),
               idem::NotSupported);
  EXPECT_THROW(
      idem::async::make_async_idempotent_handler(
          "billing", recorder, fn, HandlerOptions{.mode = HandlerMode::exclusive, .lease = 0ms}),
      idem::ConfigError);
  idem::async::AsyncIdempotentHandler<std::string>* typed = nullptr;
  (void)typed;
  auto automatic =
      std::make_shared<idem::async::detail::AsyncFunctionHandler<std::string, decltype(fn)>>(
          "billing", recorder, fn, HandlerOptions{});
  EXPECT_EQ(automatic->mode(), HandlerMode::exclusive) << "automatic picks claims when offered";
  asio::io_context io;
  CollectingBusProxy bus("billing");
  const Event bad = make_event("bad\nid");
  EXPECT_THROW(run(io, automatic->handle_event(bad, bus)), idem::InvalidKey);
}

TEST(AsyncHandler, BatchChecksAndMarksTheWindowOnce) {
  CountingSetup setup(HandlerMode::check_then_mark);
  auto& [io, recorder, counts, handler, bus] = setup;
  const std::string a = idem::new_event_id(), b = idem::new_event_id(), c = idem::new_event_id();
  recorder->blocking()->mark_processed("billing", c);
  std::vector<Event> window{make_event(a), make_event(b), make_event(a), make_event(c),
                            make_event("bad\nid")};
  counts->fail_first = 0;
  auto outcomes = run(io, handler->handle_batch(window, bus));
  ASSERT_EQ(outcomes.size(), 5u);
  EXPECT_EQ(outcomes[0].result, HandleResult::processed);
  EXPECT_EQ(outcomes[1].result, HandleResult::processed);
  EXPECT_EQ(outcomes[2].result, HandleResult::duplicate) << "a repeat within the window";
  EXPECT_EQ(outcomes[3].result, HandleResult::duplicate);
  EXPECT_TRUE(outcomes[4].error != nullptr);
  EXPECT_EQ(counts->runs(a), 1);
  EXPECT_EQ(counts->runs(b), 1);
  EXPECT_EQ(counts->runs(c), 0);
  // A failing event in a window: only it stays unmarked.
  const std::string d = idem::new_event_id(), f = idem::new_event_id();
  std::vector<Event> second{make_event(d), make_event(f)};
  counts->fail_first = 1;
  outcomes = run(io, handler->handle_batch(second, bus));
  EXPECT_TRUE(outcomes[0].error != nullptr);
  EXPECT_EQ(outcomes[1].result, HandleResult::processed);
  EXPECT_FALSE(recorder->blocking()->is_processed("billing", d));
  EXPECT_TRUE(recorder->blocking()->is_processed("billing", f));
}

TEST(AsyncHandler, ExclusiveBatchRunsEachEvent) {
  CountingSetup setup(HandlerMode::exclusive);
  auto& [io, recorder, counts, handler, bus] = setup;
  const std::string a = idem::new_event_id();
  std::vector<Event> window{make_event(a), make_event(a)};
  auto outcomes = run(io, handler->handle_batch(window, bus));
  EXPECT_EQ(outcomes[0].result, HandleResult::processed);
  EXPECT_EQ(outcomes[1].result, HandleResult::duplicate);
  EXPECT_EQ(counts->runs(a), 1);
}

// ---- the Bus ------------------------------------------------------------------------------

TEST(AsyncHandlerOnBus, DeliveriesRunOnTheExecutorAndRedeliveriesRunOnce) {
  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::thread::id loop_id;
  std::thread loop([&] {
    loop_id = std::this_thread::get_id();
    io.run();
  });
  auto recorder = std::make_shared<AsyncMemoryRecorder>();
  auto counts = std::make_shared<Counting>();
  std::atomic<int> off_loop{0};
  std::atomic<int> fail_first{2};
  auto handler = idem::async::make_async_idempotent_handler(
      "billing", recorder, [&](const std::string&, BusProxy&, const Event& event) -> Task<void> {
        if (std::this_thread::get_id() != loop_id) off_loop.fetch_add(1);
        asio::steady_timer timer(co_await asio::this_coro::executor, 1ms);
        co_await timer.async_wait(asio::use_awaitable);
        if (std::this_thread::get_id() != loop_id) off_loop.fetch_add(1);
        if (fail_first.fetch_sub(1) > 0) throw PaymentDeclined();
        counts->add(event.id);
      });
  {
    idem::Bus bus(idem::BusOptions{.initial_backoff = 0ms, .worker_threads = 2});
    idem::async::subscribe(bus, "order.placed", handler, io.get_executor());
    std::vector<std::string> ids;
    for (int i = 0; i < 20; ++i)
      ids.push_back(idem::new_event_id());
    for (int copy = 0; copy < 2; ++copy) {
      for (const auto& id : ids)
        bus.publish(make_event(id));
    }
    bus.wait_idle();
    for (const auto& id : ids)
      EXPECT_EQ(counts->runs(id), 1) << id;
    const auto stats = bus.stats();
    EXPECT_EQ(stats.dead_lettered, 0u);
    EXPECT_GE(stats.redeliveries, 2u) << "a failed coroutine is redelivered like a blocking one";
  }
  EXPECT_EQ(off_loop.load(), 0) << "a delivery ran off the executor";
  guard.reset();
  loop.join();
}

}  // namespace
