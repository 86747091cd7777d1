// HandlerOptions: how an IdempotentHandler runs (handler.hpp has what each mode guarantees).
//
// Options are plain values: a handler copies them at construction and never reads them again.
//
// Thread-safety: plain values (the clock, outbox and observer they point to are thread-safe
// themselves).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "idem/clock.hpp"
#include "idem/error.hpp"
#include "idem/observer.hpp"

namespace idem {

class Outbox;

enum class HandlerMode {
  automatic,        // exclusive when recorder->supports_claims(), else check_then_mark
  check_then_mark,  // is_processed → drop; else handle; success → mark_processed
  exclusive,        // atomic claim with a lease before handle; concurrent duplicate → throws
                    // AlreadyInProgress
  transactional,    // handle and marker commit in one recorder transaction
};
std::string_view to_string(HandlerMode mode) noexcept;

struct HandlerOptions {
  // Which protocol to run. Default: automatic (exclusive when the recorder supports claims).
  HandlerMode mode = HandlerMode::automatic;
  // Exclusive mode: the claim's lease, renewed every lease/3 while handle runs. It only has to
  // outlive a stalled renewal, not the handler. Must be positive. Default 30 s.
  Millis lease = std::chrono::seconds(30);
  // Time for the heartbeat schedule. Default (null): idem::system_clock(). (Lease deadlines
  // themselves are computed by the recorder with its own clock.)
  std::shared_ptr<Clock> clock = nullptr;
  // Transactional mode only (ConfigError otherwise): events the handler publishes are written to
  // this outbox, on the recorder's database, in the handler's transaction, and relayed after the
  // commit by an OutboxRelay (idem/outbox.hpp). An event published with an empty id gets
  // follow_up_id(consumer, incoming event id, n), n counting the run's publishes from 0. Default
  // (null): held back and handed to the caller's BusProxy after the commit.
  std::shared_ptr<Outbox> outbox = nullptr;
  // Told what every delivery came to and how long `handle` ran (observer.hpp), e.g. an
  // idem::Metrics; durations on `clock`. Default (null): none (one null check per delivery).
  std::shared_ptr<Observer> observer = nullptr;
};

// Exclusive mode: handle ran, but complete() refused the token because another delivery took
// the claim over after this one's lease lapsed (a stall longer than the lease). This delivery did
// not write the marker, and the new owner may run the side effect as well. Retryable (redeliver:
// the event is then dropped once the new owner completes) and in doubt (the side effect ran).
class LeaseLost : public Error {
 public:
  explicit LeaseLost(const std::string& message)
      : Error(ErrorCode::already_in_progress, message, /*retryable=*/true, /*in_doubt=*/true) {}
};

}  // namespace idem
