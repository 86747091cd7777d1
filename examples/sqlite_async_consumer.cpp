// A coroutine consumer on SQLite: an AsyncIdempotentHandler delivered from the in-process Bus,
// its handler a coroutine on an io_context, its markers in a SQLite file that a blocking user
// could share.
//
//   example_sqlite_async_consumer [path/to/file.db]     (default: a new temporary file)
//
// A billing consumer receives "order.placed" at least once: each event is published twice and
// the first delivery of one of them fails. Every order is billed exactly once; the second copy
// of each is a duplicate, and the failed delivery is redelivered by the Bus and then billed.
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "idem/async/bus.hpp"
#include "idem/async/handler.hpp"
#include "idem/bus.hpp"
#include "idem/event.hpp"
#include "idem/sqlite/async_recorder.hpp"

int main(int argc, char** argv) {
  const std::string path =
      argc > 1 ? argv[1]
               : (std::filesystem::temp_directory_path() /
                  ("idem-async-consumer-" + idem::new_event_id().substr(0, 8) + ".db"))
                     .string();

  // The event loop the handler's coroutines run on.
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::thread loop([&] { io.run(); });

  auto recorder = std::make_shared<idem::sqlite::AsyncSqliteRecorder>(path);
  std::atomic<int> billed{0};
  std::atomic<bool> failed_once{false};
  auto handler = idem::async::make_async_idempotent_handler(
      "billing", recorder,
      [&](const std::string& order, idem::BusProxy&,
          const idem::Event&) -> idem::async::Task<void> {
        // Stand-in for a call to a payment provider over the network.
        asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::milliseconds(5));
        co_await timer.async_wait(asio::use_awaitable);
        if (order == "order-2" && !failed_once.exchange(true))
          throw std::runtime_error("payment provider timed out");
        ++billed;
        std::cout << "billed " << order << "\n";
      });

  {
    idem::Bus bus(idem::BusOptions{.initial_backoff = std::chrono::milliseconds(1)});
    idem::async::subscribe(bus, "order.placed", handler, io.get_executor());
    for (int copy = 0; copy < 2; ++copy) {
      for (int i = 1; i <= 3; ++i) {
        idem::Event event;
        event.id = "evt-order-" + std::to_string(i);  // the same id on every copy
        event.type = "order.placed";
        event.payload = "order-" + std::to_string(i);
        bus.publish(std::move(event));
      }
    }
    bus.wait_idle();
    const auto stats = bus.stats();
    std::cout << "deliveries acknowledged: " << stats.delivered << " (" << stats.duplicates
              << " duplicates), redeliveries: " << stats.redeliveries << "\n";
  }

  work.reset();
  loop.join();
  std::cout << "orders billed: " << billed.load() << " (markers in " << path << ")\n";
  if (argc <= 1) {
    recorder.reset();
    handler.reset();
    for (const char* suffix : {"", "-wal", "-shm"})
      std::filesystem::remove(path + suffix);
  }
  return billed.load() == 3 ? 0 : 1;
}
