// 10,000 coroutines call one idempotency key on a single-threaded io_context: one executes,
// 9,999 join it suspended. Reports the memory each waiter costs (live heap bytes, counted by a
// replaced operator new/delete, while all wait) and the time from the owner's completion until
// every caller has its result; then, as the baseline of the same run, what as many co_spawned
// coroutines of the same result type cost while each is suspended on one asio timer (asio's own
// floor: the co_spawn entry frame and the coroutine frame), and idem's share (the difference),
// and how long waking them all with one cancel of that timer takes (the floor of the resolve);
// then the cost of a plain (keyless) async call against a blocking call in the same run.
//
//   bench_async_join [--waiters=N] [--calls=N] [--breakdown=1]
#include <malloc.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <string>

#include "bench_flags.hpp"
#include "idem/async/memory_store.hpp"
#include "idem/async/resilient.hpp"
#include "idem/resilient.hpp"

namespace {
std::atomic<long long> g_live{0};
// --breakdown: the requested sizes of the allocations made while the callers start, by size.
constexpr std::size_t kMaxRecorded = 1 << 20;
std::atomic<bool> g_recording{false};
std::atomic<std::size_t> g_recorded{0};
std::size_t g_sizes[kMaxRecorded];
}  // namespace

void* operator new(std::size_t size) {
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  g_live.fetch_add(static_cast<long long>(malloc_usable_size(p)), std::memory_order_relaxed);
  if (g_recording.load(std::memory_order_relaxed)) {
    const std::size_t i = g_recorded.fetch_add(1, std::memory_order_relaxed);
    if (i < kMaxRecorded) g_sizes[i] = size;
  }
  return p;
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  g_live.fetch_sub(static_cast<long long>(malloc_usable_size(p)), std::memory_order_relaxed);
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  operator delete(p);
}

namespace {

using idem::async::Task;
using Clock = std::chrono::steady_clock;

double ns_since(Clock::time_point start, long long n) {
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
         static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string waiters_flag = idem::bench::take_flag(argc, argv, "waiters");
  const std::string calls_flag = idem::bench::take_flag(argc, argv, "calls");
  const bool breakdown = !idem::bench::take_flag(argc, argv, "breakdown").empty();
  const long long callers = waiters_flag.empty() ? 10000 : std::stoll(waiters_flag);
  const long long calls = calls_flag.empty() ? 200000 : std::stoll(calls_flag);

  // ---- joiners ----
  asio::io_context io(1);
  auto memory = std::make_shared<idem::InMemoryIdempotencyStore>();
  auto store = std::make_shared<idem::async::AsyncMemoryStore>(memory);
  asio::steady_timer gate(io, asio::steady_timer::time_point::max());
  std::atomic<int> executions{0};
  auto charge = idem::async::resilient(
      [&](std::string order) -> Task<std::string> {
        ++executions;
        asio::error_code ec;
        co_await gate.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        co_return "receipt-" + order;
      },
      {.name = "charge",
       .idempotency_key = [](const std::string& order) { return order; },
       .idempotency_store = store});
  const std::string stored = idem::scoped_idempotency_key("charge", "o-1");
  auto coordinator = idem::IdempotencyCoordinator::for_store(memory);
  long long joined = 0;
  long long done = 0;
  long long sink_floor = 0;
  const long long before = g_live.load();
  g_recording = breakdown;
  for (long long i = 0; i < callers; ++i) {
    asio::co_spawn(io, charge("o-1"),
                   [&](std::exception_ptr error, idem::OperationResult<std::string> r) {
                     ++done;
                     if (!error && r.report.metadata["idempotency_status"] == "joined") ++joined;
                   });
  }
  // Run until every caller is suspended (the owner on its gate, the others on the owner).
  for (int i = 0;
       i < 100000 && coordinator->waiters(stored) < static_cast<std::size_t>(callers - 1); ++i) {
    io.run_one();
  }
  const long long waiting = static_cast<long long>(coordinator->waiters(stored));
  const long long live = g_live.load() - before;
  g_recording = false;
  const auto resolve_start = Clock::now();
  gate.cancel();
  io.run();
  const double resolve_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - resolve_start).count();
  std::printf("callers=%lld executions=%d joined=%lld done=%lld waiting_at_peak=%lld\n", callers,
              executions.load(), joined, done, waiting);
  std::printf("memory_per_waiter_bytes=%.0f (live heap while all wait / callers)\n",
              static_cast<double>(live) / static_cast<double>(callers));
  std::printf("resolve_all_ms=%.3f\n", resolve_ms);
  if (breakdown) {
    // What each caller allocated on its way to suspension (some of it freed again before the
    // peak): requested size, allocations per caller.
    std::map<std::size_t, long long> by_size;
    const std::size_t n = std::min(g_recorded.load(), kMaxRecorded);
    for (std::size_t i = 0; i < n; ++i)
      ++by_size[g_sizes[i]];
    for (const auto& [size, count] : by_size) {
      if (count * 10 < callers) continue;  // one-offs (the owner, the flight table)
      std::printf("  alloc size=%zu per_caller=%.2f\n", size,
                  static_cast<double>(count) / static_cast<double>(callers));
    }
  }

  // ---- baseline: the same number of co_spawned coroutines, each suspended on a timer ----
  double floor_per_caller = 0;
  double floor_resolve_ms = 0;
  {
    asio::io_context io3(1);
    asio::steady_timer wall(io3, asio::steady_timer::time_point::max());
    long long finished = 0;
    const long long floor_before = g_live.load();
    // Spawned as the callers above are: an awaitable made first, a handler of the same shape.
    auto suspended = [](asio::steady_timer& timer) -> Task<idem::OperationResult<std::string>> {
      asio::error_code ec;
      co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      co_return idem::OperationResult<std::string>{};
    };
    for (long long i = 0; i < callers; ++i) {
      asio::co_spawn(io3, suspended(wall),
                     [&](std::exception_ptr error, idem::OperationResult<std::string> r) {
                       ++finished;
                       if (!error && r.report.metadata.empty()) ++sink_floor;
                     });
    }
    while (io3.poll_one() != 0) {
    }
    floor_per_caller =
        static_cast<double>(g_live.load() - floor_before) / static_cast<double>(callers);
    const auto floor_start = Clock::now();
    wall.cancel();
    io3.run();
    floor_resolve_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - floor_start).count();
  }
  std::printf(
      "baseline_per_coroutine_bytes=%.0f (co_spawned Task<OperationResult<string>> "
      "suspended on a timer)\n",
      floor_per_caller);
  std::printf(
      "baseline_resolve_all_ms=%.3f (the same coroutines woken by one timer's cancel and "
      "completed) ratio_resolve_over_baseline=%.2f\n",
      floor_resolve_ms, resolve_ms / floor_resolve_ms);
  std::printf("idem_per_waiter_bytes=%.0f (memory_per_waiter - baseline)\n",
              static_cast<double>(live) / static_cast<double>(callers) - floor_per_caller);

  // ---- plain call overhead: async vs blocking, keyless ----
  auto async_plain = idem::async::resilient([](int x) -> Task<int> { co_return x + 1; });
  auto blocking_plain = idem::resilient([](int x) { return x + 1; });
  long long sink = 0;
  auto start = Clock::now();
  for (long long i = 0; i < calls; ++i)
    sink += blocking_plain(static_cast<int>(i)).value;
  const double blocking_ns = ns_since(start, calls);
  asio::io_context io2(1);
  start = Clock::now();
  asio::co_spawn(
      io2,
      [&]() -> Task<void> {
        for (long long i = 0; i < calls; ++i)
          sink += (co_await async_plain(static_cast<int>(i))).value;
      },
      asio::detached);
  io2.run();
  const double async_ns = ns_since(start, calls);
  std::printf("plain_call_ns blocking=%.0f async=%.0f ratio_async_over_blocking=%.2f (sink %lld)\n",
              blocking_ns, async_ns, async_ns / blocking_ns, sink % 7);
  return executions.load() == 1 && joined == callers - 1 ? 0 : 1;
}
