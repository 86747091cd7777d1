// HandlerCore: the mode logic of IdempotentHandler, compiled once for every Payload type.
// Internal: IdempotentHandler (handler.hpp) is the public face.
//
// Thread-safety: run() and run_batch() may be called from many threads at once.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"
#include "idem/codec.hpp"
#include "idem/detail/lease_renewer.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/event_handler.hpp"
#include "idem/handler_options.hpp"
#include "idem/observer.hpp"
#include "idem/recorder.hpp"

namespace idem {

namespace detail {

// The mode logic of IdempotentHandler, compiled once for every Payload type.
class HandlerCore {
 public:
  HandlerCore(std::string consumer, std::shared_ptr<IdempotencyRecorder> recorder,
              HandlerOptions options);
  HandlerCore(const HandlerCore&) = delete;
  HandlerCore& operator=(const HandlerCore&) = delete;

  const std::string& consumer() const noexcept { return consumer_; }
  HandlerMode mode() const noexcept { return mode_; }

  // Runs the protocol of mode() around `invoke`, which decodes the payload and calls handle
  // with the proxy it is given.
  HandleResult run(const Event& event, BusProxy& bus, const std::function<void(BusProxy&)>& invoke);

  // The batch form (EventHandler::handle_batch): check_then_mark checks and marks the window
  // with one recorder call each; the other modes run() each event.
  std::vector<HandleOutcome> run_batch(std::span<const Event> events, BusProxy& bus,
                                       const std::function<void(const Event&, BusProxy&)>& invoke);

 private:
  // run() without the observer, and with it (handle timed, the outcome told).
  HandleResult run_unobserved(const Event& event, BusProxy& bus,
                              const std::function<void(BusProxy&)>& invoke);
  HandleResult run_observed(const Event& event, BusProxy& bus,
                            const std::function<void(BusProxy&)>& invoke);
  std::vector<HandleOutcome> run_batch_check_then_mark(
      std::span<const Event> events, BusProxy& bus,
      const std::function<void(const Event&, BusProxy&)>& invoke);
  HandleResult run_check_then_mark(const Event& event, BusProxy& bus,
                                   const std::function<void(BusProxy&)>& invoke);
  HandleResult run_exclusive(const Event& event, BusProxy& bus,
                             const std::function<void(BusProxy&)>& invoke);
  HandleResult run_transactional(const Event& event, BusProxy& bus,
                                 const std::function<void(BusProxy&)>& invoke);
  // ConfigError in a child of fork(): the handler (its recorder, its renewal thread) is the
  // parent's.
  void check_process() const;

  std::string consumer_;
  std::shared_ptr<IdempotencyRecorder> recorder_;
  HandlerMode mode_;
  Millis lease_;
  std::shared_ptr<Clock> clock_;
  std::shared_ptr<Outbox> outbox_;
  std::shared_ptr<Observer> observer_;
  // Exclusive mode's lease renewals. Last: its thread stops before the members it uses go.
  LeaseRenewer renewer_;
};

// Codec<Payload>::decode, with any failure reported as DecodeError naming the event.
[[noreturn]] void throw_payload_decode_error(const Event& event, std::string_view consumer,
                                             std::string_view reason);

template <class Payload>
Payload decode_payload(const Event& event, std::string_view consumer) {
  static_assert(HasCodec<Payload>,
                "no idem::Codec for this Payload: give it to_json/from_json or specialise "
                "idem::Codec");
  try {
    return Codec<Payload>::decode(event.payload);
  } catch (const Error& e) {
    throw_payload_decode_error(event, consumer, e.what());
  } catch (const std::exception& e) {
    throw_payload_decode_error(event, consumer, e.what());
  }
}

}  // namespace detail

}  // namespace idem
