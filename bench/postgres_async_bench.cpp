// The PostgreSQL async face against the blocking face, both with 50 calls in flight, measured in
// the same run, with the ratio printed.
//
//   mark+check     mark_processed then is_processed of a new event, per call
//   claim+complete the store's claim of a new key, then complete (value and report; nobody
//                  waits, so no NOTIFY)
//   claim          the store's claim of a new key alone
//
// blocking: 50 threads share one PostgresIdempotencyRecorder / PostgresIdempotencyStore with the
//           default pool (pool_size 8).
// async:    50 coroutines on ONE thread share one AsyncPostgresRecorder / AsyncPostgresStore
//           with the default pool (pool_size 8), statements pipelined on its connections.
//
//   bench_postgres_async [--seconds=S] [--inflight=N]
//
// The server: IDEM_BENCH_POSTGRES_URL, else IDEM_TEST_POSTGRES_URL (scripts/servers.sh sets it).
// Tables live in schema IDEM_BENCH_POSTGRES_SCHEMA (default idem_bench_async), left in place.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_flags.hpp"
#include "idem/postgres/async_postgres.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using idem::async::Task;

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

idem::postgres::PostgresOptions options() {
  idem::postgres::PostgresOptions o;
  o.url = env_or("IDEM_BENCH_POSTGRES_URL", env_or("IDEM_TEST_POSTGRES_URL", ""));
  o.schema = env_or("IDEM_BENCH_POSTGRES_SCHEMA", "idem_bench_async");
  return o;
}

// A prefix no earlier run used, so every event is new.
std::string run_prefix() {
  std::random_device random;
  return std::to_string(random()) + "-";
}

struct Figure {
  long calls = 0;
  double seconds = 0;
  double per_second() const { return static_cast<double>(calls) / seconds; }
};

// `inflight` threads call `one(thread, i)` until `seconds` passed.
Figure blocking_run(int inflight, double seconds, const std::function<void(int, long)>& one) {
  std::atomic<long> calls{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int t = 0; t < inflight; ++t) {
    threads.emplace_back([&, t] {
      for (long i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        one(t, i);
        calls.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& thread : threads)
    thread.join();
  return Figure{calls.load(), std::chrono::duration<double>(Clock::now() - start).count()};
}

// `inflight` coroutines on one thread's io_context call `one(coroutine, i)` until `seconds`.
Figure async_run(asio::io_context& io, int inflight, double seconds,
                 const std::function<Task<void>(int, long)>& one) {
  std::atomic<long> calls{0};
  const auto start = Clock::now();
  const auto until =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (int c = 0; c < inflight; ++c) {
    asio::co_spawn(
        io,
        [&, c]() -> Task<void> {
          for (long i = 0; Clock::now() < until; ++i) {
            co_await one(c, i);
            calls.fetch_add(1, std::memory_order_relaxed);
          }
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
  }
  io.restart();
  io.run();
  return Figure{calls.load(), std::chrono::duration<double>(Clock::now() - start).count()};
}

void report(const char* what, const Figure& blocking, const Figure& async) {
  std::printf("%-16s blocking %9.0f calls/s   async %9.0f calls/s   async/blocking %.2fx\n", what,
              blocking.per_second(), async.per_second(),
              async.per_second() / blocking.per_second());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string seconds_flag = idem::bench::take_flag(argc, argv, "seconds");
  const std::string inflight_flag = idem::bench::take_flag(argc, argv, "inflight");
  const double seconds = seconds_flag.empty() ? 5.0 : std::stod(seconds_flag);
  const int inflight = inflight_flag.empty() ? 50 : std::stoi(inflight_flag);
  if (options().url.empty()) {
    std::fprintf(stderr, "set IDEM_BENCH_POSTGRES_URL or IDEM_TEST_POSTGRES_URL\n");
    return 2;
  }
  std::printf("%d calls in flight, %.1f s per figure, default pool (pool_size %zu)\n", inflight,
              seconds, options().pool_size);

  asio::io_context io;
  idem::postgres::PostgresIdempotencyRecorder recorder(options());
  idem::postgres::PostgresIdempotencyStore store(options());
  auto pool = std::make_shared<idem::postgres::AsyncConnectionPool>(io.get_executor(), options());
  idem::postgres::AsyncPostgresRecorder async_recorder(pool);
  idem::postgres::AsyncPostgresStore async_store(pool);

  const std::string prefix = run_prefix();
  const auto id = [&](const char* face, int who, long i) {
    return prefix + face + std::to_string(who) + "-" + std::to_string(i);
  };
  idem::StoredValue value;
  value.bytes = std::string(64, 'v');
  idem::ExecutionReport result_report;
  result_report.operation = "bench";

  const Figure blocking_marks = blocking_run(inflight, seconds, [&](int t, long i) {
    const std::string event = id("b", t, i);
    recorder.mark_processed("bench", event);
    (void)recorder.is_processed("bench", event);
  });
  const Figure async_marks = async_run(io, inflight, seconds, [&](int c, long i) -> Task<void> {
    const std::string event = id("a", c, i);
    co_await async_recorder.mark_processed("bench", event);
    (void)co_await async_recorder.is_processed("bench", event);
  });
  report("mark+check", blocking_marks, async_marks);

  const Figure blocking_store = blocking_run(inflight, seconds, [&](int t, long i) {
    const std::string key = id("sb", t, i);
    const auto outcome = store.claim(key, std::nullopt, std::chrono::seconds(30));
    (void)store.complete(key, outcome.token, value, result_report, std::chrono::hours(1));
  });
  const Figure async_store_figure =
      async_run(io, inflight, seconds, [&](int c, long i) -> Task<void> {
        const std::string key = id("sa", c, i);
        const auto outcome =
            co_await async_store.claim(key, std::nullopt, std::chrono::seconds(30));
        (void)co_await async_store.complete(key, outcome.token, value, result_report,
                                            std::chrono::hours(1));
      });
  report("claim+complete", blocking_store, async_store_figure);

  // The claim alone: one statement per call, as a baseline for the pair above.
  const Figure blocking_claims = blocking_run(inflight, seconds, [&](int t, long i) {
    (void)store.claim(id("cb", t, i), std::nullopt, std::chrono::seconds(30));
  });
  const Figure async_claims = async_run(io, inflight, seconds, [&](int c, long i) -> Task<void> {
    const std::string key = id("ca", c, i);
    (void)co_await async_store.claim(key, std::nullopt, std::chrono::seconds(30));
  });
  report("claim", blocking_claims, async_claims);
  std::printf("async pool: %zu connections, %llu sessions opened\n", pool->stats().connections,
              static_cast<unsigned long long>(pool->stats().connects));
  return 0;
}
