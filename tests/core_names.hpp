// The core names idem's unit tests use (the bus, handlers, metrics, the test clock), brought in
// with `using namespace idem::test::core_names;` instead of a list of using-declarations in
// every file, as the integration tests' per-backend names headers do.
#pragma once

#include <chrono>

#include "idem/bus.hpp"
#include "idem/event.hpp"
#include "idem/event_handler.hpp"
#include "idem/handler_options.hpp"
#include "idem/metrics.hpp"
#include "idem/observer.hpp"
#include "idem/prometheus.hpp"
#include "idem/testing/manual_clock.hpp"

namespace idem::test::core_names {

using idem::Bus;
using idem::BusOptions;
using idem::BusProxy;
using idem::CallOutcome;
using idem::CollectingBusProxy;
using idem::DeadLetter;
using idem::DeliveryOutcome;
using idem::Event;
using idem::HandleOutcome;
using idem::HandleResult;
using idem::HandlerMode;
using idem::HandlerOptions;
using idem::Metrics;
using idem::PrometheusWriter;
using idem::testing::ManualClock;
using namespace std::chrono_literals;

}  // namespace idem::test::core_names
