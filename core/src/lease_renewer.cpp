#include "idem/detail/lease_renewer.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

namespace idem::detail {

std::chrono::nanoseconds renewal_interval(Millis lease) {
  return std::max(std::chrono::nanoseconds(lease) / 3, std::chrono::nanoseconds(1));
}

std::chrono::nanoseconds renewal_wait(const Clock& clock, SteadyTime due, SteadyTime now) {
  if (due <= now) return std::chrono::nanoseconds::zero();
  const std::chrono::nanoseconds left = due - now;
  if (dynamic_cast<const SystemClock*>(&clock) != nullptr) return left;
  return std::min<std::chrono::nanoseconds>(left, kInjectedClockPoll);
}

// What the thread uses; the thread itself is its last member, so it is stopped and joined before
// the members above it go.
struct LeaseRenewer::State {
  using RealClock = std::chrono::steady_clock;

  void run(std::stop_token stop) {
    std::unique_lock lock(mutex);
    while (!stop.stop_requested()) {
      if (leases.empty()) {
        wake_at = RealClock::time_point::max();
        cv.wait(lock, stop, [&] { return !leases.empty(); });
        continue;
      }
      // What is due now, and how long (in real time) until the next one is.
      std::vector<std::shared_ptr<Lease>> due;
      auto wait = RealClock::duration::max();
      for (const auto& lease : leases) {
        const SteadyTime now = lease->clock_->steady_now();
        if (lease->due_ <= now) {
          due.push_back(lease);
          // From the moment the renewal was decided, not when it returns: the schedule does not
          // drift by the store's latency.
          lease->due_ = now + lease->interval_;
        }
        wait = std::min(wait, std::chrono::duration_cast<RealClock::duration>(
                                  renewal_wait(*lease->clock_, lease->due_, now)));
      }
      if (due.empty()) {
        const std::uint64_t seen = generation;
        wake_at = RealClock::now() + wait;
        cv.wait_until(lock, stop, wake_at, [&] { return generation != seen; });
        continue;
      }
      lock.unlock();
      for (const auto& lease : due) {
        try {
          if (!lease->renew_()) lease->lost_.store(true, std::memory_order_release);
        } catch (...) {
          // A store hiccup is not a lost claim: tried again next period.
        }
      }
      lock.lock();
      for (const auto& lease : due) {
        if (lease->lost()) std::erase(leases, lease);
      }
    }
  }

  std::mutex mutex;
  std::condition_variable_any cv;
  std::vector<std::shared_ptr<Lease>> leases;
  std::uint64_t generation = 0;                                  // bumped to wake the thread early
  RealClock::time_point wake_at = RealClock::time_point::min();  // when the thread wakes next
  std::jthread thread;                                           // last
};

LeaseRenewer::LeaseRenewer(std::string what)
    : what_(std::move(what)), state_(std::make_shared<State>()) {}

LeaseRenewer::~LeaseRenewer() {
  // In a child of fork() the thread is the parent's: keep its state out of every destructor.
  if (owner_.forked()) abandon(std::move(state_));
  // Otherwise state_ goes here: its thread is stopped and joined first.
}

std::shared_ptr<LeaseRenewer::Lease> LeaseRenewer::add(std::shared_ptr<Clock> clock, Millis lease,
                                                       std::function<bool()> renew) {
  check_process();
  if (!clock) clock = system_clock();
  const auto interval = renewal_interval(lease);
  auto registered = std::shared_ptr<Lease>(new Lease(std::move(clock), interval, std::move(renew)));
  const SteadyTime due = registered->clock_->steady_now() + interval;
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  registered->due_ = due;
  s.leases.push_back(registered);
  if (!s.thread.joinable()) {
    s.thread = std::jthread([&s](std::stop_token stop) { s.run(std::move(stop)); });
  }
  // Wake the thread only if it would otherwise sleep past this lease's first renewal (or it
  // polls an injected clock anyway).
  const bool real = dynamic_cast<SystemClock*>(registered->clock_.get()) != nullptr;
  if (!real || State::RealClock::now() + interval < s.wake_at) {
    ++s.generation;
    s.cv.notify_all();
  }
  return registered;
}

void LeaseRenewer::remove(const std::shared_ptr<Lease>& lease) noexcept {
  if (!lease) return;
  std::lock_guard lock(state_->mutex);
  std::erase(state_->leases, lease);
}

}  // namespace idem::detail
