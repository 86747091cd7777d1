#include "record_decoder.hpp"

#include <string>

#include "idem/error.hpp"
#include "idem/report.hpp"

namespace idem::postgres::detail {
namespace {

using State = IdempotencyRecord::State;

[[noreturn]] void corrupt(std::string_view key, std::string_view table, const std::string& why) {
  throw StoreError(ErrorCode::store_corrupt_record,
                   "PostgresIdempotencyStore: the record for key '" + std::string(key) + "' in " +
                       std::string(table) + " is corrupt: " + why);
}

}  // namespace

IdempotencyRecord decode_record(std::string_view key, std::string_view table, const Result& result,
                                int row, int first, bool with_value) {
  const auto null = [&](int column) { return result.is_null(row, first + column); };
  IdempotencyRecord record;
  record.key = std::string(key);
  const std::string_view state = result.bytes(row, first + 0);
  if (state == kInProgress) {
    record.state = State::in_progress;
  } else if (state == kCompleted) {
    record.state = State::completed;
  } else {
    corrupt(key, table, "unknown state '" + std::string(state.substr(0, 40)) + "'");
  }
  if (null(1) || result.int8(row, first + 1) <= 0) corrupt(key, table, "no valid token");
  record.token = static_cast<std::uint64_t>(result.int8(row, first + 1));
  if (!null(2)) record.fingerprint = std::string(result.bytes(row, first + 2));
  if (!null(3)) record.lease_until = result.timestamptz(row, first + 3);
  if (record.state == State::in_progress) {
    if (null(3)) corrupt(key, table, "an in-progress record without lease_until");
    return record;
  }
  if (null(5) || null(6)) corrupt(key, table, "a completed record without completed_at/expires_at");
  record.completed_at = result.timestamptz(row, first + 5);
  record.expires_at = result.timestamptz(row, first + 6);
  if (!with_value) return record;
  if (null(7)) corrupt(key, table, "a completed record without a value");
  record.value.bytes = std::string(result.bytes(row, first + 7));
  if (null(8)) corrupt(key, table, "a completed record without its report");
  try {
    record.report = ExecutionReport::from_json(result.bytes(row, first + 8));
  } catch (const Error& e) {
    corrupt(key, table, std::string("its report does not decode: ") + e.what());
  }
  return record;
}

}  // namespace idem::postgres::detail
