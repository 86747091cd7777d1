// The demo's results (report.hpp).
#include "report.hpp"

#include <fstream>
#include <iostream>

#include "file_queue.hpp"

namespace idem::cli::demo {

std::string counted(std::uint64_t n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

FirstHop tally_first_hop(const DeliveryStats& stats, const std::filesystem::path& dir,
                         IdempotencyRecorder& recorder, HandlerMode mode, const std::string& ledger,
                         const std::string& consumer) {
  FirstHop hop;
  hop.stats = stats;
  const HopFiles files = hop_files(dir, 1);
  for (const Event& event : read_queue(files.queue))
    hop.published.insert(event.id);
  // Markers: every published event must be processed in the recorder (asked through the same
  // interface on every backend).
  for (const std::string& id : hop.published) {
    if (recorder.is_processed(consumer, id)) ++hop.markers;
  }
  if (mode == HandlerMode::transactional) {
    const LedgerCount count = count_ledger(recorder, ledger, consumer);
    hop.side_effects = count.rows;
    hop.distinct_side_effects = count.distinct_events;
    return hop;
  }
  std::ifstream in(files.side_effects);
  std::set<std::string> ids;
  std::string line;
  while (std::getline(in, line)) {
    ++hop.side_effects;
    ids.insert(line);
  }
  hop.distinct_side_effects = static_cast<std::int64_t>(ids.size());
  return hop;
}

bool report_results(const DemoOptions& options, HandlerMode mode, KillPoint point,
                    std::uint64_t stream_size, const FirstHop& first,
                    const std::optional<SecondHop>& second) {
  const DeliveryStats& stats = first.stats;
  const std::int64_t twice = first.side_effects - first.distinct_side_effects;
  std::cout << "\nresults\n"
            << "  events published           " << stream_size << "\n"
            << "  distinct events            " << options.events << "\n"
            << "  deliveries                 " << stats.deliveries << "\n"
            << "  redeliveries after crash   " << stats.redeliveries << "\n"
            << "  duplicates dropped         " << stats.duplicates_dropped << "\n"
            << "  in-progress retries        " << stats.in_progress_retries << "\n"
            << "  handlers completed         " << stats.processed << "\n"
            << "  side effects               " << first.side_effects << "\n"
            << "  events run twice           " << twice << "\n"
            << "  events marked processed    " << first.markers << "\n";
  if (second) {
    const SecondHop& h = *second;
    std::cout << "  follow-ups in the outbox   " << h.follow_ups << "\n"
              << "  relayed (published)        " << h.relayed << "\n"
              << "  relayed again after crash  " << (h.relayed - h.distinct_relayed) << "\n"
              << "  shipping deliveries        " << h.stats.deliveries << "\n"
              << "  shipping redeliveries      " << h.stats.redeliveries << "\n"
              << "  duplicates dropped (ship)  " << h.stats.duplicates_dropped << "\n"
              << "  shipping side effects      " << h.ledger.rows << "\n"
              << "  orders shipped             " << h.ledger.distinct_orders << "\n"
              << "  charges marked shipped     " << h.markers << "\n"
              << "  outbox left                " << h.outbox_left << " waiting, " << h.outbox_parked
              << " parked\n";
  }

  const auto n = static_cast<std::int64_t>(options.events);
  const bool all_once = first.distinct_side_effects == n && first.markers == n;
  const std::string despite =
      "    despite " + counted(stats.redeliveries, "redelivery", "redeliveries") + ", " +
      counted(stream_size - options.events, "published duplicate", "published duplicates") +
      " and a SIGKILL;\n";
  bool ok = false;
  if (effects_once(mode, point)) {
    ok = all_once && first.side_effects == n;
    if (ok) {
      std::cout << "\nOK: side effects == distinct events == " << options.events
                << " (each exactly once)\n"
                << despite;
    }
  } else {
    // The crash fell after an effect and before its marker: that event ran twice, as the mode
    // admits — and nothing else did.
    ok = all_once && twice >= 1;
    if (ok) {
      std::cout << "\nOK: side effects " << first.side_effects << " for " << options.events
                << " distinct events ("
                << counted(static_cast<std::uint64_t>(twice), "event", "events") << " ran twice),\n"
                << despite;
    }
  }
  if (ok) {
    std::cout << mode_explanation(mode, point, stats.in_progress_retries);
  } else {
    std::cout << "\nFAILED: " << first.side_effects << " side effects ("
              << first.distinct_side_effects << " distinct) and " << first.markers
              << " events marked processed\n    for " << options.events << " distinct events\n";
  }
  if (!second) return ok;
  const SecondHop& h = *second;
  const bool shipped_once =
      h.follow_ups == options.events && h.distinct_relayed == options.events &&
      h.ids_deterministic && h.ledger.rows == n && h.ledger.distinct_events == n &&
      h.ledger.distinct_orders == n && h.markers == n && h.outbox_left == 0 && h.outbox_parked == 0;
  if (shipped_once) {
    std::cout << "OK: orders shipped == follow-ups == " << options.events
              << " (each exactly once)\n    despite "
              << counted(h.relayed - h.distinct_relayed, "row", "rows") << " relayed again, "
              << counted(h.stats.redeliveries, "redelivery", "redeliveries")
              << " and a SIGKILL of the relay\n    and of shipping; the outbox is empty.\n";
  } else {
    std::cout << "FAILED: " << h.follow_ups << " follow-ups in the outbox, " << h.distinct_relayed
              << " distinct relayed"
              << (h.ids_deterministic ? "" : " (some not follow_up_id(billing, order, 0))")
              << ",\n    " << h.ledger.rows << " shipping side effects ("
              << h.ledger.distinct_orders << " distinct orders), " << h.markers
              << " charges marked shipped,\n    " << h.outbox_left
              << " rows left in the outbox and " << h.outbox_parked << " parked, for "
              << options.events << " distinct events\n";
  }
  return ok && shipped_once;
}

}  // namespace idem::cli::demo
