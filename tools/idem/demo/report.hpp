// The demo's results: what the processes left, counted, and the verdict on it.
//
// tally_first_hop() counts billing's side effects (the ledger rows in transactional mode, else
// the lines of side_effects.log) and asks the recorder which published events are marked
// processed. report_results() prints the result table and one verdict per hop: each event's
// effect once — or, where the crash fell between an effect and its marker in a mode that admits
// that (modes.hpp), the killed event's effect twice, said as such — and why, in a line or two.
//
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "../demo.hpp"
#include "delivery_log.hpp"
#include "hops.hpp"
#include "idem/recorder.hpp"
#include "modes.hpp"

namespace idem::cli::demo {

struct FirstHop {
  DeliveryStats stats;
  std::int64_t side_effects = 0;
  std::int64_t distinct_side_effects = 0;
  std::int64_t markers = 0;
  std::set<std::string> published;  // the distinct events published
};

FirstHop tally_first_hop(const DeliveryStats& stats, const std::filesystem::path& dir,
                         IdempotencyRecorder& recorder, HandlerMode mode, const std::string& ledger,
                         const std::string& consumer);

// Prints the result table and the verdicts; true when every check passed.
bool report_results(const DemoOptions& options, HandlerMode mode, KillPoint point,
                    std::uint64_t stream_size, const FirstHop& first,
                    const std::optional<SecondHop>& second);

// "1 redelivery", "2 redeliveries".
std::string counted(std::uint64_t n, const std::string& one, const std::string& many);

}  // namespace idem::cli::demo
