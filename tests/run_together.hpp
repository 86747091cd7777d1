// run_together(threads, each): runs `each(t)` on `threads` threads of its own (t: 0 to threads -
// 1), released at once by a latch so that their calls race, and returns when all of them have
// ended.
#pragma once

#include <cstddef>
#include <latch>
#include <thread>
#include <vector>

namespace idem::test {

template <class Each>
void run_together(int threads, Each&& each) {
  std::latch start(threads);
  std::vector<std::thread> running;
  running.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&start, &each, t] {
      start.arrive_and_wait();
      each(t);
    });
  }
  for (auto& thread : running)
    thread.join();
}

template <class Each, class Meanwhile>
void run_together_while(int threads, Each&& each, Meanwhile&& meanwhile) {
  std::atomic<int> ended{0};
  run_together(threads + 1, [&](int t) {
    if (t < threads) {
      each(t);
      ended.fetch_add(1);
    } else {
      while (ended.load() < threads)
        meanwhile();
    }
  });
}

}  // namespace idem::test
