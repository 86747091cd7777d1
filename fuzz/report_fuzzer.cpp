// ExecutionReport::from_json — the decoder every durable store uses for the report it keeps
// beside a result (SQLite's report column, Redis's `report` field, PostgreSQL's report column).
// Invariants: only idem errors; a report that decodes re-encodes to JSON that decodes to the same
// JSON again (the replayed report is stable); idem's reader of its own plain text and nlohmann
// decode a text alike (the input indented, which only nlohmann reads, gives the same report).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_support.hpp"
#include "idem/report.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  idem::fuzz::expect_only_idem_errors("ExecutionReport::from_json", [&] {
    const idem::ExecutionReport report = idem::ExecutionReport::from_json(json);
    const std::string once = report.to_json();
    const std::string twice = idem::ExecutionReport::from_json(once).to_json();
    if (once != twice) idem::fuzz::fail("report JSON is not stable: " + once + " vs " + twice);
    const std::string indented = nlohmann::json::parse(json).dump(1);
    const std::string by_nlohmann = idem::ExecutionReport::from_json(indented).to_json();
    if (by_nlohmann != once) {
      idem::fuzz::fail("the plain reader and nlohmann disagree: " + once + " vs " + by_nlohmann);
    }
  });
  return 0;
}
