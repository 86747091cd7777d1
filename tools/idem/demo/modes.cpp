// The demo's modes and kill points (modes.hpp).
#include "modes.hpp"

#include "idem/error.hpp"

namespace idem::cli::demo {

HandlerMode parse_mode(const std::string& mode) {
  if (mode == "transactional") return HandlerMode::transactional;
  if (mode == "exclusive") return HandlerMode::exclusive;
  if (mode == "check_then_mark") return HandlerMode::check_then_mark;
  throw InvalidArgument("unknown mode '" + mode +
                        "' (expected transactional, exclusive or check_then_mark)");
}

KillPoint parse_kill_point(const DemoOptions& options, HandlerMode mode) {
  if (options.kill_point == "before-effect") return KillPoint::before_effect;
  if (options.kill_point == "after-effect") return KillPoint::after_effect;
  if (!options.kill_point.empty()) {
    throw InvalidArgument("unknown --kill-point '" + options.kill_point +
                          "' (expected before-effect or after-effect)");
  }
  return mode == HandlerMode::exclusive ? KillPoint::before_effect : KillPoint::after_effect;
}

const char* kill_point_name(KillPoint point) {
  return point == KillPoint::before_effect ? "before-effect" : "after-effect";
}

bool effects_once(HandlerMode mode, KillPoint point) {
  return mode == HandlerMode::transactional || point == KillPoint::before_effect;
}

std::string kill_description(HandlerMode mode, KillPoint point) {
  if (mode == HandlerMode::transactional) {
    return point == KillPoint::after_effect
               ? "in the transaction, after the ledger row, before the commit"
               : "in the transaction, before the ledger row";
  }
  const std::string marker = mode == HandlerMode::exclusive ? "complete()" : "the marker";
  return point == KillPoint::after_effect ? "after the side effect, before " + marker
                                          : "in the handler, before the side effect";
}

std::string mode_explanation(HandlerMode mode, KillPoint point, unsigned long long in_progress) {
  const std::string waits =
      std::to_string(in_progress) + " in-progress " + (in_progress == 1 ? "retry" : "retries");
  if (mode == HandlerMode::transactional) {
    return "    transactional: the ledger row and the marker are one transaction;\n"
           "    the crash rolled both back, so the redelivery wrote the row once.\n";
  }
  if (mode == HandlerMode::exclusive) {
    const std::string held =
        in_progress > 0
            ? "    exclusive: the dead consumer's claim held its event until its lease\n"
              "    passed (" +
                  waits + "), so no two deliveries ran it at once.\n"
            : "    exclusive: the dead consumer's claim had expired (lease " +
                  std::to_string(kLease.count() / 1000) +
                  " s) when its event\n"
                  "    came again; while a claim is live, no other delivery runs "
                  "its event.\n";
    if (point == KillPoint::before_effect) {
      return held +
             "    A crash after the effect would run it again (--kill-point after-effect).\n";
    }
    return "    what exclusive admits: the crash fell between the effect and complete();\n"
           "    once the claim's lease passed (" +
           waits +
           "),\n"
           "    the redelivery ran it again. transactional mode closes this window.\n";
  }
  if (point == KillPoint::before_effect) {
    return "    check_then_mark: the crash fell before the effect, so its redelivery\n"
           "    ran it once; a crash after it runs it twice (the default kill point).\n";
  }
  return "    what check_then_mark admits: the crash fell between the effect and its\n"
         "    marker, so the redelivery found no marker and ran it again. exclusive\n"
         "    keeps concurrent deliveries apart; transactional closes this window.\n";
}

}  // namespace idem::cli::demo
