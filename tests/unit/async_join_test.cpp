// idem::async::resilient with an idempotency key: joiners suspend on the owner's execution, a
// joiner's cancellation (its slot, or || with a timer) detaches only that joiner, blocking and
// coroutine callers of one key and store join one execution, failures are not cached, successes
// replay for their TTL.
#include <gtest/gtest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "../async_names.hpp"
#include "../async_test_support.hpp"
#include "../cancelled_after.hpp"
#include "../thrown_by.hpp"
#include "idem/async/memory_store.hpp"
#include "idem/async/resilient.hpp"
#include "idem/memory_store.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace idem::test::async_names;

// A "charge" keyed by its order on `stores`' coroutine face: each execution counts itself in
// `calls` and takes `takes` before it returns "receipt-<order>".
auto counted_charge(Stores& stores, std::atomic<int>& calls, std::chrono::milliseconds takes) {
  return idem::async::resilient(
      [&calls, takes](std::string order) -> Task<std::string> {
        ++calls;
        co_await nap(takes);
        co_return "receipt-" + order;
      },
      {.name = "charge",
       .idempotency_key = [](const std::string& order) { return order; },
       .idempotency_store = stores.async});
}

TEST(AsyncJoin, OneOwnerManyCoroutineJoinersOneExecution) {
  asio::io_context io;
  Stores stores;
  std::atomic<int> calls{0};
  auto charge = counted_charge(stores, calls, 30ms);
  std::vector<std::future<idem::OperationResult<std::string>>> results;
  for (int i = 0; i < 20; ++i) {
    results.push_back(asio::co_spawn(io, charge("o-1"), asio::use_future));
  }
  io.run();
  std::map<std::string, int> statuses;
  for (auto& result : results) {
    auto r = result.get();
    EXPECT_EQ(r.value, "receipt-o-1");
    ++statuses[status_of(r.report)];
  }
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(statuses["executed"], 1);
  EXPECT_EQ(statuses["joined"], 19);
  // Afterwards: replayed from the store.
  EXPECT_EQ(status_of(run(io, charge("o-1")).report), "replayed");
  EXPECT_EQ(calls.load(), 1);
}

TEST(AsyncJoin, JoinerCancellationDetachesOnlyThatJoiner) {
  asio::io_context io;
  Stores stores;
  std::atomic<int> calls{0};
  auto charge = counted_charge(stores, calls, 60ms);
  auto owner = asio::co_spawn(io, charge("o-2"), asio::use_future);
  asio::cancellation_signal cancel;
  auto quitter = asio::co_spawn(io, charge("o-2"),
                                asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
  auto patient = asio::co_spawn(io, charge("o-2"), asio::use_future);
  asio::steady_timer later(io, 10ms);
  later.async_wait([&](asio::error_code) { cancel.emit(asio::cancellation_type::terminal); });
  io.run();
  EXPECT_THROW(quitter.get(), idem::Cancelled);
  EXPECT_EQ(status_of(owner.get().report), "executed");
  auto joined = patient.get();
  EXPECT_EQ(joined.value, "receipt-o-2");
  EXPECT_EQ(status_of(joined.report), "joined");
  EXPECT_EQ(calls.load(), 1);
}

TEST(AsyncJoin, JoinersRacingATimerLeaveOneByOneAndTheRestStillJoin) {
  // Every other joiner gives up after 10 ms (asio's || with a timer cancels its call); the
  // others, listed before and after them, still get the owner's result, and the flight ends
  // with nobody left waiting.
  using namespace asio::experimental::awaitable_operators;
  asio::io_context io;
  Stores stores;
  std::atomic<int> calls{0};
  auto charge = counted_charge(stores, calls, 60ms);
  auto impatient = [&]() -> Task<bool> {
    asio::steady_timer timer(co_await asio::this_coro::executor, 10ms);
    try {
      auto which = co_await (charge("o-9") || timer.async_wait(asio::use_awaitable));
      co_return which.index() == 0;
    } catch (const idem::Cancelled&) {
      co_return false;
    }
  };
  auto owner = asio::co_spawn(io, charge("o-9"), asio::use_future);
  std::vector<std::future<bool>> quitters;
  std::vector<std::future<idem::OperationResult<std::string>>> patient;
  for (int i = 0; i < 8; ++i) {
    quitters.push_back(asio::co_spawn(io, impatient(), asio::use_future));
    patient.push_back(asio::co_spawn(io, charge("o-9"), asio::use_future));
  }
  io.run();
  for (auto& quitter : quitters)
    EXPECT_FALSE(quitter.get());
  for (auto& joiner : patient) {
    auto r = joiner.get();
    EXPECT_EQ(r.value, "receipt-o-9");
    EXPECT_EQ(status_of(r.report), "joined");
  }
  EXPECT_EQ(status_of(owner.get().report), "executed");
  EXPECT_EQ(calls.load(), 1);
  auto coordinator = idem::IdempotencyCoordinator::for_store(stores.memory);
  EXPECT_EQ(coordinator->waiters(idem::scoped_idempotency_key("charge", "o-9")), 0u);
}

TEST(AsyncJoin, BlockingOwnerAndCoroutineJoinerShareOneExecution) {
  Stores stores;
  std::atomic<int> calls{0};
  std::promise<void> gate;
  auto gate_future = gate.get_future().share();
  auto blocking = idem::resilient(
      [&](const std::string& order) {
        ++calls;
        gate_future.wait();
        return "receipt-" + order;
      },
      {.name = "charge",
       .idempotency_key = [](const std::string& order) { return order; },
       .idempotency_store = stores.memory});
  auto async = idem::async::resilient(
      [&](std::string order) -> Task<std::string> {
        ++calls;
        co_return "async-" + order;
      },
      {.name = "charge",
       .idempotency_key = [](const std::string& order) { return order; },
       .idempotency_store = stores.async});
  const std::string stored = idem::scoped_idempotency_key("charge", "o-3");
  auto coordinator = idem::IdempotencyCoordinator::for_store(stores.memory);

  std::thread owner([&] { EXPECT_EQ(blocking("o-3").value, "receipt-o-3"); });
  while (calls.load() == 0)
    std::this_thread::yield();  // the owner is executing
  asio::io_context io;
  auto joined = asio::co_spawn(io, async("o-3"), asio::use_future);
  // The coroutine suspends; the io_context thread is free (a bounded poll of the table).
  for (int i = 0; i < 1000 && coordinator->waiters(stored) == 0; ++i)
    io.run_for(1ms);
  EXPECT_EQ(coordinator->waiters(stored), 1u);
  gate.set_value();
  io.restart();
  io.run();
  owner.join();
  auto r = joined.get();
  EXPECT_EQ(r.value, "receipt-o-3");
  EXPECT_EQ(status_of(r.report), "joined");
  EXPECT_EQ(calls.load(), 1);
}

TEST(AsyncJoin, CoroutineOwnerAndBlockingJoinerShareOneExecution) {
  Stores stores;
  std::atomic<int> calls{0};
  const std::string stored = idem::scoped_idempotency_key("charge", "o-4");
  auto coordinator = idem::IdempotencyCoordinator::for_store(stores.memory);
  auto async = idem::async::resilient(
      [&](std::string order) -> Task<std::string> {
        ++calls;
        // Hold the execution until the blocking caller waits on it (bounded).
        for (int i = 0; i < 2000 && coordinator->waiters(stored) == 0; ++i)
          co_await nap(1ms);
        co_return "async-" + order;
      },
      {.name = "charge",
       .idempotency_key = [](const std::string& order) { return order; },
       .idempotency_store = stores.async});
  auto blocking = idem::resilient(
      [&](const std::string& order) {
        ++calls;
        return "blocking-" + order;
      },
      {.name = "charge",
       .idempotency_key = [](const std::string& order) { return order; },
       .idempotency_store = stores.memory});
  asio::io_context io;
  auto owner = asio::co_spawn(io, async("o-4"), asio::use_future);
  std::thread io_thread([&] { io.run(); });
  while (calls.load() == 0)
    std::this_thread::yield();
  auto r = blocking("o-4");
  io_thread.join();
  EXPECT_EQ(r.value, "async-o-4");
  EXPECT_EQ(status_of(r.report), "joined");
  EXPECT_EQ(status_of(owner.get().report), "executed");
  EXPECT_EQ(calls.load(), 1);
}

TEST(AsyncJoin, FailuresAreNotCachedAndJoinersShareThem) {
  asio::io_context io;
  Stores stores;
  std::atomic<int> calls{0};
  auto op = idem::async::resilient(
      [&](std::string order) -> Task<int> {
        const int n = ++calls;
        co_await nap(10ms);
        if (n == 1) throw std::runtime_error("declined " + order);
        co_return n;
      },
      {.name = "op",
       .idempotency_key = [](const std::string& order) { return order; },
       .idempotency_store = stores.async});
  auto first = asio::co_spawn(io, op("o-5"), asio::use_future);
  auto joiner = asio::co_spawn(io, op("o-5"), asio::use_future);
  io.run();
  EXPECT_THROW(first.get(), idem::OperationError);
  EXPECT_THROW(joiner.get(), idem::OperationError);
  EXPECT_EQ(calls.load(), 1);
  auto again = run(io, op("o-5"));
  EXPECT_EQ(again.value, 2);
  EXPECT_EQ(status_of(again.report), "executed");
}

TEST(AsyncJoin, SuccessReplaysForItsTtlThenRunsAgain) {
  asio::io_context io;
  auto clock = std::make_shared<idem::testing::ManualClock>();
  auto memory =
      std::make_shared<idem::InMemoryIdempotencyStore>(idem::InMemoryStoreOptions{.clock = clock});
  auto store = std::make_shared<idem::async::AsyncMemoryStore>(memory);
  int calls = 0;
  auto op = idem::async::resilient([&](std::string) -> Task<int> { co_return ++calls; },
                                   {.name = "ttl",
                                    .idempotency_key = [](const std::string& k) { return k; },
                                    .idempotency_ttl = idem::Millis(1000),
                                    .idempotency_store = store});
  EXPECT_EQ(run(io, op("k")).value, 1);
  auto replay = run(io, op("k"));
  EXPECT_EQ(replay.value, 1);
  EXPECT_EQ(status_of(replay.report), "replayed");
  clock->advance(2s);
  EXPECT_EQ(run(io, op("k")).value, 2);
}

TEST(AsyncJoin, CancelledOwnerReleasesItsClaimSoTheNextCallerExecutes) {
  asio::io_context io;
  Stores stores;
  std::atomic<int> calls{0};
  auto op = idem::async::resilient(
      [&](std::string) -> Task<int> {
        const int n = ++calls;
        if (n == 1) co_await nap(5s);
        co_return n;
      },
      {.name = "op",
       .idempotency_key = [](const std::string& k) { return k; },
       .idempotency_store = stores.async});
  const auto error = idem::test::operation_error_cancelled_after(io, op("k"), 10ms);
  ASSERT_TRUE(error) << "expected a cancelled OperationError";
  EXPECT_EQ(error->report().status, idem::OperationStatus::cancelled);
  EXPECT_FALSE(stores.memory->lookup(idem::scoped_idempotency_key("op", "k")).has_value());
  auto next = run(io, op("k"));
  EXPECT_EQ(next.value, 2);
  EXPECT_EQ(status_of(next.report), "executed");
}

TEST(AsyncJoin, FingerprintMismatchIsKeyReuse) {
  asio::io_context io;
  Stores stores;
  auto op = idem::async::resilient([](std::string, int cents) -> Task<int> { co_return cents; },
                                   {.name = "pay",
                                    .idempotency_key = [](const std::string& k, int) { return k; },
                                    .idempotency_store = stores.async,
                                    .idempotency_fingerprint = true});
  EXPECT_EQ(run(io, op("k", 5)).value, 5);
  EXPECT_THROW(run(io, op("k", 6)), idem::KeyReuseError);
}

TEST(AsyncJoin, AJoinerWithOtherArgumentsIsRefusedByDefault) {
  asio::io_context io;
  Stores stores;
  // The owner waits on a gate the test opens (cancels) at the end.
  auto gate = std::make_shared<asio::steady_timer>(io, asio::steady_timer::time_point::max());
  auto op = idem::async::resilient(
      [gate](std::string, int cents) -> Task<int> {
        try {
          co_await gate->async_wait(asio::use_awaitable);
        } catch (const std::system_error&) {
        }
        co_return cents;
      },
      {.name = "pay",
       .idempotency_key = [](const std::string& k, int) { return k; },
       .idempotency_store = stores.async});
  std::optional<int> owner;
  asio::co_spawn(io, op("k", 5), [&](std::exception_ptr e, idem::OperationResult<int> r) {
    if (!e) owner = r.value;
  });
  io.poll();  // the owner claims the key and waits at the gate
  std::exception_ptr refused;
  bool joiner_done = false;
  asio::co_spawn(io, op("k", 6), [&](std::exception_ptr e, idem::OperationResult<int>) {
    refused = e;
    joiner_done = true;
  });
  while (!joiner_done)
    io.poll_one();
  ASSERT_TRUE(refused);
  try {
    std::rethrow_exception(refused);
  } catch (const idem::KeyReuseError& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.key(), "k");
    EXPECT_NE(message.find("operation 'pay': idempotency key 'k' is being executed with different "
                           "arguments"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("claim token "), std::string::npos) << message;
  } catch (...) {
    ADD_FAILURE() << "expected KeyReuseError";
  }
  idem::test::keep_exception(refused);
  gate->cancel();
  io.restart();
  io.run();
  EXPECT_EQ(owner, 5);
}

TEST(AsyncJoin, KeyHeldByAnotherProcessRejectsOrWaits) {
  asio::io_context io;
  Stores stores;
  const std::string stored = idem::scoped_idempotency_key("op", "k");
  auto other = stores.memory->claim(stored, std::nullopt, idem::Millis(60000));
  ASSERT_EQ(other.status, idem::ClaimOutcome::Status::acquired);
  int calls = 0;
  auto reject = idem::async::resilient([&](std::string) -> Task<int> { co_return ++calls; },
                                       {.name = "op",
                                        .idempotency_key = [](const std::string& k) { return k; },
                                        .idempotency_store = stores.async,
                                        .idempotency_in_progress = idem::InProgressPolicy::reject});
  EXPECT_THROW(run(io, reject("k")), idem::AlreadyInProgress);
  auto wait = idem::async::resilient([&](std::string) -> Task<int> { co_return ++calls; },
                                     {.name = "op",
                                      .idempotency_key = [](const std::string& k) { return k; },
                                      .idempotency_store = stores.async,
                                      .idempotency_max_wait = idem::Millis(30)});
  EXPECT_THROW(run(io, wait("k")), idem::AlreadyInProgress);
  // The other process lets go while we wait: then we execute.
  asio::steady_timer later(io, 20ms);
  later.async_wait([&](asio::error_code) { (void)stores.memory->release(stored, other.token); });
  auto patient = idem::async::resilient([&](std::string) -> Task<int> { co_return ++calls; },
                                        {.name = "op",
                                         .idempotency_key = [](const std::string& k) { return k; },
                                         .idempotency_store = stores.async,
                                         .idempotency_max_wait = idem::Millis(5000)});
  auto r = run(io, patient("k"));
  EXPECT_EQ(r.value, 1);
  EXPECT_EQ(status_of(r.report), "executed");
}

// An AsyncStore with no blocking twin: coroutine callers still join in this process. It keeps
// the clock time of each renewal.
class OpaqueStore final : public idem::async::AsyncStore {
 public:
  explicit OpaqueStore(std::shared_ptr<idem::Clock> clock = idem::system_clock())
      : memory(idem::InMemoryStoreOptions{.clock = clock}), clock_(std::move(clock)) {}

  idem::InMemoryIdempotencyStore memory;
  std::vector<idem::WallTime> renewed_at;  // the test's io thread only

 private:
  bool do_needs_bytes() const noexcept override { return false; }
  Task<idem::ClaimOutcome> do_claim(std::string_view key, std::optional<std::string_view> fp,
                                    idem::Millis lease) override {
    co_return memory.claim(key, fp, lease);
  }
  Task<bool> do_complete(std::string_view key, std::uint64_t token, idem::StoredValue value,
                         const idem::ExecutionReport& report, idem::Millis ttl) override {
    co_return memory.complete(key, token, std::move(value), report, ttl);
  }
  Task<bool> do_release(std::string_view key, std::uint64_t token) override {
    co_return memory.release(key, token);
  }
  Task<bool> do_renew(std::string_view key, std::uint64_t token, idem::Millis lease) override {
    renewed_at.push_back(clock_->wall_now());
    co_return memory.renew(key, token, lease);
  }
  Task<std::optional<idem::IdempotencyRecord>> do_lookup(std::string_view key) override {
    co_return memory.lookup(key);
  }

  std::shared_ptr<idem::Clock> clock_;
};

TEST(AsyncJoin, StoreWithoutABlockingTwinStillJoinsInProcess) {
  asio::io_context io;
  auto store = std::make_shared<OpaqueStore>();
  std::atomic<int> calls{0};
  auto op = idem::async::resilient(
      [&](std::string) -> Task<int> {
        ++calls;
        co_await nap(20ms);
        co_return 9;
      },
      {.name = "op",
       .idempotency_key = [](const std::string& k) { return k; },
       .idempotency_store = store,
       .idempotency_lease = idem::Millis(30)});  // renewed on timers while it runs
  std::vector<std::future<idem::OperationResult<int>>> results;
  for (int i = 0; i < 5; ++i)
    results.push_back(asio::co_spawn(io, op("k"), asio::use_future));
  io.run();
  for (auto& r : results)
    EXPECT_EQ(r.get().value, 9);
  EXPECT_EQ(calls.load(), 1);
}

// The owner's lease is renewed on the operation's clock, as the blocking coordinator's is: each
// move of a ManualClock by a third of the lease makes one renewal due, without real time.
TEST(AsyncJoin, AnOwnersLeaseIsRenewedOnTheOperationsClock) {
  asio::io_context io;
  auto clock = std::make_shared<idem::testing::ManualClock>();
  auto store = std::make_shared<OpaqueStore>(clock);
  const idem::WallTime start = clock->wall_now();
  auto op = idem::async::resilient(
      [&](std::string) -> Task<int> {
        asio::steady_timer timer(co_await asio::this_coro::executor);
        for (std::size_t i = 1; i <= 6; ++i) {
          clock->advance(20s);
          const auto give_up = std::chrono::steady_clock::now() + 10s;
          while (store->renewed_at.size() < i && std::chrono::steady_clock::now() < give_up) {
            timer.expires_after(1ms);
            co_await timer.async_wait(asio::use_awaitable);
          }
        }
        co_return 7;
      },
      {.name = "op",
       .idempotency_key = [](const std::string& k) { return k; },
       .idempotency_store = store,
       .idempotency_lease = 60s,
       .clock = clock});
  EXPECT_EQ(run(io, op("k")).value, 7);
  ASSERT_EQ(store->renewed_at.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i)
    EXPECT_EQ(store->renewed_at[i] - start, std::chrono::seconds(20 * (i + 1)));
}

TEST(AsyncJoin, MultiThreadedIoContextOneExecutionPerKey) {
  asio::io_context io(4);
  Stores stores;
  std::atomic<int> calls{0};
  auto op = idem::async::resilient(
      [&](std::string key) -> Task<std::string> {
        ++calls;
        co_await nap(5ms);
        co_return "v-" + key;
      },
      {.name = "mt",
       .idempotency_key = [](const std::string& k) { return k; },
       .idempotency_store = stores.async});
  std::vector<std::future<idem::OperationResult<std::string>>> results;
  for (int i = 0; i < 200; ++i) {
    results.push_back(asio::co_spawn(io, op("k" + std::to_string(i % 10)), asio::use_future));
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] { io.run(); });
  for (auto& thread : threads)
    thread.join();
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(results[i].get().value, "v-k" + std::to_string(i % 10));
  }
  EXPECT_EQ(calls.load(), 10);  // later callers of a finished key replay it
}

}  // namespace
