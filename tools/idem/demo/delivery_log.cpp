// The demo's delivery logs (delivery_log.hpp).
#include "delivery_log.hpp"

#include <algorithm>
#include <fstream>

#include "idem/error.hpp"

namespace idem::cli::demo {

const DeliveryStats& DeliveryLogReader::poll() {
  std::ifstream in(path_);
  in.seekg(static_cast<std::streamoff>(consumed_));
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a line still being written; read it next time
    consumed_ += line.size() + 1;
    if (line.size() < 3) continue;
    const std::size_t space = line.find(' ', 2);
    const std::uint64_t seq =
        std::stoull(line.substr(2, space == std::string::npos ? line.npos : space - 2));
    switch (line[0]) {
      case 'D':
        ++stats_.deliveries;
        if (!seen_.insert(seq).second) ++stats_.redeliveries;
        stats_.furthest = std::max(stats_.furthest, seq + 1);
        if (space != std::string::npos && ids_.insert(line.substr(space + 1)).second) {
          ++stats_.distinct_ids;
        }
        break;
      case 'P':
        ++stats_.processed;
        break;
      case 'X':
        ++stats_.duplicates_dropped;
        break;
      case 'B':
        ++stats_.in_progress_retries;
        break;
      default:
        break;
    }
  }
  return stats_;
}

// Duplicates first: on a narrow terminal the progress line keeps the first part of its note.
std::string consumer_note(const DeliveryStats& s) {
  return std::to_string(s.duplicates_dropped) +
         (s.duplicates_dropped == 1 ? " duplicate dropped, " : " duplicates dropped, ") +
         std::to_string(s.deliveries) + " delivered";
}

std::string relay_note(const DeliveryStats& s) {
  return std::to_string(s.deliveries) + (s.deliveries == 1 ? " row published" : " rows published");
}

HandleResult LoggedHandler::operator()(const Event& event, BusProxy& bus) {
  const auto seq = event.headers.find("seq");
  if (seq == event.headers.end()) throw DecodeError("demo event without a seq header");
  log_.line("D " + seq->second);
  HandleResult result{};
  try {
    result = inner_(event, bus);
  } catch (const AlreadyInProgress&) {
    log_.line("B " + seq->second);
    throw;
  }
  log_.line((result == HandleResult::processed ? "P " : "X ") + seq->second);
  settled_.insert(std::stoull(seq->second));
  return result;
}

std::set<std::uint64_t> settled_in_log(const fs::path& path) {
  std::set<std::uint64_t> settled;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > 2 && (line[0] == 'P' || line[0] == 'X'))
      settled.insert(std::stoull(line.substr(2)));
  }
  return settled;
}

}  // namespace idem::cli::demo
