// eventually(condition): re-checks `condition` (yielding in between, no sleeping) until it holds,
// and says whether it did. A generous real-time bound (60 s) turns a bug into a failure instead
// of a hung test; it is not a timing assertion.
#pragma once

#include <chrono>
#include <thread>

namespace idem::test {

template <class Condition>
bool eventually(Condition condition) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace idem::test
