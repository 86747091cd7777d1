#include "idem/async/store.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "idem/async/resilient.hpp"
#include "idem/detail/contract.hpp"

namespace idem::async {

Task<ClaimOutcome> AsyncStore::claim(std::string_view key,
                                     std::optional<std::string_view> fingerprint, Millis lease) {
  idem::detail::check_idempotency_key(key);
  idem::detail::check_lease(lease);
  co_return co_await do_claim(key, fingerprint, lease);
}

Task<ClaimOutcome> AsyncStore::claim_without_report(std::string_view key,
                                                    std::optional<std::string_view> fingerprint,
                                                    Millis lease) {
  idem::detail::check_idempotency_key(key);
  idem::detail::check_lease(lease);
  co_return co_await do_claim_without_report(key, fingerprint, lease);
}

Task<bool> AsyncStore::complete(std::string_view key, std::uint64_t token, StoredValue value,
                                const ExecutionReport& report, Millis ttl) {
  idem::detail::check_idempotency_key(key);
  idem::detail::check_ttl(ttl);
  co_return co_await do_complete(key, token, std::move(value), report, ttl);
}

Task<bool> AsyncStore::release(std::string_view key, std::uint64_t token) {
  idem::detail::check_idempotency_key(key);
  co_return co_await do_release(key, token);
}

Task<bool> AsyncStore::renew(std::string_view key, std::uint64_t token, Millis lease) {
  idem::detail::check_idempotency_key(key);
  idem::detail::check_lease(lease);
  co_return co_await do_renew(key, token, lease);
}

Task<std::optional<IdempotencyRecord>> AsyncStore::lookup(std::string_view key) {
  idem::detail::check_idempotency_key(key);
  co_return co_await do_lookup(key);
}

Task<std::optional<IdempotencyRecord>> AsyncStore::wait(std::string_view key, SteadyTime deadline,
                                                        std::stop_token stop) {
  idem::detail::check_idempotency_key(key);
  co_return co_await do_wait(key, deadline, std::move(stop));
}

Task<std::optional<IdempotencyRecord>> AsyncStore::do_wait(std::string_view key,
                                                           SteadyTime deadline,
                                                           std::stop_token stop) {
  auto delay = std::chrono::milliseconds(2);
  constexpr auto kMaxDelay = std::chrono::milliseconds(200);
  for (;;) {
    auto record = co_await do_lookup(key);
    if (!idem::detail::held_at(record, wait_clock_->wall_now())) co_return record;
    const SteadyTime now = wait_clock_->steady_now();
    if (now >= deadline || stop.stop_requested()) co_return record;
    const auto remaining = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
    if (!co_await detail::wait_delay(std::min<std::chrono::nanoseconds>(delay, remaining),
                                     wait_clock_)) {
      co_return record;  // the caller was cancelled
    }
    delay = std::min(delay * 2, kMaxDelay);
  }
}

}  // namespace idem::async
