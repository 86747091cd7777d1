// ManualClock: a Clock that moves only when told to.
//
// Tests inject it wherever idem takes a Clock, then move time with advance() instead of sleeping.
// sleep_for() does not block: it advances the clock by the requested duration at once and
// records it in sleeps(), so retry backoff and redelivery delays are both instant and
// observable. Wall and steady time move together.
//
// Thread-safety: safe to use from any number of threads.
#pragma once

#include <chrono>
#include <mutex>
#include <vector>

#include "idem/clock.hpp"

namespace idem::testing {

class ManualClock final : public Clock {
 public:
  // Starts at a fixed, recognisable wall time (2030-01-01T00:00:00Z) unless told otherwise.
  explicit ManualClock(WallTime start = WallTime(std::chrono::seconds(1893456000)))
      : wall_(start) {}

  WallTime wall_now() const override {
    std::lock_guard lock(mutex_);
    return wall_;
  }
  SteadyTime steady_now() const override {
    std::lock_guard lock(mutex_);
    return steady_;
  }
  bool sleep_for(std::chrono::nanoseconds duration, std::stop_token stop = {}) override {
    if (stop.stop_requested()) return false;
    std::lock_guard lock(mutex_);
    sleeps_.push_back(duration);
    advance_locked(duration);
    return true;
  }

  void advance(std::chrono::nanoseconds duration) {
    std::lock_guard lock(mutex_);
    advance_locked(duration);
  }
  // Moves only the wall clock (a jump, as when NTP steps the clock); may go backwards.
  void set_wall(WallTime t) {
    std::lock_guard lock(mutex_);
    wall_ = t;
  }
  std::vector<std::chrono::nanoseconds> sleeps() const {
    std::lock_guard lock(mutex_);
    return sleeps_;
  }

 private:
  void advance_locked(std::chrono::nanoseconds d) {
    wall_ += std::chrono::duration_cast<WallTime::duration>(d);
    steady_ += std::chrono::duration_cast<SteadyTime::duration>(d);
  }

  mutable std::mutex mutex_;
  WallTime wall_;
  SteadyTime steady_{};
  std::vector<std::chrono::nanoseconds> sleeps_;
};

}  // namespace idem::testing
