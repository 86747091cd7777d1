// The operation face: what resilient() costs over a direct call, replay from the in-memory
// store, and joins on one key from many threads; what an observer (idem::Metrics) adds to a call
// and to a consumer's delivery, and what fingerprinting the arguments adds to a replay.
// Baselines (BM_DirectCall, the unobserved and unfingerprinted twins) run in the same binary, so
// bench/report.py can print differences from one run.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "idem/handler.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/memory_store.hpp"
#include "idem/metrics.hpp"
#include "idem/resilient.hpp"

namespace {

int __attribute__((noinline)) create_payment(const std::string& request_id, int amount) {
  benchmark::DoNotOptimize(request_id.data());
  return amount + 1;
}

void BM_DirectCall(benchmark::State& state) {
  const std::string id = "request-123";
  for (auto _ : state)
    benchmark::DoNotOptimize(create_payment(id, 2499));
}
BENCHMARK(BM_DirectCall);

void BM_ResilientNoPolicies(benchmark::State& state) {
  auto call = idem::resilient(
      [](const std::string& request_id, int amount) { return create_payment(request_id, amount); });
  const std::string id = "request-123";
  for (auto _ : state)
    benchmark::DoNotOptimize(call(id, 2499).value);
}
BENCHMARK(BM_ResilientNoPolicies);

// The same call told to an idem::Metrics: two clock reads, a virtual call, two atomic adds.
void BM_ResilientNoPoliciesObserved(benchmark::State& state) {
  auto call = idem::resilient(
      [](const std::string& request_id, int amount) { return create_payment(request_id, amount); },
      {.observer = std::make_shared<idem::Metrics>()});
  const std::string id = "request-123";
  for (auto _ : state)
    benchmark::DoNotOptimize(call(id, 2499).value);
}
BENCHMARK(BM_ResilientNoPoliciesObserved);

// A call whose key already completed: the replay path (lookup, type check, report copy), its
// arguments fingerprinted (the default).
void BM_ResilientReplay(benchmark::State& state) {
  auto store = std::make_shared<idem::InMemoryIdempotencyStore>();
  auto call = idem::resilient(
      [](const std::string& request_id, int amount) { return create_payment(request_id, amount); },
      {.name = "create_payment",
       .idempotency_key = [](const std::string& id, int) { return "create-payment:" + id; },
       .idempotency_store = store});
  const std::string id = "request-123";
  (void)call(id, 2499);
  for (auto _ : state)
    benchmark::DoNotOptimize(call(id, 2499).value);
}
BENCHMARK(BM_ResilientReplay);

// The same replay without a fingerprint (`idempotency_fingerprint = false`).
void BM_ResilientReplayNoFingerprint(benchmark::State& state) {
  auto store = std::make_shared<idem::InMemoryIdempotencyStore>();
  auto call = idem::resilient(
      [](const std::string& request_id, int amount) { return create_payment(request_id, amount); },
      {.name = "create_payment",
       .idempotency_key = [](const std::string& id, int) { return "create-payment:" + id; },
       .idempotency_store = store,
       .idempotency_fingerprint = false});
  const std::string id = "request-123";
  (void)call(id, 2499);
  for (auto _ : state)
    benchmark::DoNotOptimize(call(id, 2499).value);
}
BENCHMARK(BM_ResilientReplayNoFingerprint);

// A consumer's delivery of an event already processed (check_then_mark: one is_processed, then
// dropped), without and with an observer.
void handler_duplicate(benchmark::State& state, std::shared_ptr<idem::Observer> observer) {
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  auto handler = idem::make_idempotent_handler(
      "billing", recorder, [](const std::string& payload) { benchmark::DoNotOptimize(payload); },
      idem::HandlerOptions{.mode = idem::HandlerMode::check_then_mark,
                           .observer = std::move(observer)});
  idem::CollectingBusProxy bus("billing");
  const idem::Event event = idem::Event::make("order.placed", "o-1");
  (void)(*handler)(event, bus);
  for (auto _ : state)
    benchmark::DoNotOptimize((*handler)(event, bus));
}
void BM_HandlerDuplicate(benchmark::State& state) {
  handler_duplicate(state, nullptr);
}
BENCHMARK(BM_HandlerDuplicate);
void BM_HandlerDuplicateObserved(benchmark::State& state) {
  handler_duplicate(state, std::make_shared<idem::Metrics>());
}
BENCHMARK(BM_HandlerDuplicateObserved);

// Executions with a fresh key each time (claim + execute + complete in the memory store).
void BM_ResilientExecuteNewKey(benchmark::State& state) {
  auto store = std::make_shared<idem::InMemoryIdempotencyStore>();
  auto call = idem::resilient(
      [](const std::string& request_id, int amount) { return create_payment(request_id, amount); },
      {.name = "execute",
       .idempotency_key = [](const std::string& id, int) { return id; },
       .idempotency_store = store});
  std::uint64_t n = 0;
  for (auto _ : state)
    benchmark::DoNotOptimize(call("k" + std::to_string(n++), 2499).value);
}
BENCHMARK(BM_ResilientExecuteNewKey);

// Many threads calling one key whose execution takes ~50 µs: most calls join a run in flight
// (or replay it right after); items/s counts every caller served.
std::shared_ptr<idem::InMemoryIdempotencyStore> g_store;
std::atomic<std::uint64_t> g_round{0};
void BM_ResilientJoinOneKey(benchmark::State& state) {
  if (state.thread_index() == 0) g_store = std::make_shared<idem::InMemoryIdempotencyStore>();
  auto call = idem::resilient(
      [](std::uint64_t) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
        while (std::chrono::steady_clock::now() < until) {
        }
        return 1;
      },
      {.idempotency_key = [](std::uint64_t round) { return "join:" + std::to_string(round); },
       .idempotency_ttl = std::chrono::milliseconds(1),
       .idempotency_store = g_store});
  for (auto _ : state) {
    // Everyone asks for the current round; thread 0 moves to a new round now and then.
    const std::uint64_t round = g_round.load(std::memory_order_relaxed);
    benchmark::DoNotOptimize(call(round).value);
    if (state.thread_index() == 0 && (state.iterations() % 8) == 0) g_round.fetch_add(1);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) g_store.reset();
}
BENCHMARK(BM_ResilientJoinOneKey)->Threads(1)->Threads(8)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
