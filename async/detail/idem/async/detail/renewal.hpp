// The coroutine face's lease renewal: one loop for every held claim a coroutine owns (an
// AsyncIdempotentHandler's recorder claim in exclusive mode, an async operation owner's store
// claim). Not installed.
//
// renew_every() follows the rules of the blocking LeaseRenewer to the letter
// (idem/detail/lease_renewer.hpp): due renewal_interval(lease) after the start and after each
// renewal was decided, on the injected clock's steady time (an asio::steady_timer waits exactly
// on the SystemClock, and re-reads any other clock every kInjectedClockPoll of real time, never
// moving it); a renewal that returns false is fenced off — no more renewals; one that throws is
// tried again next period; a cancelled loop ends without an error.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/strand.hpp>
#include <functional>
#include <memory>
#include <optional>

#include "idem/async/task.hpp"
#include "idem/clock.hpp"

namespace idem::async::detail {

// Why a renewal loop ended.
enum class RenewalEnd {
  fenced,     // a renewal returned false: another owner has the claim
  cancelled,  // the awaiting coroutine was cancelled (while waiting, or during a renewal)
};

// One renewal: true when the lease was extended, false when the claim was fenced off; throws
// when the store could not be reached.
using RenewFn = std::function<Task<bool>()>;

// Renews until fenced or cancelled (see the top of the file); never throws for either. The
// first renewal is due renewal_interval(lease) after `since` (the claim's time on `clock`; by
// default when the loop starts). A cancellation that arrives during a renewal wins over that
// renewal's failure, not over its "fenced": a claim known lost is reported lost. `clock` null:
// the system clock. It honours the awaiting coroutine's cancellation as filtered there (terminal
// by default, as every Asio coroutine).
Task<RenewalEnd> renew_every(std::shared_ptr<Clock> clock, Millis lease, RenewFn renew,
                             std::optional<SteadyTime> since = std::nullopt);

// A lease kept alive beside its owner's work: renew_every() runs as a coroutine of its own on
// `strand`, timed from `since` (the claim's time on `clock`; by default the construction), until
// stop() or destruction, which cancel it (terminal). A keeper started late, with `since` a lease
// third or more in the past, renews at once and then every third. `renew` must own what it renews
// (the claim's key, its token, the store): a renewal already running when the keeper stops may
// finish after the owner is gone; it is harmless (a store refuses a token that completed or was
// released) and its outcome is not used.
//
// Thread safety: stop() and fenced() may be called from any thread.
class LeaseKeeper {
 public:
  LeaseKeeper(asio::strand<asio::any_io_executor> strand, std::shared_ptr<Clock> clock,
              Millis lease, RenewFn renew, std::optional<SteadyTime> since = std::nullopt);
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Stops renewing (once; later calls do nothing).
  void stop() noexcept;
  // True once the loop ended fenced (a renewal returned false).
  bool fenced() const noexcept;

 private:
  struct State;

  asio::strand<asio::any_io_executor> strand_;
  std::shared_ptr<State> state_;
};

}  // namespace idem::async::detail
