#include "idem/clock.hpp"

#include <condition_variable>
#include <mutex>

namespace idem {

bool SystemClock::sleep_for(std::chrono::nanoseconds duration, std::stop_token stop) {
  if (duration <= std::chrono::nanoseconds::zero()) return !stop.stop_requested();
  if (!stop.stop_possible()) {
    std::this_thread::sleep_for(duration);
    return true;
  }
  std::mutex mutex;
  std::condition_variable_any cv;
  std::unique_lock lock(mutex);
  // wait_for returns the predicate's value: true means a stop was requested.
  return !cv.wait_for(lock, stop, duration, [] { return false; });
}

std::shared_ptr<Clock> system_clock() {
  static const std::shared_ptr<Clock> instance = std::make_shared<SystemClock>();
  return instance;
}

}  // namespace idem
