// AsyncStore: the operation face's store protocol (see idem/idempotency_store.hpp for the
// blocking one, whose meaning it shares call for call) as coroutines.
//
// The public calls are non-virtual: each checks its arguments once (the key as validate_key()
// defines it, lease > 0, ttl >= 0) and then calls the private do_* virtual a backend implements.
//
// Thread safety: one AsyncStore may be used by any number of coroutines on any executors at
// once, unless the backend's header says otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string_view>

#include "idem/async/task.hpp"
#include "idem/clock.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/report.hpp"

namespace idem::async {

class AsyncStore {
 public:
  virtual ~AsyncStore() = default;

  // True when values must be encoded to bytes (durable stores); false for in-process stores,
  // which keep the typed object.
  [[nodiscard]] bool needs_bytes() const noexcept { return do_needs_bytes(); }

  // The blocking store that holds the same records in the same process, when there is one
  // (the in-memory store adapter returns the store it adapts). Blocking callers and coroutine
  // callers of one key then join one in-process execution; without it they meet through the
  // store, like two processes. May be null.
  [[nodiscard]] std::shared_ptr<IdempotencyStore> blocking_store() const noexcept {
    return do_blocking_store();
  }

  Task<ClaimOutcome> claim(std::string_view key, std::optional<std::string_view> fingerprint,
                           Millis lease);
  // claim() for a caller that uses only a completed record's value, never its execution report
  // (an HTTP replay): the outcome's record->report may be left empty, neither read nor checked,
  // by backends that can skip it. Everything else is claim()'s, outcome for outcome.
  Task<ClaimOutcome> claim_without_report(std::string_view key,
                                          std::optional<std::string_view> fingerprint,
                                          Millis lease);
  Task<bool> complete(std::string_view key, std::uint64_t token, StoredValue value,
                      const ExecutionReport& report, Millis ttl);
  Task<bool> release(std::string_view key, std::uint64_t token);
  Task<bool> renew(std::string_view key, std::uint64_t token, Millis lease);
  Task<std::optional<IdempotencyRecord>> lookup(std::string_view key);

  // Waits until `key` is no longer in progress under a live lease, `deadline` passes, `stop` is
  // requested or the awaiting coroutine is cancelled (its cancellation slot); returns the record
  // then seen (nullopt: absent). The default polls lookup() with capped exponential backoff
  // (2 ms doubling to 200 ms); stores with server notifications override it (Redis: pub/sub, a
  // joiner in another process hears of a completion about one round trip after it).
  Task<std::optional<IdempotencyRecord>> wait(std::string_view key, SteadyTime deadline,
                                              std::stop_token stop = {});

 protected:
  friend class StoreWrapper;  // forwards to the do_* of the store it wraps (wrapper.hpp)

  // The clock of wait()'s default polling. Stores set it from their options.
  std::shared_ptr<Clock> wait_clock_ = system_clock();

  // What a backend implements (protected, so that an override can call the base's default).
  virtual bool do_needs_bytes() const noexcept = 0;
  virtual std::shared_ptr<IdempotencyStore> do_blocking_store() const noexcept { return nullptr; }
  virtual Task<ClaimOutcome> do_claim(std::string_view key,
                                      std::optional<std::string_view> fingerprint,
                                      Millis lease) = 0;
  // Default: do_claim (the report is read too).
  virtual Task<ClaimOutcome> do_claim_without_report(std::string_view key,
                                                     std::optional<std::string_view> fingerprint,
                                                     Millis lease) {
    return do_claim(key, fingerprint, lease);
  }
  virtual Task<bool> do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                                 const ExecutionReport& report, Millis ttl) = 0;
  virtual Task<bool> do_release(std::string_view key, std::uint64_t token) = 0;
  virtual Task<bool> do_renew(std::string_view key, std::uint64_t token, Millis lease) = 0;
  virtual Task<std::optional<IdempotencyRecord>> do_lookup(std::string_view key) = 0;
  virtual Task<std::optional<IdempotencyRecord>> do_wait(std::string_view key, SteadyTime deadline,
                                                         std::stop_token stop);
};

}  // namespace idem::async
