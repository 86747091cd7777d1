// The delivery log each of the demo's processes writes, and the parent's reader of it.
//
// A consumer writes "D seq" before a handler runs, then "P seq" / "X seq" when it processed the
// event / dropped a duplicate, or "B seq" when another delivery held the event's claim (it is
// delivered again later). The relay writes "D seq id" for each row it published. The parent
// reads the log while the process runs (for the progress line) and after it is gone (for the
// results): whatever a killed process wrote is there.
//
// Thread-safety: each object belongs to one thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>

#include "file_queue.hpp"
#include "idem/event_handler.hpp"

namespace idem::cli::demo {

struct DeliveryStats {
  std::uint64_t deliveries = 0;
  std::uint64_t redeliveries = 0;
  std::uint64_t processed = 0;
  std::uint64_t duplicates_dropped = 0;
  std::uint64_t in_progress_retries = 0;
  std::uint64_t furthest = 0;      // highest sequence number delivered + 1
  std::uint64_t distinct_ids = 0;  // relay log: distinct event ids published
};

// Reads a delivery log from where it stopped last time; a line still being written is read the
// next time.
class DeliveryLogReader {
 public:
  explicit DeliveryLogReader(fs::path path) : path_(std::move(path)) {}
  const DeliveryStats& poll();

 private:
  fs::path path_;
  std::size_t consumed_ = 0;
  std::set<std::uint64_t> seen_;
  std::set<std::string> ids_;
  DeliveryStats stats_;
};

// The progress notes of a consumer's and of the relay's log.
std::string consumer_note(const DeliveryStats& s);
std::string relay_note(const DeliveryStats& s);

// Writes the delivery log around a handler (used with RabbitMQ, where the transport calls the
// handler): "D seq" before it runs, then "P seq" / "X seq", or "B seq" when another delivery
// holds the event's claim (rethrown: the transport redelivers it). `settled` gets each sequence
// number that was processed or dropped.
class LoggedHandler final : public EventHandler {
 public:
  LoggedHandler(EventHandler& inner, AppendLog& log, std::set<std::uint64_t>& settled)
      : inner_(inner), log_(log), settled_(settled) {}
  const std::string& consumer() const noexcept override { return inner_.consumer(); }
  HandleResult operator()(const Event& event, BusProxy& bus) override;

 private:
  EventHandler& inner_;
  AppendLog& log_;
  std::set<std::uint64_t>& settled_;
};

// Sequence numbers a previous consumer process already settled (P or X in the delivery log).
std::set<std::uint64_t> settled_in_log(const fs::path& path);

}  // namespace idem::cli::demo
