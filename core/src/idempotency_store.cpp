#include "idem/idempotency_store.hpp"

#include <algorithm>
#include <utility>

#include "idem/detail/contract.hpp"
#include "idem/error.hpp"

namespace idem {

std::string_view to_string(IdempotencyRecord::State state) noexcept {
  switch (state) {
    case IdempotencyRecord::State::in_progress:
      return "in_progress";
    case IdempotencyRecord::State::completed:
      return "completed";
  }
  return "unknown";
}

std::string_view to_string(ClaimOutcome::Status status) noexcept {
  switch (status) {
    case ClaimOutcome::Status::acquired:
      return "acquired";
    case ClaimOutcome::Status::completed:
      return "completed";
    case ClaimOutcome::Status::in_progress:
      return "in_progress";
    case ClaimOutcome::Status::mismatch:
      return "mismatch";
  }
  return "unknown";
}

ClaimOutcome ClaimOutcome::found(IdempotencyRecord record,
                                 std::optional<std::string_view> fingerprint) {
  ClaimOutcome outcome;
  if (fingerprint && record.fingerprint && *fingerprint != *record.fingerprint) {
    outcome.status = Status::mismatch;
  } else if (record.state == IdempotencyRecord::State::completed) {
    outcome.status = Status::completed;
  } else {
    outcome.status = Status::in_progress;
  }
  outcome.record = std::move(record);
  return outcome;
}

ClaimOutcome IdempotencyStore::claim(std::string_view key,
                                     std::optional<std::string_view> fingerprint, Millis lease) {
  detail::check_idempotency_key(key);
  detail::check_lease(lease);
  return do_claim(key, fingerprint, lease);
}

bool IdempotencyStore::complete(std::string_view key, std::uint64_t token, StoredValue value,
                                const ExecutionReport& report, Millis ttl) {
  detail::check_idempotency_key(key);
  detail::check_ttl(ttl);
  return do_complete(key, token, std::move(value), report, ttl);
}

bool IdempotencyStore::release(std::string_view key, std::uint64_t token) {
  detail::check_idempotency_key(key);
  return do_release(key, token);
}

bool IdempotencyStore::renew(std::string_view key, std::uint64_t token, Millis lease) {
  detail::check_idempotency_key(key);
  detail::check_lease(lease);
  return do_renew(key, token, lease);
}

std::optional<IdempotencyRecord> IdempotencyStore::lookup(std::string_view key) {
  detail::check_idempotency_key(key);
  return do_lookup(key);
}

std::optional<IdempotencyRecord> IdempotencyStore::wait(std::string_view key, SteadyTime deadline,
                                                        std::stop_token stop) {
  detail::check_idempotency_key(key);
  return do_wait(key, deadline, std::move(stop));
}

RecordPage IdempotencyStore::list(std::string_view prefix, std::size_t limit,
                                  std::string_view cursor) {
  detail::check_key_prefix(prefix);
  detail::check_list_limit(limit);
  return do_list(prefix, limit, cursor);
}

bool IdempotencyStore::remove(std::string_view key, std::uint64_t token) {
  detail::check_idempotency_key(key);
  return do_remove(key, token);
}

RecordPage IdempotencyStore::do_list(std::string_view, std::size_t, std::string_view) {
  throw NotSupported("this idempotency store cannot list its records (list)");
}

bool IdempotencyStore::do_remove(std::string_view, std::uint64_t) {
  throw NotSupported("this idempotency store cannot remove a record (remove)");
}

StoreCounts IdempotencyStore::do_counts() {
  throw NotSupported("this idempotency store cannot count its records (counts)");
}

std::optional<IdempotencyRecord> IdempotencyStore::do_wait(std::string_view key,
                                                           SteadyTime deadline,
                                                           std::stop_token stop) {
  auto delay = std::chrono::milliseconds(2);
  constexpr auto kMaxDelay = std::chrono::milliseconds(200);
  for (;;) {
    auto record = do_lookup(key);
    if (!idem::detail::held_at(record, wait_clock_->wall_now())) return record;
    const auto now = wait_clock_->steady_now();
    if (now >= deadline || stop.stop_requested()) return record;
    const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    if (!wait_clock_->sleep_for(std::min(delay, remaining), stop)) return record;
    delay = std::min(delay * 2, kMaxDelay);
  }
}

}  // namespace idem
