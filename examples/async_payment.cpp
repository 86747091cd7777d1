// async_payment: an Asio service that charges orders through a payment API with coroutines,
// idempotently.
//
// The simulated gateway answers after a network delay (a timer, so no thread waits), fails now
// and then and once hangs. Each charge is an idem::async::operation with retries and a
// per-attempt timeout that cancels a hung request, keyed by the order id: the client's
// duplicate submissions of one order — here three coroutines racing, and a blocking worker thread
// of the same service — are charged once. A later resubmission replays the stored receipt.
//
// Any async store you write can be checked with the conformance suites (idem::testing_async):
//   INSTANTIATE_ASYNC_STORE_CONFORMANCE(MyAsyncStore, MyAsyncStoreFactory);
//       // idem/testing/async_store_conformance.hpp
//   INSTANTIATE_STORE_CONFORMANCE(MyAsyncStoreAsBlocking, MyBlockingOverAsyncFactory);
//       // idem/testing/store_conformance.hpp through idem/testing/blocking_over_async.hpp
//
// Run: ./example_async_payment

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "idem/async/memory_store.hpp"
#include "idem/async/operation.hpp"
#include "idem/memory_store.hpp"
#include "idem/resilient.hpp"

using namespace std::chrono_literals;
using idem::async::Task;

struct Receipt {
  std::string id;
  int cents = 0;
};

// The remote side: misbehaves on purpose, by request number.
class Gateway {
 public:
  Task<Receipt> charge(const std::string& order, int cents) {
    const int n = ++requests_;
    asio::steady_timer network(co_await asio::this_coro::executor, n == 1 ? 10s : 20ms);
    co_await network.async_wait(asio::use_awaitable);  // request 1 hangs: the timeout cancels it
    if (n == 2) throw std::runtime_error("502 Bad Gateway");
    ++charges_;
    co_return Receipt{"rcpt-" + order + "-" + std::to_string(n), cents};
  }
  int requests() const { return requests_; }
  int charges() const { return charges_; }

 private:
  std::atomic<int> requests_{0};
  std::atomic<int> charges_{0};
};

int main() {
  Gateway gateway;
  // One store object for both faces: the coroutines and the blocking worker share a coordinator.
  auto memory = std::make_shared<idem::InMemoryIdempotencyStore>();
  auto store = std::make_shared<idem::async::AsyncMemoryStore>(memory);
  auto by_order = [](const std::string& order, int) { return order; };

  // The builder (idem::async::operation): each with_*() returns a new, checked operation.
  const auto charge = idem::async::operation("charge",
                                             [&](std::string order, int cents) -> Task<Receipt> {
                                               co_return co_await gateway.charge(order, cents);
                                             })
                          .with_retry({.max_attempts = 4, .backoff = {.base = 10ms, .cap = 100ms}})
                          .with_timeout(200ms)
                          .with_idempotency({.key = by_order, .store = store});

  asio::io_context io;
  auto submit = [&](const char* who) -> Task<void> {
    try {
      auto result = co_await charge.run("order-42", 2499);
      std::cout << who << ": " << result.value.id << " ("
                << result.report.metadata["idempotency_status"] << ", "
                << result.report.attempts.size() << " attempt(s))\n";
    } catch (const idem::OperationError& e) {
      std::cout << who << ": failed: " << e.what() << "\n";
    }
  };
  for (const char* who : {"web", "retrying client", "mobile app"}) {
    asio::co_spawn(io, submit(who), asio::detached);
  }

  // A blocking worker of the same service submits the same order while the coroutines run.
  auto blocking_charge = idem::resilient(
      [](const std::string&, int) -> Receipt {
        throw std::logic_error("not reached: the order is already being charged");
      },
      {.name = "charge", .idempotency_key = by_order, .idempotency_store = memory});
  std::thread worker([&] {
    std::this_thread::sleep_for(50ms);
    try {
      auto result = blocking_charge("order-42", 2499);
      std::cout << "worker thread: " << result.value.id << " ("
                << result.report.metadata["idempotency_status"] << ")\n";
    } catch (const std::exception& e) {
      std::cout << "worker thread: " << e.what() << "\n";
    }
  });
  io.run();
  worker.join();

  // A resubmission later replays the stored receipt.
  asio::co_spawn(io, submit("resubmission"), asio::detached);
  io.restart();
  io.run();
  std::cout << "gateway requests: " << gateway.requests() << ", charges: " << gateway.charges()
            << "\n";
  return gateway.charges() == 1 ? 0 : 1;
}
