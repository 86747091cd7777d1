// redis_async_consumer: the Redis recorder and store from coroutines, over one pipelined
// connection.
//
//   * 100 coroutines deliver 20 distinct events (each five times) at once to a handler that
//     claims the event with AsyncRedisRecorder, "ships" it, and completes the claim: every event
//     ships exactly once, and all 100 calls share one connection.
//   * AsyncRedisStore claims an operation key, stores its result, and a second claim replays it.
//   * A blocking RedisIdempotencyRecorder on the same prefix sees the coroutines' markers: both
//     faces use the same keys and scripts.
// Keys go under "example-async:<pid>:", deleted at the end.
//
// Run: ./example_redis_async_consumer redis://127.0.0.1:6379/0   (or set IDEM_REDIS_URL)
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"

using namespace std::chrono_literals;

int main(int argc, char** argv) {
  const char* env = std::getenv("IDEM_REDIS_URL");
  const std::string url = argc > 1 ? argv[1] : env != nullptr ? env : "redis://127.0.0.1:6379/0";
  auto options = idem::redis::RedisOptions::from_url(url);
  options.key_prefix = "example-async:" + std::to_string(::getpid()) + ":";

  asio::io_context io;
  idem::redis::AsyncRedisRecorder recorder(io.get_executor(), options);
  idem::redis::AsyncRedisStore store(io.get_executor(), options);
  std::atomic<int> shipped{0}, duplicates{0}, failed{0};

  for (int delivery = 0; delivery < 100; ++delivery) {
    asio::co_spawn(
        io,
        [&, delivery]() -> idem::async::Task<void> {
          const std::string event = "order-" + std::to_string(delivery % 20);
          const idem::Claim claim = co_await recorder.claim("shipping", event, 30s);
          if (claim.status != idem::Claim::Status::acquired) {
            ++duplicates;  // processed, or another delivery holds it right now
            co_return;
          }
          ++shipped;  // the side effect, once per event
          (void)co_await recorder.complete("shipping", event, claim.token);
        },
        [&](std::exception_ptr e) {
          if (!e) return;
          ++failed;
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& error) {
            std::cerr << "delivery failed: " << error.what() << "\n";
          }
        });
  }

  std::string replayed;
  asio::co_spawn(
      io,
      [&]() -> idem::async::Task<void> {
        const auto first = co_await store.claim("charge-7", std::nullopt, 30s);
        idem::StoredValue receipt;
        receipt.bytes = "receipt #7";
        // Named, not a temporary: GCC 12 may end a temporary's life inside a co_await too early.
        const idem::ExecutionReport report;
        (void)co_await store.complete("charge-7", first.token, receipt, report, 10min);
        const auto again = co_await store.claim("charge-7", std::nullopt, 30s);
        if (again.status == idem::ClaimOutcome::Status::completed && again.record) {
          replayed = again.record->value.bytes.value_or("");
        }
      },
      [&](std::exception_ptr e) {
        if (e) ++failed;
      });
  io.run();

  int status = 0;
  if (failed > 0) {
    std::cerr << "is Redis running at " << url << "?\n";
    status = 3;
  } else {
    std::cout << "shipped " << shipped << " events (" << duplicates
              << " duplicate deliveries skipped) over " << recorder.pool()->stats().connects
              << " connection(s), " << recorder.pool()->stats().writes << " writes for "
              << recorder.pool()->stats().commands << " commands\n";
    std::cout << "replayed: " << replayed << "\n";
    idem::redis::RedisIdempotencyRecorder blocking(options);
    std::cout << "the blocking recorder sees order-3 processed: " << std::boolalpha
              << blocking.is_processed("shipping", "order-3") << "\n";
  }
  try {  // clean up the example's keys
    idem::redis::ConnectionPool pool(options);
    auto connection = pool.lease();
    const auto keys = connection->command({"KEYS", options.key_prefix + "*"});
    for (const auto& key : keys.elements)
      connection->append({"UNLINK", key.str});
    if (connection->pending() > 0) (void)connection->read_replies();
  } catch (const std::exception&) {
  }
  return status;
}
