#include "idem/async/memory_store.hpp"

#include <utility>

namespace idem::async {

AsyncMemoryStore::AsyncMemoryStore(std::shared_ptr<InMemoryIdempotencyStore> store)
    : store_(store ? std::move(store) : std::make_shared<InMemoryIdempotencyStore>()) {
  // wait() polls lookup(): whether a lease still holds, and when the deadline has passed, are
  // decided on the adapted store's clock, as every other call's answer is.
  wait_clock_ = store_->clock();
}

Task<ClaimOutcome> AsyncMemoryStore::do_claim(std::string_view key,
                                              std::optional<std::string_view> fingerprint,
                                              Millis lease) {
  co_return store_->claim(key, fingerprint, lease);
}

Task<bool> AsyncMemoryStore::do_complete(std::string_view key, std::uint64_t token,
                                         StoredValue value, const ExecutionReport& report,
                                         Millis ttl) {
  co_return store_->complete(key, token, std::move(value), report, ttl);
}

Task<bool> AsyncMemoryStore::do_release(std::string_view key, std::uint64_t token) {
  co_return store_->release(key, token);
}

Task<bool> AsyncMemoryStore::do_renew(std::string_view key, std::uint64_t token, Millis lease) {
  co_return store_->renew(key, token, lease);
}

Task<std::optional<IdempotencyRecord>> AsyncMemoryStore::do_lookup(std::string_view key) {
  co_return store_->lookup(key);
}

}  // namespace idem::async
