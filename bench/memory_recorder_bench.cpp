// Check+mark pairs on the in-memory recorder: the consumer face's hot path, one unseen event per
// iteration (is_processed → false, then mark_processed), on a recorder that already holds 1 M
// markers, for ids of every shape (32 hex digits, dashed UUID, short text, 255-byte text, 26-byte
// text), the recorder sized for every id it will hold (InMemoryRecorderOptions::expected_markers).
// The baseline in the same binary is what a hand-written dedup set costs: std::unordered_set of
// std::string, reserved for every id it will hold, on the same ids (bench/report.py prints the
// ratios).
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <atomic>
#include <chrono>
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

// Two threads take turns incrementing one counter, each spinning until the other's increment
// arrives, `rounds` times each, so the counter's cache line moves between their cores twice a
// round. Returns the nanoseconds one move took. The counter ends even, so thread 0 always
// starts.
std::atomic<std::uint64_t> g_turn{0};
void take_turn(std::uint64_t me) {
  while (g_turn.load(std::memory_order_acquire) % 2 != me) {
  }
  g_turn.fetch_add(1, std::memory_order_acq_rel);
}
double ping_pong(std::uint64_t me, int rounds) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i)
    take_turn(me);
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
             .count() /
         (2.0 * rounds);
}

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
  if (state.threads() == 2) {
    // What a cache line takes between the two cores right now: the host moves its virtual CPUs,
    // and the second thread's gain depends on it (bench/report.py groups the runs by it).
    state.counters["handover_ns"] =
        benchmark::Counter(ping_pong(static_cast<std::uint64_t>(state.thread_index()), 20'000),
                           benchmark::Counter::kAvgThreads);
  }
  if (state.thread_index() == 0) g_recorder.reset();
}
// Both runs end with the same 2 M markers in the same tables: two threads share the fresh ids
// (half each), so the ratio of the two is what a second thread adds, not a bigger table's cost.
BENCHMARK(BM_MemoryRecorder_CheckMark)
    ->ArgName("shape")
    ->DenseRange(0, idem::bench::kIdShapes - 1)
    ->Iterations(kIterations)
    ->Threads(1)
    ->UseRealTime();
BENCHMARK(BM_MemoryRecorder_CheckMark)
    ->ArgName("shape")
    ->DenseRange(0, idem::bench::kIdShapes - 1)
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
    ->DenseRange(0, idem::bench::kIdShapes - 1)
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
BENCHMARK(BM_MemoryRecorder_CheckProcessed)
    ->ArgName("shape")
    ->DenseRange(0, idem::bench::kIdShapes - 1);

// A window of 64 fresh events: one check and one mark per event (batch:0) or one
// is_processed_many and one mark_processed_many for the window (batch:1).
void BM_MemoryRecorder_CheckMarkWindow(benchmark::State& state) {
  idem::InMemoryIdempotencyRecorder recorder;
  idem::bench::IdSequence ids(1);
  idem::bench::check_mark_window(state, recorder, "billing", ids, state.range(0) != 0);
}
BENCHMARK(BM_MemoryRecorder_CheckMarkWindow)->Arg(0)->Arg(1)->ArgName("batch");

// What moving one cache line between two cores costs on this machine, the bound of the 2-thread
// rows: as ping_pong(); the real time per iteration (of either thread's) is one move.
void BM_CacheLineRoundTrip(benchmark::State& state) {
  const auto me = static_cast<std::uint64_t>(state.thread_index());
  for (auto _ : state)
    take_turn(me);
}
BENCHMARK(BM_CacheLineRoundTrip)->Iterations(1'000'000)->Threads(2)->UseRealTime();

// The 2-thread rows' ceiling on this machine, with no lock and no idem code: the memory traffic
// of one check+mark of a new 32-hex id on tables the size the recorder's are at 2 M markers (one
// control byte read then written in a 4 MiB array, one 32-byte slot written in a 128 MiB array,
// at hashed positions). Run on one thread, then on two sharing the arrays and the million
// positions, as the recorder's rows are: the ratio of the two is what a second core adds to a
// table both cores write, whatever its locking (relaxed atomics, plain moves on x86).
constexpr std::size_t kCeilingCtrl = std::size_t{4} << 20;
struct CeilingSlot {
  std::atomic<std::uint64_t> words[4];
};
std::unique_ptr<std::atomic<std::uint8_t>[]> g_ceiling_ctrl;
std::unique_ptr<CeilingSlot[]> g_ceiling_slots;
std::atomic<std::uint64_t> g_ceiling_sink{0};

std::uint64_t splitmix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void BM_SharedTableCeiling(benchmark::State& state) {
  if (state.thread_index() == 0) {
    ::malloc_trim(0);
    g_ceiling_ctrl = std::make_unique<std::atomic<std::uint8_t>[]>(kCeilingCtrl);
    g_ceiling_slots = std::make_unique<CeilingSlot[]>(kCeilingCtrl);  // value-initialized: touched
    for (std::size_t i = 0; i < kCeilingCtrl; i += 2)  // about half full, as after 1 M markers
      g_ceiling_ctrl[i].store(1, std::memory_order_relaxed);
  }
  const auto stream = static_cast<std::uint64_t>(state.thread_index()) << 40;
  std::uint64_t n = 0;
  std::uint64_t seen = 0;
  for (auto _ : state) {
    const std::uint64_t h = splitmix(stream + n++);
    const std::size_t at = h & (kCeilingCtrl - 1);
    std::atomic<std::uint8_t>& ctrl = g_ceiling_ctrl[at];
    seen += ctrl.load(std::memory_order_relaxed);                               // the check
    ctrl.store(static_cast<std::uint8_t>(h >> 57), std::memory_order_relaxed);  // the mark
    CeilingSlot& slot = g_ceiling_slots[(h >> 22) & (kCeilingCtrl - 1)];
    for (auto& word : slot.words)
      word.store(h, std::memory_order_relaxed);
  }
  g_ceiling_sink.fetch_add(seen, std::memory_order_relaxed);
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    g_ceiling_ctrl.reset();
    g_ceiling_slots.reset();
  }
}
BENCHMARK(BM_SharedTableCeiling)->Iterations(kIterations)->Threads(1)->UseRealTime();
BENCHMARK(BM_SharedTableCeiling)->Iterations(kIterations / 2)->Threads(2)->UseRealTime();

// What the rows above spend making their ids (ShapedIds::next()), so their figures can be read
// net of it.
void BM_ShapedIds(benchmark::State& state) {
  ShapedIds ids(shape_of(state), 1);
  for (auto _ : state)
    benchmark::DoNotOptimize(ids.next());
  state.SetLabel(idem::bench::shape_name(shape_of(state)));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ShapedIds)->ArgName("shape")->DenseRange(0, idem::bench::kIdShapes - 1);

void BM_NewEventId(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(idem::new_event_id());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_NewEventId);

}  // namespace

BENCHMARK_MAIN();
