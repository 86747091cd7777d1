// The decisions of an idempotent handler, shared by the blocking IdempotentHandler (handler.hpp)
// and the coroutine AsyncIdempotentHandler (idem/async/handler.hpp), so both faces run the same
// protocol with the same errors. Internal: the handlers' own building blocks.
//
// Thread safety: the free functions are pure; a CheckMarkWindow belongs to one batch call.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/observer.hpp"
#include "idem/recorder.hpp"

namespace idem::detail {

// The mode a handler runs (automatic resolved by what the recorder can do), after the checks:
// NotSupported when the recorder lacks the mode's capability, ConfigError for a non-positive
// lease in exclusive mode.
HandlerMode resolve_handler_mode(HandlerMode requested, bool claims, bool transactions,
                                 Millis lease);

// Exclusive mode, after claim(): true to run the handler (acquired), false for a duplicate
// (processed); throws AlreadyInProgress when another delivery holds a live lease.
bool claim_says_run(const Claim& claim, std::string_view consumer, std::string_view event_id);

// Exclusive mode: complete() refused the token (the claim was taken over).
[[noreturn]] void throw_lease_lost(std::string_view consumer, std::string_view event_id);

// What a delivery that threw `error` came to: in_progress for AlreadyInProgress (another
// delivery holds the claim), else failed.
DeliveryOutcome failure_outcome(const std::exception_ptr& error) noexcept;

// Tells `observer` what one delivery came to (swallowing what it throws).
void observe_delivery(Observer& observer, std::string_view consumer, const Event& event,
                      DeliveryOutcome outcome,
                      std::optional<std::chrono::nanoseconds> handler_duration) noexcept;

// Tells `observer` what each delivery of a batch came to; handler_durations[i] is how long
// `handle` ran for events[i] (unset: it did not run).
void observe_batch(
    Observer& observer, std::string_view consumer, std::span<const Event> events,
    const std::vector<HandleOutcome>& outcomes,
    const std::vector<std::optional<std::chrono::nanoseconds>>& handler_durations) noexcept;

// check_then_mark over a window of deliveries: one check for the window, handle for each event
// not processed yet (a repeat of an id that succeeded earlier in the window is a duplicate), one
// mark for the successes. The caller does the recorder calls and runs the handler; this keeps
// the bookkeeping:
//
//   CheckMarkWindow w(events);
//   try { processed = is_processed_many(consumer, w.ids()); } catch (...) { w.fail_checked(); }
//   for (k < w.ids().size()) if (w.should_run(k, processed)) { try { handle(w.event(k));
//       w.succeeded(k); } catch (...) { w.failed(k); } }
//   try { mark_processed_many(consumer, w.to_mark()); w.marked(); } catch (...) { w.mark_failed();
//   } return w.take();
class CheckMarkWindow {
 public:
  // Validates every event id; an invalid one fails alone (InvalidKey as its outcome).
  explicit CheckMarkWindow(std::span<const Event> events);

  // The valid ids, in window order (what to check).
  const std::vector<std::string>& ids() const noexcept { return ids_; }
  const Event& event(std::size_t k) const noexcept { return events_[positions_[k]]; }

  // The check failed: every checked event gets the current exception (call from a catch).
  void fail_checked();
  // Whether the k-th checked event runs; false records it as a duplicate.
  bool should_run(std::size_t k, const std::vector<bool>& processed);
  void succeeded(std::size_t k);
  // The k-th event's handler failed with `error` (default: the current exception).
  void failed(std::size_t k, std::exception_ptr error = std::current_exception());

  // The ids whose handler succeeded (what to mark).
  const std::vector<std::string>& to_mark() const noexcept { return to_mark_; }
  // They are marked: each is processed.
  void marked();
  // The mark failed: each succeeded event gets the current exception (its side effect ran but
  // may be unmarked; the transport redelivers it — check_then_mark's window).
  void mark_failed();

  std::vector<HandleOutcome> take() { return std::move(outcomes_); }

 private:
  std::span<const Event> events_;
  std::vector<HandleOutcome> outcomes_;
  std::vector<std::string> ids_;
  std::vector<std::size_t> positions_;
  std::set<std::string_view> handled_;
  std::vector<std::string> to_mark_;
  std::vector<std::size_t> marked_positions_;
};

}  // namespace idem::detail
