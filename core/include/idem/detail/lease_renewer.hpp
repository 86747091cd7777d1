// LeaseRenewer: keeps the leases of held claims alive while their owners run.
//
// The rules of every lease renewal in idem — this blocking renewer's and the coroutine face's
// (idem::async::detail::renew_every, which follows them to the letter):
//  * When: renewal_interval(lease) (lease/3) after the claim was taken, then after each renewal
//    was decided (not after it returned: the store's latency does not drift the schedule), on the
//    steady time of the injected Clock.
//  * Renewed (the renewal returns true): go on.
//  * Fenced (false): another owner took the claim over. Renewing stops for good and the owner
//    can see it (Lease::lost(), LeaseKeeper::fenced()); its complete() then reports the loss.
//  * Failed (it throws): the store could not be reached. Tried again next period; the lease
//    outlives two missed renewals.
//  * Stopped (remove(), or the renewing coroutine cancelled): renewing ends without an error; a
//    renewal already running may still land, which is harmless (a store or recorder refuses a
//    token that completed or was released), and its outcome is not used.
//
// One background thread renews every registered lease until it is removed. Both blocking faces
// use it: an IdempotentHandler in exclusive mode (a recorder claim per event) and the operation
// coordinator (a store claim per executing key). What a renewal does is the caller's function.
//
// Time: the thread waits on real time, exactly for the SystemClock; with any other clock (a
// ManualClock a test moves by hand) it re-reads that clock every kInjectedClockPoll while such a
// lease is registered (renewal_wait()), so a clock advanced past a renewal's due time is noticed
// promptly without the renewer ever moving the clock itself.
//
// The thread starts on the first add() and stays (idle, waiting) until the renewer goes, so a
// call never starts a thread. A registration is woken early only when it is due before the
// thread would otherwise wake: with equal leases a call costs no context switch.
//
// fork(): a renewer made before fork() is the parent's. Its thread does not exist in a child, so
// add() throws ConfigError there (check_process()), and destroying the renewer in a child
// abandons its thread state (handle, mutex, condition variable) instead of joining
// (detail/fork.hpp).
//
// Thread-safety: add(), remove() and lost() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "idem/clock.hpp"
#include "idem/detail/fork.hpp"

namespace idem::detail {

// How often a held claim's lease is renewed: lease / 3, at least 1 ns.
std::chrono::nanoseconds renewal_interval(Millis lease);

// How often a renewer re-reads a clock that is not the SystemClock.
inline constexpr std::chrono::milliseconds kInjectedClockPoll{1};

// The real time to wait before looking at `clock` again for a renewal due at `due`, `now` being
// the clock's steady time: what is left on the SystemClock, at most kInjectedClockPoll on any
// other. Zero when it is due.
std::chrono::nanoseconds renewal_wait(const Clock& clock, SteadyTime due, SteadyTime now);

class LeaseRenewer {
 public:
  // One registered lease.
  class Lease {
   public:
    // A renewal was fenced off: another owner has the claim. Renewing stopped.
    bool lost() const noexcept { return lost_.load(std::memory_order_acquire); }

   private:
    friend class LeaseRenewer;
    Lease(std::shared_ptr<Clock> clock, std::chrono::nanoseconds interval,
          std::function<bool()> renew)
        : clock_(std::move(clock)), interval_(interval), renew_(std::move(renew)) {}

    const std::shared_ptr<Clock> clock_;
    const std::chrono::nanoseconds interval_;
    const std::function<bool()> renew_;
    SteadyTime due_{};  // on clock_; guarded by the renewer's mutex
    std::atomic<bool> lost_{false};
  };

  // `what` names the owner in the ConfigError thrown in a child of fork().
  explicit LeaseRenewer(std::string what);
  ~LeaseRenewer();
  LeaseRenewer(const LeaseRenewer&) = delete;
  LeaseRenewer& operator=(const LeaseRenewer&) = delete;

  // Starts renewing: `renew` is first called lease/3 from now on `clock` (null: the system
  // clock). Keep the result to remove() it. Throws ConfigError in a child of fork().
  std::shared_ptr<Lease> add(std::shared_ptr<Clock> clock, Millis lease,
                             std::function<bool()> renew);

  // Stops renewing. A renewal already running for it may still land; that is harmless (a store
  // or recorder refuses a token that completed or released). Null is ignored.
  void remove(const std::shared_ptr<Lease>& lease) noexcept;

  // Throws ConfigError in a child of fork(): the renewer (its thread) is the parent's.
  void check_process() const { owner_.use(what_); }

 private:
  struct State;

  ForkOwner owner_;
  std::string what_;
  std::shared_ptr<State> state_;
};

}  // namespace idem::detail
