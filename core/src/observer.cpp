#include "idem/observer.hpp"

#include <atomic>

namespace idem {

namespace {
std::atomic<std::uint64_t> g_observer_failures{0};
}  // namespace

std::string_view to_string(DeliveryOutcome outcome) noexcept {
  switch (outcome) {
    case DeliveryOutcome::processed:
      return "processed";
    case DeliveryOutcome::duplicate:
      return "duplicate";
    case DeliveryOutcome::failed:
      return "failed";
    case DeliveryOutcome::in_progress:
      return "in_progress";
  }
  return "unknown";
}

std::string_view to_string(CallOutcome outcome) noexcept {
  switch (outcome) {
    case CallOutcome::executed:
      return "executed";
    case CallOutcome::joined:
      return "joined";
    case CallOutcome::replayed:
      return "replayed";
    case CallOutcome::failed:
      return "failed";
    case CallOutcome::timed_out:
      return "timed_out";
    case CallOutcome::cancelled:
      return "cancelled";
    case CallOutcome::rejected_circuit_open:
      return "rejected_circuit_open";
    case CallOutcome::rejected_rate_limit:
      return "rejected_rate_limit";
    case CallOutcome::rejected_in_progress:
      return "rejected_in_progress";
    case CallOutcome::rejected_key_reuse:
      return "rejected_key_reuse";
    case CallOutcome::error:
      return "error";
  }
  return "unknown";
}

static_assert(static_cast<std::size_t>(DeliveryOutcome::in_progress) + 1 == kDeliveryOutcomeCount);
static_assert(static_cast<std::size_t>(CallOutcome::error) + 1 == kCallOutcomeCount);

std::uint64_t observer_failures() noexcept {
  return g_observer_failures.load(std::memory_order_relaxed);
}

namespace detail {

void notify(Observer& observer, const DeliveryObservation& observation) noexcept {
  try {
    observer.on_delivery(observation);
  } catch (...) {
    // An observer must never break the delivery it observes.
    g_observer_failures.fetch_add(1, std::memory_order_relaxed);
  }
}

void notify(Observer& observer, const CallObservation& observation) noexcept {
  try {
    observer.on_call(observation);
  } catch (...) {
    g_observer_failures.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace detail
}  // namespace idem
