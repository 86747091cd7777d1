#include "idem/idempotency_store.hpp"

#include <algorithm>

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

std::size_t IdempotencyStore::purge_expired(const PurgeProgress& progress) {
  const std::size_t purged = purge_expired();
  if (purged > 0 && progress) progress(purged);
  return purged;
}

StoreCounts IdempotencyStore::counts() {
  throw NotSupported("this idempotency store cannot count its records (counts)");
}

std::optional<IdempotencyRecord> IdempotencyStore::wait(std::string_view key, SteadyTime deadline,
                                                        std::stop_token stop) {
  auto delay = std::chrono::milliseconds(2);
  constexpr auto kMaxDelay = std::chrono::milliseconds(200);
  for (;;) {
    auto record = lookup(key);
    const auto now_wall = wait_clock_->wall_now();
    if (!record || record->state != IdempotencyRecord::State::in_progress ||
        record->lease_until <= now_wall) {
      return record;
    }
    const auto now = wait_clock_->steady_now();
    if (now >= deadline || stop.stop_requested()) return record;
    const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    if (!wait_clock_->sleep_for(std::min(delay, remaining), stop)) return record;
    delay = std::min(delay * 2, kMaxDelay);
  }
}

}  // namespace idem
