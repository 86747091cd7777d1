#include "idem/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>

#include "idem/error.hpp"

namespace idem {

namespace {

std::uint64_t nanos(std::chrono::nanoseconds duration) noexcept {
  return duration.count() > 0 ? static_cast<std::uint64_t>(duration.count()) : 0;
}

// The table's entries by name.
template <class Table>
std::vector<const typename Table::value_type*> sorted(const Table& table) {
  std::vector<const typename Table::value_type*> entries;
  entries.reserve(table.size());
  for (const auto& entry : table)
    entries.push_back(&entry);
  std::sort(entries.begin(), entries.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });
  return entries;
}

}  // namespace

const std::vector<double>& default_duration_buckets() {
  static const std::vector<double>* const buckets =
      new std::vector<double>{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                              0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
  return *buckets;
}

// Counts per bucket and the sum, in atomics: observations never take a lock.
struct Metrics::Histogram {
  explicit Histogram(std::size_t buckets = 0) { resize(buckets); }

  void resize(std::size_t buckets) {
    counts = std::make_unique<std::atomic<std::uint64_t>[]>(buckets);
    size = buckets;
  }

  void observe(std::size_t bucket, std::uint64_t ns) noexcept {
    counts[bucket].fetch_add(1, std::memory_order_relaxed);
    sum_ns.fetch_add(ns, std::memory_order_relaxed);
  }

  HistogramSnapshot read(const std::vector<double>& bounds) const {
    HistogramSnapshot out;
    out.bounds = bounds;
    out.buckets.resize(size);
    for (std::size_t i = 0; i < size; ++i) {
      out.buckets[i] = counts[i].load(std::memory_order_relaxed);
      out.count += out.buckets[i];
    }
    out.sum_seconds = static_cast<double>(sum_ns.load(std::memory_order_relaxed)) / 1e9;
    return out;
  }

  std::unique_ptr<std::atomic<std::uint64_t>[]> counts;
  std::size_t size = 0;
  std::atomic<std::uint64_t> sum_ns{0};
};

struct Metrics::ConsumerSeries {
  explicit ConsumerSeries(std::size_t buckets) : processed(buckets), failed(buckets) {}
  std::array<std::atomic<std::uint64_t>, kDeliveryOutcomeCount> deliveries{};
  Histogram processed;
  Histogram failed;
};

struct Metrics::OperationSeries {
  explicit OperationSeries(std::size_t buckets) {
    for (Histogram& histogram : durations)
      histogram.resize(buckets);
  }
  std::array<std::atomic<std::uint64_t>, kCallOutcomeCount> calls{};
  std::array<Histogram, kCallOutcomeCount> durations;
};

std::size_t Metrics::NameHash::operator()(std::string_view name) const noexcept {
  return std::hash<std::string_view>{}(name);
}

Metrics::Metrics(MetricsOptions options)
    : bounds_(options.buckets.empty() ? default_duration_buckets() : std::move(options.buckets)) {
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || bounds_[i] <= 0 || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      throw InvalidArgument(
          "MetricsOptions::buckets must be finite, positive and increasing (seconds)");
    }
  }
  thresholds_ns_.reserve(bounds_.size());
  for (double bound : bounds_)
    thresholds_ns_.push_back(static_cast<std::uint64_t>(std::llround(bound * 1e9)));
}

Metrics::~Metrics() = default;

std::size_t Metrics::bucket_of(std::uint64_t ns) const noexcept {
  // Bucket i holds (bound[i-1], bound[i]]: the first bound the value does not exceed.
  return static_cast<std::size_t>(
      std::lower_bound(thresholds_ns_.begin(), thresholds_ns_.end(), ns) - thresholds_ns_.begin());
}

template <class Series>
Series& Metrics::series(Table<Series>& table, std::string_view name) {
  {
    std::shared_lock lock(mutex_);
    auto it = table.find(name);
    if (it != table.end()) return *it->second;
  }
  std::unique_lock lock(mutex_);
  auto it = table.find(name);
  if (it == table.end()) {
    it = table.emplace(std::string(name), std::make_unique<Series>(bounds_.size() + 1)).first;
  }
  return *it->second;
}

void Metrics::on_delivery(const DeliveryObservation& observation) {
  ConsumerSeries& s = series(consumers_, observation.consumer);
  s.deliveries[static_cast<std::size_t>(observation.outcome)].fetch_add(1,
                                                                        std::memory_order_relaxed);
  if (!observation.handler_duration) return;
  const std::uint64_t ns = nanos(*observation.handler_duration);
  if (observation.outcome == DeliveryOutcome::processed) {
    s.processed.observe(bucket_of(ns), ns);
  } else if (observation.outcome == DeliveryOutcome::failed) {
    s.failed.observe(bucket_of(ns), ns);
  }
}

void Metrics::on_call(const CallObservation& observation) {
  OperationSeries& s = series(operations_, observation.operation);
  const auto outcome = static_cast<std::size_t>(observation.outcome);
  s.calls[outcome].fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t ns = nanos(observation.duration);
  s.durations[outcome].observe(bucket_of(ns), ns);
}

std::uint64_t ConsumerMetrics::delivered() const noexcept {
  std::uint64_t total = 0;
  for (std::uint64_t n : deliveries)
    total += n;
  return total;
}

const ConsumerMetrics* MetricsSnapshot::consumer(std::string_view name) const noexcept {
  for (const ConsumerMetrics& c : consumers) {
    if (c.consumer == name) return &c;
  }
  return nullptr;
}

const OperationMetrics* MetricsSnapshot::operation(std::string_view name) const noexcept {
  for (const OperationMetrics& o : operations) {
    if (o.operation == name) return &o;
  }
  return nullptr;
}

MetricsSnapshot Metrics::snapshot() const {
  MetricsSnapshot out;
  std::shared_lock lock(mutex_);
  for (const auto* entry : sorted(consumers_)) {
    ConsumerMetrics c;
    c.consumer = entry->first;
    const ConsumerSeries& s = *entry->second;
    for (std::size_t i = 0; i < kDeliveryOutcomeCount; ++i)
      c.deliveries[i] = s.deliveries[i].load(std::memory_order_relaxed);
    c.handler_processed = s.processed.read(bounds_);
    c.handler_failed = s.failed.read(bounds_);
    out.consumers.push_back(std::move(c));
  }
  for (const auto* entry : sorted(operations_)) {
    OperationMetrics o;
    o.operation = entry->first;
    const OperationSeries& s = *entry->second;
    for (std::size_t i = 0; i < kCallOutcomeCount; ++i) {
      o.calls[i] = s.calls[i].load(std::memory_order_relaxed);
      o.durations[i] = s.durations[i].read(bounds_);
    }
    out.operations.push_back(std::move(o));
  }
  out.observer_failures = observer_failures();
  return out;
}

void Metrics::write_prometheus(PrometheusWriter& out) const {
  const MetricsSnapshot snap = snapshot();
  using Type = PrometheusWriter::Type;

  out.family("idem_consumer_deliveries_total", Type::counter,
             "Deliveries an idempotent consumer handled, by outcome (processed, duplicate "
             "dropped, failed, in_progress: another delivery holds the claim).");
  for (const ConsumerMetrics& c : snap.consumers) {
    for (std::size_t i = 0; i < kDeliveryOutcomeCount; ++i) {
      out.sample(
          "idem_consumer_deliveries_total",
          {{"consumer", c.consumer}, {"outcome", to_string(static_cast<DeliveryOutcome>(i))}},
          c.deliveries[i]);
    }
  }
  out.family("idem_consumer_handler_duration_seconds", Type::histogram,
             "How long an idempotent consumer's handle ran, by outcome.");
  for (const ConsumerMetrics& c : snap.consumers) {
    out.histogram("idem_consumer_handler_duration_seconds",
                  {{"consumer", c.consumer}, {"outcome", "processed"}}, c.handler_processed.bounds,
                  c.handler_processed.buckets, c.handler_processed.sum_seconds);
    out.histogram("idem_consumer_handler_duration_seconds",
                  {{"consumer", c.consumer}, {"outcome", "failed"}}, c.handler_failed.bounds,
                  c.handler_failed.buckets, c.handler_failed.sum_seconds);
  }
  out.family("idem_operation_calls_total", Type::counter,
             "Calls of a resilient operation, by outcome.");
  for (const OperationMetrics& o : snap.operations) {
    for (std::size_t i = 0; i < kCallOutcomeCount; ++i) {
      out.sample("idem_operation_calls_total",
                 {{"operation", o.operation}, {"outcome", to_string(static_cast<CallOutcome>(i))}},
                 o.calls[i]);
    }
  }
  out.family("idem_operation_call_duration_seconds", Type::histogram,
             "How long calls of a resilient operation took, by outcome.");
  for (const OperationMetrics& o : snap.operations) {
    for (std::size_t i = 0; i < kCallOutcomeCount; ++i) {
      const HistogramSnapshot& h = o.durations[i];
      if (h.count == 0) continue;
      out.histogram(
          "idem_operation_call_duration_seconds",
          {{"operation", o.operation}, {"outcome", to_string(static_cast<CallOutcome>(i))}},
          h.bounds, h.buckets, h.sum_seconds);
    }
  }
  out.family("idem_observer_failures_total", Type::counter,
             "Exceptions idem observers threw (swallowed) in this process.");
  out.sample("idem_observer_failures_total", {}, snap.observer_failures);
}

std::string Metrics::prometheus() const {
  PrometheusWriter out;
  write_prometheus(out);
  return out.take();
}

}  // namespace idem
