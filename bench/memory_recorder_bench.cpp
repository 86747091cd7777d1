// Check+mark pairs on the in-memory recorder: the consumer face's hot path, one unseen event per
// iteration (is_processed → false, then mark_processed).
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "bench_ids.hpp"
#include "idem/event.hpp"
#include "idem/memory_recorder.hpp"
#include "recorder_window.hpp"

namespace {

std::shared_ptr<idem::InMemoryIdempotencyRecorder> g_recorder;

void BM_MemoryRecorder_CheckMark(benchmark::State& state) {
  if (state.thread_index() == 0) g_recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  // Google Benchmark starts the timed loop only when every thread is here, after the reset.
  idem::bench::IdSequence ids(static_cast<std::uint64_t>(state.thread_index()) + 1);
  for (auto _ : state) {
    const std::string_view id = ids.next();
    if (!g_recorder->is_processed("billing", id)) g_recorder->mark_processed("billing", id);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) g_recorder.reset();
}
BENCHMARK(BM_MemoryRecorder_CheckMark)->Threads(1)->Threads(2)->UseRealTime();

// A window of 64 fresh events: one check and one mark per event (batch:0) or one
// is_processed_many and one mark_processed_many for the window (batch:1).
void BM_MemoryRecorder_CheckMarkWindow(benchmark::State& state) {
  idem::InMemoryIdempotencyRecorder recorder;
  idem::bench::IdSequence ids(1);
  idem::bench::check_mark_window(state, recorder, "billing", ids, state.range(0) != 0);
}
BENCHMARK(BM_MemoryRecorder_CheckMarkWindow)->Arg(0)->Arg(1)->ArgName("batch");

// A repeat delivery: the event is already processed, only is_processed runs.
void BM_MemoryRecorder_CheckProcessed(benchmark::State& state) {
  idem::InMemoryIdempotencyRecorder recorder;
  const std::string id = idem::new_event_id();
  recorder.mark_processed("billing", id);
  for (auto _ : state)
    benchmark::DoNotOptimize(recorder.is_processed("billing", id));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MemoryRecorder_CheckProcessed);

void BM_NewEventId(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(idem::new_event_id());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_NewEventId);

}  // namespace

BENCHMARK_MAIN();
