// idem's core in one include: both faces of the blocking library, without any backend, broker or
// Asio. Include a concept's own header instead to keep compile times down; this one is for
// programs and examples that use much of it.
//
// Consumer face (events delivered at least once, side effects run once):
//   event.hpp            Event, new_event_id()
//   recorder.hpp         IdempotencyRecorder: is_processed / mark_processed, claims, transactions
//   memory_recorder.hpp  the in-process recorder
//   handler.hpp          IdempotentHandler and its modes (options: handler_options.hpp)
//   event_handler.hpp    EventHandler and BusProxy, what a transport calls
//   bus.hpp              the in-process Bus
//   outbox.hpp, sql.hpp  follow-up events in the handler's transaction; the SQL transaction
// Operation face (a call per key: join, replay, execute):
//   resilient.hpp        resilient(): retries, timeout, validation, breaker, fallbacks, keys
//   operation.hpp        operation(): the same as a builder
//   idempotency_store.hpp, memory_store.hpp, idempotency.hpp   the store protocol, the in-process
//                        store, and the coordinator under both
//   retry.hpp, timeout.hpp, validation.hpp, circuit_breaker.hpp, fallback.hpp, rate_limit.hpp,
//   report.hpp, events.hpp, operation_result.hpp, fingerprint.hpp, key.hpp, codec.hpp
// Shared: clock.hpp (injected time), error.hpp (the error taxonomy), wrapper.hpp (decorators),
//   observer.hpp, metrics.hpp, prometheus.hpp (what both faces did, as counters and histograms
//   in the Prometheus text format).
//
// Thread-safety: as each header states; every recorder, store, handler and resilient callable
// is safe to share between threads.
#pragma once

#include "idem/bus.hpp"
#include "idem/call_options.hpp"
#include "idem/circuit_breaker.hpp"
#include "idem/clock.hpp"
#include "idem/codec.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/event_handler.hpp"
#include "idem/events.hpp"
#include "idem/fallback.hpp"
#include "idem/fingerprint.hpp"
#include "idem/handler.hpp"
#include "idem/handler_options.hpp"
#include "idem/idempotency.hpp"
#include "idem/idempotency_policy.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/key.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/memory_store.hpp"
#include "idem/metrics.hpp"
#include "idem/observer.hpp"
#include "idem/operation.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/operation_result.hpp"
#include "idem/outbox.hpp"
#include "idem/prometheus.hpp"
#include "idem/purge_progress.hpp"
#include "idem/rate_limit.hpp"
#include "idem/recorder.hpp"
#include "idem/report.hpp"
#include "idem/resilient.hpp"
#include "idem/retry.hpp"
#include "idem/sql.hpp"
#include "idem/timeout.hpp"
#include "idem/validation.hpp"
#include "idem/wrapper.hpp"
