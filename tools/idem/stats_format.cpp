#include "stats_format.hpp"

#include "idem/prometheus.hpp"

namespace idem::cli {

std::optional<StatsFormat> parse_stats_format(std::string_view name) {
  if (name == "text") return StatsFormat::text;
  if (name == "json") return StatsFormat::json;
  if (name == "prometheus") return StatsFormat::prometheus;
  return std::nullopt;
}

std::string stats_prometheus(const StatsReading& reading) {
  using Type = PrometheusWriter::Type;
  PrometheusWriter out;
  if (reading.consumers) {
    out.family("idem_recorder_markers", Type::gauge,
               "Processed markers a recorder holds per consumer (not yet purged).");
    for (const auto& c : *reading.consumers)
      out.sample("idem_recorder_markers", {{"consumer", c.consumer}}, c.processed);
    out.family("idem_recorder_live_claims", Type::gauge,
               "Exclusive-mode claims under a live lease per consumer (deliveries being handled).");
    for (const auto& c : *reading.consumers)
      out.sample("idem_recorder_live_claims", {{"consumer", c.consumer}}, c.in_progress);
  }
  if (reading.records) {
    const StoreCounts& r = *reading.records;
    out.family("idem_store_records", Type::gauge,
               "Idempotency store records by state: in_progress (live lease), abandoned (lease "
               "ended), completed (replayed), expired (awaiting purge).");
    out.sample("idem_store_records", {{"state", "in_progress"}}, r.in_progress);
    out.sample("idem_store_records", {{"state", "abandoned"}}, r.abandoned);
    out.sample("idem_store_records", {{"state", "completed"}}, r.completed);
    out.sample("idem_store_records", {{"state", "expired"}}, r.expired);
  }
  if (reading.outbox) {
    const OutboxStats& o = *reading.outbox;
    out.family("idem_outbox_rows", Type::gauge,
               "Outbox rows waiting to be relayed, and rows parked after repeated refusals.");
    out.sample("idem_outbox_rows", {{"state", "waiting"}}, o.depth);
    out.sample("idem_outbox_rows", {{"state", "parked"}}, o.parked);
    if (o.oldest_age) {
      out.family("idem_outbox_oldest_age_seconds", Type::gauge,
                 "Age of the oldest waiting outbox row (database clock).");
      out.sample("idem_outbox_oldest_age_seconds", {},
                 static_cast<double>(o.oldest_age->count()) / 1000.0);
    }
  }
  return out.take();
}

}  // namespace idem::cli
