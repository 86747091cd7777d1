// Waiting out a claim another process holds: the step the operation coordinator
// (idem::async::resilient) and the HTTP guard (idem::http) both take when a claim answers
// in_progress, before they claim again (completed: replay; absent or abandoned: run). Not
// installed.
//
// The store's wait() hears of the holder's end where the store has notifications (Redis's
// pub/sub) and polls lookup() otherwise. The claim is polled here instead, with a capped
// exponential backoff:
//  * under an injected clock: its time is its own, while a store's wait() runs on real time;
//  * when the store did not name the holder;
//  * when a wait for this very holder already ended and the claim still finds it (the store's
//    clock and the wait's disagree).
// So a wait never turns into a busy loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string_view>

#include "idem/async/store.hpp"
#include "idem/async/task.hpp"
#include "idem/clock.hpp"

namespace idem::async::detail {

// One caller's waits for one key, across the claims it retries. Not thread-safe: one coroutine
// uses it.
class HolderWait {
 public:
  // `clock` null: the system clock. Polls start at `first_poll` and double up to `poll_cap`.
  HolderWait(std::shared_ptr<Clock> clock, std::chrono::nanoseconds first_poll,
             std::chrono::nanoseconds poll_cap);

  // Waits once for `holder` (the token of the claim that answered in_progress, when the store
  // named it) to let go of `key`, until `until` at the latest (the clock's steady time), or
  // until `stop` is requested. Returns false when the awaiting coroutine was cancelled; throws
  // what the store's wait() threw otherwise.
  Task<bool> once(AsyncStore& store, std::string_view key, std::optional<std::uint64_t> holder,
                  SteadyTime until, std::stop_token stop = {});

 private:
  std::shared_ptr<Clock> clock_;
  std::chrono::nanoseconds poll_;
  std::chrono::nanoseconds poll_cap_;
  std::optional<std::uint64_t> waited_for_;  // the holder the store's wait() last ended for
};

}  // namespace idem::async::detail
