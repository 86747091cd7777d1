// CallOptions: per-call settings of a resilient operation.
//
// They only concern the idempotency layer's waiting: a caller that joins an execution already in
// flight (or waits for another process's owner) may give up — on its stop token (Cancelled) or at
// its deadline (TimeoutError). Giving up never cancels the execution it was waiting for, and a
// caller that ends up executing is not affected (its attempts have their own timeout).
//
//   auto result = create_payment.call_with({.wait_deadline = clock->steady_now() + 2s},
//                                          "request-123", 2499);
//
// Thread-safety: a plain value.
#pragma once

#include <optional>
#include <stop_token>

#include "idem/clock.hpp"

namespace idem {

struct CallOptions {
  // Requested: a waiting caller stops waiting with idem::Cancelled. Default: never requested.
  std::stop_token stop{};
  // A waiting caller gives up at this steady time of the operation's clock with
  // idem::TimeoutError. Default: none (the in-progress policy's max_wait still applies).
  std::optional<SteadyTime> wait_deadline{};
};

}  // namespace idem
