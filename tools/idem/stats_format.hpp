// `idem stats --format prometheus`: what a recorder, a store and an outbox hold, as Prometheus
// gauges (the text a node_exporter textfile collector or a scrape reads), written through
// idem::PrometheusWriter. docs/cli.md lists the families.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/idempotency_store.hpp"
#include "idem/outbox.hpp"
#include "idem/recorder.hpp"

namespace idem::cli {

enum class StatsFormat { text, json, prometheus };

// "text", "json" or "prometheus"; nullopt for anything else.
std::optional<StatsFormat> parse_stats_format(std::string_view name);

// What `idem stats` read (an unset face is absent in the URL's database).
struct StatsReading {
  std::optional<std::vector<ConsumerCounts>> consumers;
  std::optional<StoreCounts> records;
  std::optional<OutboxStats> outbox;
};

// The reading as Prometheus text: idem_recorder_markers{consumer},
// idem_recorder_live_claims{consumer}, idem_store_records{state},
// idem_outbox_rows{state="waiting"|"parked"}, idem_outbox_oldest_age_seconds. A face that is
// absent writes no family.
std::string stats_prometheus(const StatsReading& reading);

}  // namespace idem::cli
