// Metrics: an Observer (observer.hpp) that keeps counters and duration histograms per consumer
// and per operation, and writes them in the Prometheus text format.
//
//   auto metrics = std::make_shared<idem::Metrics>();
//   ChargeCard handler("billing", recorder, {.observer = metrics});
//   auto charge = idem::resilient(fn, {.name = "charge", .observer = metrics, ...});
//   ...
//   std::string text = metrics->prometheus();   // serve it on /metrics, or write a textfile
//
// The families (docs/observability.md has them with PromQL examples):
//   idem_consumer_deliveries_total{consumer, outcome}         counter; outcome processed,
//       duplicate, failed, in_progress (every outcome is written, zeros too). Deliveries:
//       sum by (consumer).
//   idem_consumer_handler_duration_seconds{consumer, outcome} histogram of how long `handle`
//       ran; outcome processed or failed.
//   idem_operation_calls_total{operation, outcome}            counter; outcome executed, joined,
//       replayed, failed, timed_out, cancelled, rejected_circuit_open, rejected_rate_limit,
//       rejected_in_progress, rejected_key_reuse, error (every outcome is written, zeros too).
//   idem_operation_call_duration_seconds{operation, outcome}  histogram of call durations, for
//       each outcome that occurred.
//   idem_observer_failures_total                              exceptions observers threw.
// A consumer or operation appears once it has been observed; names are label values, escaped.
//
// Buckets: MetricsOptions::buckets (seconds, increasing); the default runs from 100 µs to 60 s.
//
// Thread-safety: on_delivery / on_call may be called from any number of threads at once: the
// first observation of a name takes a lock, later ones only update atomic counters. snapshot()
// and prometheus() may run concurrently with them; a snapshot is not one instant (counters
// updated meanwhile may or may not be in it), but each histogram's _count equals its +Inf
// bucket.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "idem/observer.hpp"
#include "idem/prometheus.hpp"

namespace idem {

struct MetricsOptions {
  // Upper bounds of the duration histograms' buckets, in seconds: finite, positive, increasing.
  // Default: 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
  // 1, 2.5, 5, 10, 30, 60.
  std::vector<double> buckets{};
};

// One histogram as snapshot() reads it.
struct HistogramSnapshot {
  std::vector<double> bounds;          // upper bounds, seconds
  std::vector<std::uint64_t> buckets;  // observations per bucket (not cumulative); last: > every
                                       // bound
  std::uint64_t count = 0;             // the sum of `buckets`
  double sum_seconds = 0;
};

struct ConsumerMetrics {
  std::string consumer;
  std::array<std::uint64_t, kDeliveryOutcomeCount> deliveries{};  // by DeliveryOutcome
  HistogramSnapshot handler_processed;  // how long `handle` ran for processed deliveries
  HistogramSnapshot handler_failed;     // ... and for deliveries whose `handle` threw
  std::uint64_t delivered() const noexcept;
  std::uint64_t count(DeliveryOutcome outcome) const noexcept {
    return deliveries[static_cast<std::size_t>(outcome)];
  }
};

struct OperationMetrics {
  std::string operation;
  std::array<std::uint64_t, kCallOutcomeCount> calls{};        // by CallOutcome
  std::array<HistogramSnapshot, kCallOutcomeCount> durations;  // by CallOutcome
  std::uint64_t count(CallOutcome outcome) const noexcept {
    return calls[static_cast<std::size_t>(outcome)];
  }
};

struct MetricsSnapshot {
  std::vector<ConsumerMetrics> consumers;    // by name
  std::vector<OperationMetrics> operations;  // by name
  std::uint64_t observer_failures = 0;       // idem::observer_failures()

  // The consumer or operation named `name`; null when it was never observed.
  const ConsumerMetrics* consumer(std::string_view name) const noexcept;
  const OperationMetrics* operation(std::string_view name) const noexcept;
};

class Metrics final : public Observer {
 public:
  // Throws InvalidArgument for bucket bounds that are not finite, positive and increasing.
  explicit Metrics(MetricsOptions options = {});
  ~Metrics() override;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  void on_delivery(const DeliveryObservation& observation) override;
  void on_call(const CallObservation& observation) override;

  MetricsSnapshot snapshot() const;
  // Appends the families above to `out`.
  void write_prometheus(PrometheusWriter& out) const;
  // The families above as one text.
  std::string prometheus() const;

  const std::vector<double>& buckets() const noexcept { return bounds_; }

 private:
  struct Histogram;
  struct ConsumerSeries;
  struct OperationSeries;
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view name) const noexcept;
  };
  template <class Series>
  using Table = std::unordered_map<std::string, std::unique_ptr<Series>, NameHash, std::equal_to<>>;

  template <class Series>
  Series& series(Table<Series>& table, std::string_view name);
  // The bucket of a duration (bounds_.size() for one above every bound).
  std::size_t bucket_of(std::uint64_t ns) const noexcept;

  std::vector<double> bounds_;
  std::vector<std::uint64_t> thresholds_ns_;  // bounds_ in nanoseconds
  mutable std::shared_mutex mutex_;           // guards the tables, not the counters in them
  Table<ConsumerSeries> consumers_;
  Table<OperationSeries> operations_;
};

// The default bucket bounds (MetricsOptions::buckets), seconds.
const std::vector<double>& default_duration_buckets();

}  // namespace idem
