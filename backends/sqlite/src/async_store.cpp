#include "idem/sqlite/async_store.hpp"

#include <functional>
#include <utility>

#include "async_offload.hpp"
#include "idem/error.hpp"

namespace idem::sqlite {

using detail::offload;
using idem::async::Task;

AsyncSqliteStore::AsyncSqliteStore(std::string path, SqliteOptions options,
                                   AsyncSqliteOptions async_options)
    : store_(std::make_shared<SqliteIdempotencyStore>(std::move(path), std::move(options))),
      pool_(detail::make_worker_pool(async_options.threads)) {
  use_store_clock();
}

AsyncSqliteStore::AsyncSqliteStore(std::shared_ptr<SqliteIdempotencyStore> store,
                                   AsyncSqliteOptions async_options)
    : store_(std::move(store)) {
  if (!store_) throw InvalidArgument("AsyncSqliteStore: the store is null");
  pool_ = detail::make_worker_pool(async_options.threads);
  use_store_clock();
}

// wait() polls lookup(): whether a lease still holds, and when the deadline has passed, are
// decided on the store's clock (SqliteOptions::clock), as every other call's answer is.
void AsyncSqliteStore::use_store_clock() {
  if (store_->options().clock) wait_clock_ = store_->options().clock;
}

AsyncSqliteStore::~AsyncSqliteStore() = default;

Task<ClaimOutcome> AsyncSqliteStore::do_claim(std::string_view key,
                                              std::optional<std::string_view> fingerprint,
                                              Millis lease) {
  const std::function<ClaimOutcome()> work = [this, key, fingerprint, lease] {
    return store_->claim(key, fingerprint, lease);
  };
  co_return co_await offload<ClaimOutcome>(*pool_, work);
}

Task<ClaimOutcome> AsyncSqliteStore::do_claim_without_report(
    std::string_view key, std::optional<std::string_view> fingerprint, Millis lease) {
  const std::function<ClaimOutcome()> work = [this, key, fingerprint, lease] {
    return store_->claim_without_report(key, fingerprint, lease);
  };
  co_return co_await offload<ClaimOutcome>(*pool_, work);
}

Task<bool> AsyncSqliteStore::do_complete(std::string_view key, std::uint64_t token,
                                         StoredValue value, const ExecutionReport& report,
                                         Millis ttl) {
  const std::function<bool()> work = [this, key, token, &value, &report, ttl] {
    return store_->complete(key, token, std::move(value), report, ttl);
  };
  co_return co_await offload<bool>(*pool_, work);
}

Task<bool> AsyncSqliteStore::do_release(std::string_view key, std::uint64_t token) {
  const std::function<bool()> work = [this, key, token] { return store_->release(key, token); };
  co_return co_await offload<bool>(*pool_, work, nullptr, /*withdrawable=*/false);
}

Task<bool> AsyncSqliteStore::do_renew(std::string_view key, std::uint64_t token, Millis lease) {
  const std::function<bool()> work = [this, key, token, lease] {
    return store_->renew(key, token, lease);
  };
  co_return co_await offload<bool>(*pool_, work);
}

Task<std::optional<IdempotencyRecord>> AsyncSqliteStore::do_lookup(std::string_view key) {
  const std::function<std::optional<IdempotencyRecord>()> work = [this, key] {
    return store_->lookup(key);
  };
  co_return co_await offload<std::optional<IdempotencyRecord>>(*pool_, work);
}

}  // namespace idem::sqlite
