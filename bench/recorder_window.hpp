// A recorder's timed loops for the benchmarks.
//
// mark_stream: every iteration marks `pipeline` fresh event ids, with mark_processed (1) or one
// mark_processed_batch. Items are marks.
//
// check_mark_window: a transport's window of deliveries, for the batch-vs-single benchmarks:
// every iteration is a window of kWindow fresh event ids, checked and marked either
// with one is_processed_many + one mark_processed_many (batch = 1) or with an is_processed and a
// mark_processed per event (batch = 0). Items are events, so items/s compare with *_CheckMark.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "bench_ids.hpp"

namespace idem::bench {

template <class Recorder>
void mark_stream(benchmark::State& state, Recorder& recorder, std::string_view consumer,
                 IdSequence& ids, int pipeline) {
  std::vector<std::string_view> batch(static_cast<std::size_t>(pipeline));
  std::vector<std::string> storage(static_cast<std::size_t>(pipeline));
  for (auto _ : state) {
    if (pipeline == 1) {
      recorder.mark_processed(consumer, ids.next());
    } else {
      for (std::size_t i = 0; i < storage.size(); ++i) {
        storage[i] = ids.next();
        batch[i] = storage[i];
      }
      recorder.mark_processed_batch(consumer, batch);
    }
  }
  state.SetItemsProcessed(state.iterations() * pipeline);
}

inline constexpr std::size_t kWindow = 64;

template <class Recorder>
void check_mark_window(benchmark::State& state, Recorder& recorder, std::string_view consumer,
                       IdSequence& ids, bool batch) {
  std::vector<std::string> window(kWindow);
  std::vector<std::string> fresh;
  fresh.reserve(kWindow);
  for (auto _ : state) {
    for (std::string& id : window)
      id = ids.next();
    if (batch) {
      const std::vector<bool> seen = recorder.is_processed_many(consumer, window);
      fresh.clear();
      for (std::size_t i = 0; i < window.size(); ++i) {
        if (!seen[i]) fresh.push_back(window[i]);
      }
      recorder.mark_processed_many(consumer, fresh);
    } else {
      for (const std::string& id : window) {
        if (!recorder.is_processed(consumer, id)) recorder.mark_processed(consumer, id);
      }
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kWindow));
}

}  // namespace idem::bench
