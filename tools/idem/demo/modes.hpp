// The demo's handler modes, where the consumer's crash falls in each, and what that shows.
//
// The crash falls where it tells the modes apart (--kill-point overrides it):
//   transactional    after the ledger row, before the commit: the row and the marker are one
//                    transaction, so both roll back and the redelivery writes the row once.
//   exclusive        before the side effect, holding the event's claim: the restarted consumer
//                    finds the claim live and waits (in-progress retries) until its lease
//                    passes, so two deliveries of one event never run at once. (After the effect
//                    the event would run again once the lease passed: README, Limitations.)
//   check_then_mark  after the side effect, before the marker: the redelivery finds no marker
//                    and runs the effect again — the window this mode admits.
// An event whose effect ran before the crash and whose marker was not written runs twice; the
// demo's check expects that (and says so) exactly where the mode admits it.
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <string>

#include "../demo.hpp"
#include "idem/handler_options.hpp"

namespace idem::cli::demo {

enum class KillPoint { before_effect, after_effect };

// The claims' lease of the demo's consumers (HandlerOptions::lease): long enough that the
// restarted consumer, even a slow one, usually finds a killed consumer's claim still live.
inline constexpr std::chrono::milliseconds kLease{3000};

// InvalidArgument for an unknown name.
HandlerMode parse_mode(const std::string& mode);
KillPoint parse_kill_point(const DemoOptions& options, HandlerMode mode);
const char* kill_point_name(KillPoint point);

// True when the crash cannot make an effect run twice: transactional mode, or before the effect.
bool effects_once(HandlerMode mode, KillPoint point);

// Where the crash falls, for the demo's header ("inside the transaction, after ...").
std::string kill_description(HandlerMode mode, KillPoint point);

// Why the result came out as it did, a few lines of at most 80 columns, indented by 4;
// `in_progress` is how often a delivery found another's claim live.
std::string mode_explanation(HandlerMode mode, KillPoint point, unsigned long long in_progress);

}  // namespace idem::cli::demo
