// Check+mark pairs on the in-memory recorder: the consumer face's hot path, one unseen event per
// iteration (is_processed → false, then mark_processed), on a recorder that already holds 1 M
// markers, for ids of every shape (32 hex digits, dashed UUID, short text, 255-byte text), the
// recorder sized for every id it will hold (InMemoryRecorderOptions::expected_markers). The
// baseline in the same binary is what a hand-written dedup set costs: std::unordered_set of
// std::string, reserved for every id it will hold, on the same ids (bench/report.py prints the
// ratios).
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "bench_ids.hpp"
#include "idem/event.hpp"
#include "idem/memory_recorder.hpp"
#include "recorder_window.hpp"

namespace {

using idem::bench::IdShape;
using idem::bench::ShapedIds;

constexpr std::int64_t kPrefill = 1'000'000;     // markers held before the timed loop
constexpr std::int64_t kIterations = 1'000'000;  // fresh ids in the timed loop, all threads
constexpr std::uint64_t kPrefillStream = 1'000'000;

IdShape shape_of(const benchmark::State& state) {
  return static_cast<IdShape>(state.range(0));
}

std::shared_ptr<idem::InMemoryIdempotencyRecorder> g_recorder;

void BM_MemoryRecorder_CheckMark(benchmark::State& state) {
  const IdShape shape = shape_of(state);
  if (state.thread_index() == 0) {
    ::malloc_trim(0);  // as for the reference set below
    // Sized for every id it will hold, as the reference set is reserved.
    g_recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>(idem::InMemoryRecorderOptions{
        .expected_markers = static_cast<std::size_t>(kPrefill + kIterations)});
    ShapedIds old(shape, kPrefillStream);
    for (std::int64_t i = 0; i < kPrefill; ++i)
      g_recorder->mark_processed("billing", old.next());
    state.SetLabel(idem::bench::shape_name(shape));
  }
  // Google Benchmark starts the timed loop only when every thread is here, after the prefill.
  ShapedIds ids(shape, static_cast<std::uint64_t>(state.thread_index()) + 1);
  for (auto _ : state) {
    const std::string_view id = ids.next();
    if (!g_recorder->is_processed("billing", id)) g_recorder->mark_processed("billing", id);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) g_recorder.reset();
}
// Both runs end with the same 2 M markers in the same tables: two threads share the fresh ids
// (half each), so the ratio of the two is what a second thread adds, not a bigger table's cost.
BENCHMARK(BM_MemoryRecorder_CheckMark)
    ->ArgName("shape")
    ->DenseRange(0, 3)
    ->Iterations(kIterations)
    ->Threads(1)
    ->UseRealTime();
BENCHMARK(BM_MemoryRecorder_CheckMark)
    ->ArgName("shape")
    ->DenseRange(0, 3)
    ->Iterations(kIterations / 2)
    ->Threads(2)
    ->UseRealTime();

// The reference: a std::unordered_set<std::string> reserved for every id it will hold, checked
// with find() and filled with insert() of the owned string, single-threaded (it has no locking).
void BM_UnorderedSet_CheckMark(benchmark::State& state) {
  const IdShape shape = shape_of(state);
  // Start from memory the process has not used yet, as the recorder does (its arena is mapped
  // afresh): else the strings reuse the heap that the benchmark before (in random order) freed.
  ::malloc_trim(0);
  std::unordered_set<std::string> set;
  set.reserve(static_cast<std::size_t>(kPrefill + kIterations));
  ShapedIds old(shape, kPrefillStream);
  for (std::int64_t i = 0; i < kPrefill; ++i)
    set.insert(std::string(old.next()));
  state.SetLabel(idem::bench::shape_name(shape));
  ShapedIds ids(shape, 1);
  for (auto _ : state) {
    std::string id(ids.next());
    if (set.find(id) == set.end()) set.insert(std::move(id));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_UnorderedSet_CheckMark)
    ->ArgName("shape")
    ->DenseRange(0, 3)
    ->Iterations(kIterations)
    ->UseRealTime();

// A repeat delivery: the event is already processed, only is_processed runs. The recorder holds
// 1 M markers; the checks cycle over the 1024 marked last (recent events are what redeliveries
// repeat).
void BM_MemoryRecorder_CheckProcessed(benchmark::State& state) {
  const IdShape shape = shape_of(state);
  idem::InMemoryIdempotencyRecorder recorder;
  ShapedIds old(shape, kPrefillStream);
  std::vector<std::string> recent;
  for (std::int64_t i = 0; i < kPrefill; ++i) {
    const std::string_view id = old.next();
    recorder.mark_processed("billing", id);
    if (i >= kPrefill - 1024) recent.emplace_back(id);
  }
  state.SetLabel(idem::bench::shape_name(shape));
  std::size_t next = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(recorder.is_processed("billing", recent[next]));
    next = (next + 1) & 1023;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MemoryRecorder_CheckProcessed)->ArgName("shape")->DenseRange(0, 3);

// A window of 64 fresh events: one check and one mark per event (batch:0) or one
// is_processed_many and one mark_processed_many for the window (batch:1).
void BM_MemoryRecorder_CheckMarkWindow(benchmark::State& state) {
  idem::InMemoryIdempotencyRecorder recorder;
  idem::bench::IdSequence ids(1);
  idem::bench::check_mark_window(state, recorder, "billing", ids, state.range(0) != 0);
}
BENCHMARK(BM_MemoryRecorder_CheckMarkWindow)->Arg(0)->Arg(1)->ArgName("batch");

// What moving one cache line between two cores costs on this machine, the bound of the 2-thread
// rows: two threads take turns incrementing one counter, each spinning until the other's
// increment arrives, so one iteration is one round trip of the line (as many iterations on
// each thread; the counter ends even, so thread 0 starts every run).
std::atomic<std::uint64_t> g_turn{0};
void BM_CacheLineRoundTrip(benchmark::State& state) {
  const auto me = static_cast<std::uint64_t>(state.thread_index());
  for (auto _ : state) {
    while (g_turn.load(std::memory_order_acquire) % 2 != me) {
    }
    g_turn.fetch_add(1, std::memory_order_acq_rel);
  }
}
BENCHMARK(BM_CacheLineRoundTrip)->Iterations(1'000'000)->Threads(2)->UseRealTime();

void BM_NewEventId(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(idem::new_event_id());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_NewEventId);

}  // namespace

BENCHMARK_MAIN();
