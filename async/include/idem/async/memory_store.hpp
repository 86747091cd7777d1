// AsyncMemoryStore: the AsyncStore protocol over an idem::InMemoryIdempotencyStore.
//
// Every call completes inline (the in-memory store never waits for I/O), on the awaiting
// coroutine's executor. blocking_store() returns the adapted store, so the async operation face
// and the blocking one share one coordinator: a blocking caller and a coroutine caller of one key
// join one execution.
//
// Thread safety: as the adapted store — any number of coroutines on any executors at once.
#pragma once

#include <memory>

#include "idem/async/store.hpp"
#include "idem/memory_store.hpp"

namespace idem::async {

class AsyncMemoryStore final : public AsyncStore {
 public:
  // `store` null: a new InMemoryIdempotencyStore of its own.
  explicit AsyncMemoryStore(std::shared_ptr<InMemoryIdempotencyStore> store = nullptr);

  // The adapted store (never null).
  const std::shared_ptr<InMemoryIdempotencyStore>& memory_store() const noexcept { return store_; }

 private:
  bool do_needs_bytes() const noexcept override { return false; }
  std::shared_ptr<IdempotencyStore> do_blocking_store() const noexcept override { return store_; }
  Task<ClaimOutcome> do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                              Millis lease) override;
  Task<bool> do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                         const ExecutionReport& report, Millis ttl) override;
  Task<bool> do_release(std::string_view key, std::uint64_t token) override;
  Task<bool> do_renew(std::string_view key, std::uint64_t token, Millis lease) override;
  Task<std::optional<IdempotencyRecord>> do_lookup(std::string_view key) override;

  std::shared_ptr<InMemoryIdempotencyStore> store_;
};

}  // namespace idem::async
