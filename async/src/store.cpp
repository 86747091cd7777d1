#include "idem/async/store.hpp"

#include <utility>

#include "idem/detail/contract.hpp"

namespace idem::async {

Task<ClaimOutcome> AsyncStore::claim(std::string_view key,
                                     std::optional<std::string_view> fingerprint, Millis lease) {
  detail::check_idempotency_key(key);
  detail::check_lease(lease);
  co_return co_await do_claim(key, fingerprint, lease);
}

Task<bool> AsyncStore::complete(std::string_view key, std::uint64_t token, StoredValue value,
                                const ExecutionReport& report, Millis ttl) {
  detail::check_idempotency_key(key);
  detail::check_ttl(ttl);
  co_return co_await do_complete(key, token, std::move(value), report, ttl);
}

Task<bool> AsyncStore::release(std::string_view key, std::uint64_t token) {
  detail::check_idempotency_key(key);
  co_return co_await do_release(key, token);
}

Task<bool> AsyncStore::renew(std::string_view key, std::uint64_t token, Millis lease) {
  detail::check_idempotency_key(key);
  detail::check_lease(lease);
  co_return co_await do_renew(key, token, lease);
}

Task<std::optional<IdempotencyRecord>> AsyncStore::lookup(std::string_view key) {
  detail::check_idempotency_key(key);
  co_return co_await do_lookup(key);
}

}  // namespace idem::async
