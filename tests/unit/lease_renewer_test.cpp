// detail::LeaseRenewer, the one lease renewal thread of an exclusive-mode handler and of the
// operation coordinator: renewals every lease/3 of the registration's own (manual) clock, a
// refused renewal marks the lease lost and stops, a failing one is tried again, remove() stops.
#include "idem/detail/lease_renewer.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;
using idem::detail::LeaseRenewer;
using idem::testing::ManualClock;

// Counts calls and lets the test wait for the n-th one.
class Calls {
 public:
  void hit() {
    std::lock_guard lock(mutex_);
    ++count_;
    changed_.notify_all();
  }
  int count() const {
    std::lock_guard lock(mutex_);
    return count_;
  }
  // A renewal that counts its call here and answers `renewed`.
  std::function<bool()> renewal(bool renewed) {
    return [this, renewed] {
      hit();
      return renewed;
    };
  }
  // True once count() >= n (false after 10 s: a renewal that never came).
  bool await(int n) const {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 10s, [&] { return count_ >= n; });
  }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  int count_ = 0;
};

// Moves `clock` a third of a 30 ms lease on, when its first renewal is due; true once it ran.
bool first_renewal_of_30ms_lease(ManualClock& clock, const Calls& calls) {
  clock.advance(10ms);
  return calls.await(1);
}

// The count of calls once `clock` has moved past every renewal a 30 ms lease would have had due
// and the renewal thread had time to act: unchanged when nothing renews any more.
int count_after_a_long_time(ManualClock& clock, const Calls& calls) {
  clock.advance(100ms);
  std::this_thread::sleep_for(20ms);
  return calls.count();
}

TEST(LeaseRenewer, RenewsEveryThirdOfTheLeaseOnTheInjectedClock) {
  auto clock = std::make_shared<ManualClock>();
  LeaseRenewer renewer("test");
  Calls calls;
  auto lease = renewer.add(clock, 300ms, calls.renewal(true));
  // No real time moves a manual clock: nothing is due yet, however long we wait.
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(calls.count(), 0);
  clock->advance(99ms);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(calls.count(), 0) << "renewed before lease/3";
  clock->advance(1ms);
  ASSERT_TRUE(calls.await(1));
  clock->advance(100ms);
  ASSERT_TRUE(calls.await(2));
  EXPECT_FALSE(lease->lost());
  renewer.remove(lease);
}

TEST(LeaseRenewer, ARefusedRenewalMarksTheLeaseLostAndStops) {
  auto clock = std::make_shared<ManualClock>();
  LeaseRenewer renewer("test");
  Calls calls;
  // Refused: fenced off, another owner took the claim over.
  auto lease = renewer.add(clock, 30ms, calls.renewal(false));
  ASSERT_TRUE(first_renewal_of_30ms_lease(*clock, calls));
  for (int i = 0; i < 200 && !lease->lost(); ++i)
    std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(lease->lost());
  EXPECT_EQ(count_after_a_long_time(*clock, calls), 1) << "a lost lease is not renewed again";
  renewer.remove(lease);  // harmless after it stopped
}

TEST(LeaseRenewer, AFailingRenewalIsTriedAgainNextPeriod) {
  auto clock = std::make_shared<ManualClock>();
  LeaseRenewer renewer("test");
  Calls calls;
  auto lease = renewer.add(clock, 30ms, [&]() -> bool {
    calls.hit();
    throw std::runtime_error("store unreachable");
  });
  ASSERT_TRUE(first_renewal_of_30ms_lease(*clock, calls));
  clock->advance(10ms);
  ASSERT_TRUE(calls.await(2));
  EXPECT_FALSE(lease->lost()) << "an error is not a lost claim";
  renewer.remove(lease);
}

TEST(LeaseRenewer, RemoveStopsRenewing) {
  auto clock = std::make_shared<ManualClock>();
  LeaseRenewer renewer("test");
  Calls calls;
  auto lease = renewer.add(clock, 30ms, calls.renewal(true));
  ASSERT_TRUE(first_renewal_of_30ms_lease(*clock, calls));
  renewer.remove(lease);
  renewer.remove(nullptr);  // ignored
  // A renewal decided before remove() may still land; after that, none.
  std::this_thread::sleep_for(20ms);
  const int after_remove = calls.count();
  EXPECT_EQ(count_after_a_long_time(*clock, calls), after_remove);
}

TEST(LeaseRenewer, EachLeaseKeepsItsOwnClockAndPeriod) {
  auto fast_clock = std::make_shared<ManualClock>();
  auto slow_clock = std::make_shared<ManualClock>();
  LeaseRenewer renewer("test");
  Calls fast;
  Calls slow;
  auto a = renewer.add(fast_clock, 30ms, fast.renewal(true));
  auto b = renewer.add(slow_clock, 3s, slow.renewal(true));
  for (int i = 1; i <= 3; ++i) {
    fast_clock->advance(10ms);
    ASSERT_TRUE(fast.await(i));
  }
  EXPECT_EQ(slow.count(), 0) << "the other lease's clock did not move";
  slow_clock->advance(1s);
  ASSERT_TRUE(slow.await(1));
  renewer.remove(a);
  renewer.remove(b);
}

TEST(LeaseRenewer, TheSystemClockRenewsOnRealTime) {
  LeaseRenewer renewer("test");
  Calls calls;
  auto lease = renewer.add(nullptr, 30ms, calls.renewal(true));  // null: the system clock
  ASSERT_TRUE(calls.await(3));
  renewer.remove(lease);
}

TEST(LeaseRenewer, DestroyingItWithLeasesRegisteredStopsItsThread) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  {
    LeaseRenewer renewer("test");
    auto lease = renewer.add(clock, 30ms, [&] {
      ++calls;
      return true;
    });
    clock->advance(10ms);
  }  // joined here, with the lease still registered
  const int at_destruction = calls.load();
  clock->advance(100ms);
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(calls.load(), at_destruction);
}

}  // namespace
