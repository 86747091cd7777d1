#include "idem/async/detail/holder_wait.hpp"

#include <algorithm>
#include <exception>
#include <utility>

#include <asio/this_coro.hpp>

#include "idem/async/resilient.hpp"

namespace idem::async::detail {

HolderWait::HolderWait(std::shared_ptr<Clock> clock, std::chrono::nanoseconds first_poll,
                       std::chrono::nanoseconds poll_cap)
    : clock_(clock ? std::move(clock) : system_clock()), poll_(first_poll), poll_cap_(poll_cap) {}

Task<bool> HolderWait::once(AsyncStore& store, std::string_view key,
                            std::optional<std::uint64_t> holder, SteadyTime until,
                            std::stop_token stop) {
  if (clock_ == system_clock() && holder && waited_for_ != holder) {
    waited_for_ = holder;
    std::exception_ptr failed;
    try {
      // The record it returns is read again by the claim that follows.
      (void)co_await store.wait(key, until, std::move(stop));
    } catch (...) {
      failed = std::current_exception();
    }
    // Read directly: a co_await of another awaitable would throw in a cancelled coroutine
    // (Asio's throw_if_cancelled, on by default).
    const asio::cancellation_state state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none) co_return false;
    if (failed) std::rethrow_exception(failed);
    co_return true;
  }
  const SteadyTime now = clock_->steady_now();
  const auto left = std::max<std::chrono::nanoseconds>(until - now, std::chrono::nanoseconds(0));
  const auto delay = std::min(poll_, left);
  poll_ = std::min(poll_ * 2, poll_cap_);
  co_return co_await wait_delay(delay, clock_);
}

}  // namespace idem::async::detail
