// The demo's hops: each a process started, killed with SIGKILL at a point chosen in advance, and
// restarted, while the demo follows its delivery log on a progress line.
//
//   run_consumer_hop   a consumer (billing on order.paid, or shipping on order.charged): killed
//                      inside a handler at --kill-at of its stream, restarted, run to the end.
//   run_second_hop     --hops 2: the relay (killed once after a pass was published and before
//                      its rows were deleted, then restarted until the outbox is empty), then
//                      shipping as above.
// Each returns what the processes left, or nothing (after saying why on stderr) when a process
// did not behave. A signal unwinds through them as Interrupted: the running child is killed.
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
#include "idem/outbox.hpp"
#include "idem/recorder.hpp"
#include "ledger.hpp"
#include "modes.hpp"
#include "supervisor.hpp"

namespace idem::cli::demo {

// What every hop needs to start its processes.
struct HopContext {
  const DemoOptions& options;
  std::filesystem::path dir;
  ChildEnvironment environment;  // the store URL (namespace applied) and the broker URL
  std::string ledger;
  KillPoint kill_point;
};

// One consumer's process names: `who` in messages ("consumer", "billing", "shipping") and the
// phases of its first and restarted process.
struct ConsumerHop {
  std::string consumer;  // the consumer name its markers are recorded under
  int hop = 1;
  std::string who;
  std::string label;            // of its first progress line: "consuming", "billing", "shipping"
  std::string phase;            // "consuming" or "shipping"
  std::string restarted_phase;  // "consumer-restarted" or "shipping-restarted"
};

std::optional<DeliveryStats> run_consumer_hop(const HopContext& context, const ConsumerHop& hop,
                                              std::uint64_t stream_size,
                                              std::int64_t latest_stall = -1);

// What the second hop did and left.
struct SecondHop {
  std::uint64_t follow_ups = 0;        // outbox rows billing committed
  std::uint64_t relayed = 0;           // rows the relays published (with the ones sent again)
  std::uint64_t distinct_relayed = 0;  // distinct event ids among them
  bool ids_deterministic = true;       // every id is follow_up_id(billing, its order.paid id, 0)
  DeliveryStats stats;                 // shipping's deliveries
  LedgerCount ledger;                  // shipping's ledger rows
  std::int64_t markers = 0;            // relayed events shipping marked processed
  std::uint64_t outbox_left = 0;
  std::uint64_t outbox_parked = 0;
};

std::optional<SecondHop> run_second_hop(const HopContext& context, IdempotencyRecorder& recorder,
                                        Outbox& outbox, const std::string& billing,
                                        const std::string& shipping,
                                        const std::set<std::string>& paid);

// A progress label, indented and padded so that the bars of one run line up.
std::string bar_label(const std::string& name);

}  // namespace idem::cli::demo
