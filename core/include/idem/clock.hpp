// Time, injected.
//
// idem never reads the time directly: every component takes a Clock. Wall time
// (std::chrono::system_clock) is used for anything stored or shared between processes — lease
// deadlines, record expiries, marker timestamps. Steady time is used for durations measured in
// one process — timeouts, backoff, breaker windows, report durations.
//
// sleep_for() is the only way idem waits out a delay (retry backoff, redelivery backoff), so a
// test clock can make waiting instant and deterministic (see idem/testing/manual_clock.hpp).
//
// Thread-safety: implementations must be safe to call from any number of threads.
#pragma once

#include <chrono>
#include <memory>
#include <stop_token>

namespace idem {

using WallTime = std::chrono::system_clock::time_point;
using SteadyTime = std::chrono::steady_clock::time_point;
using Millis = std::chrono::milliseconds;

class Clock {
 public:
  virtual ~Clock() = default;

  virtual WallTime wall_now() const = 0;
  virtual SteadyTime steady_now() const = 0;

  // Waits for `duration` (or until `stop` is requested). Returns false when it was stopped
  // early, true when the whole duration passed.
  virtual bool sleep_for(std::chrono::nanoseconds duration, std::stop_token stop = {}) = 0;
};

// The real clocks. Stateless; the shared instance can be used everywhere.
class SystemClock final : public Clock {
 public:
  WallTime wall_now() const override { return std::chrono::system_clock::now(); }
  SteadyTime steady_now() const override { return std::chrono::steady_clock::now(); }
  bool sleep_for(std::chrono::nanoseconds duration, std::stop_token stop = {}) override;
};

// The process-wide SystemClock used when no clock is injected.
std::shared_ptr<Clock> system_clock();

}  // namespace idem
