#include "idem/async/detail/renewal.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <exception>
#include <system_error>
#include <utility>

#include "idem/detail/lease_renewer.hpp"

namespace idem::async::detail {

Task<RenewalEnd> renew_every(std::shared_ptr<Clock> clock, Millis lease, RenewFn renew,
                             std::optional<SteadyTime> since) {
  if (!clock) clock = system_clock();
  const std::chrono::nanoseconds interval = idem::detail::renewal_interval(lease);
  asio::steady_timer timer(co_await asio::this_coro::executor);
  SteadyTime due = (since ? *since : clock->steady_now()) + interval;
  for (;;) {
    for (SteadyTime now = clock->steady_now(); now < due; now = clock->steady_now()) {
      timer.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(
          idem::detail::renewal_wait(*clock, due, now)));
      bool woken = true;
      try {
        co_await timer.async_wait(asio::use_awaitable);
      } catch (const std::system_error&) {
        woken = false;  // operation_aborted: the only way a timer's wait fails
      }
      if (!woken) co_return RenewalEnd::cancelled;
    }
    due = clock->steady_now() + interval;
    bool renewed = true;
    try {
      renewed = co_await renew();
    } catch (...) {
      // Not reached (or cancelled mid-renewal, checked below): tried again next period.
    }
    if (!renewed) co_return RenewalEnd::fenced;
    // Read directly: a co_await of another awaitable would throw in a cancelled coroutine
    // (Asio's throw_if_cancelled, on by default).
    const asio::cancellation_state state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none) co_return RenewalEnd::cancelled;
  }
}

struct LeaseKeeper::State {
  // Used on the strand only. It holds the loop's cancellation state, so it lives as long as the
  // co_spawn completion handler, which shares this object.
  asio::cancellation_signal signal;
  std::atomic<bool> running{true};
  std::atomic<bool> fenced{false};
};

LeaseKeeper::LeaseKeeper(asio::strand<asio::any_io_executor> strand, std::shared_ptr<Clock> clock,
                         Millis lease, RenewFn renew, std::optional<SteadyTime> since)
    : strand_(std::move(strand)), state_(std::make_shared<State>()) {
  if (!clock) clock = system_clock();
  if (!since) since = clock->steady_now();
  asio::co_spawn(strand_, renew_every(std::move(clock), lease, std::move(renew), *since),
                 asio::bind_cancellation_slot(state_->signal.slot(),
                                              [state = state_](std::exception_ptr, RenewalEnd end) {
                                                if (end == RenewalEnd::fenced)
                                                  state->fenced.store(true);
                                              }));
}

LeaseKeeper::~LeaseKeeper() {
  stop();
}

void LeaseKeeper::stop() noexcept {
  if (!state_->running.exchange(false)) return;
  try {
    asio::post(strand_,
               [state = state_] { state->signal.emit(asio::cancellation_type::terminal); });
  } catch (...) {
    // Out of memory: the loop then renews until its next renewal is fenced or its context ends.
  }
}

bool LeaseKeeper::fenced() const noexcept {
  return state_->fenced.load();
}

}  // namespace idem::async::detail
