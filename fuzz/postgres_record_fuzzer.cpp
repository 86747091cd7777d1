// Stored records as the PostgreSQL store reads them back: one row of the nine record columns in
// binary format, each NULL or arbitrary bytes (with a bias towards the right sizes and the two
// known states), built offline with libpq's PQmakeEmptyPGresult/PQsetvalue and decoded by the
// store's own decode_record(). A row idem did not write must give a classified StoreError
// (store_corrupt_record), never a crash or undefined behaviour (timestamps at the ends of the
// int64 range included), and never a completed record without its report.
#include <libpq-fe.h>

#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "connection.hpp"
#include "fuzz_support.hpp"
#include "record_decoder.hpp"

namespace {

// Column sizes a well-formed row has (0 = variable): state, token (int8), fingerprint,
// lease_until (timestamptz), took_over (bool), completed_at, expires_at, value, report.
constexpr std::array<int, 9> kSizes{0, 8, 0, 8, 1, 8, 8, 0, 0};

std::string column_value(FuzzedDataProvider& in, int column) {
  if (column == 0 && in.ConsumeBool()) return in.ConsumeBool() ? "in_progress" : "completed";
  if (kSizes[static_cast<std::size_t>(column)] != 0 && in.ConsumeBool()) {
    return in.ConsumeBytesAsString(
        static_cast<std::size_t>(kSizes[static_cast<std::size_t>(column)]));
  }
  if (column == 8 && in.ConsumeBool()) {
    return R"({"operation":"op","status":"succeeded","started_at":"2026-11-30T12:00:00Z",)"
           R"("duration_ns":1,"attempts":[],"fallback_used":false,"fallback_source":null,)"
           R"("metadata":{}})";
  }
  return in.ConsumeRandomLengthString(96);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  PGresult* raw = PQmakeEmptyPGresult(nullptr, PGRES_TUPLES_OK);
  if (raw == nullptr) return 0;
  idem::postgres::detail::Result result(raw);

  std::array<PGresAttDesc, 9> columns{};
  std::array<std::string, 9> names{"state",       "token",     "fingerprint",
                                   "lease_until", "took_over", "completed_at",
                                   "expires_at",  "value",     "report"};
  for (std::size_t i = 0; i < columns.size(); ++i) {
    columns[i].name = names[i].data();
    columns[i].format = 1;  // binary, as the store asks for
    columns[i].typlen = kSizes[i] == 0 ? -1 : kSizes[i];
    columns[i].atttypmod = -1;
  }
  if (PQsetResultAttrs(raw, static_cast<int>(columns.size()), columns.data()) == 0) return 0;
  for (int column = 0; column < 9; ++column) {
    if (in.ConsumeIntegralInRange<int>(0, 5) == 0) {
      PQsetvalue(raw, 0, column, nullptr, -1);  // NULL
    } else {
      std::string value = column_value(in, column);
      PQsetvalue(raw, 0, column, value.data(), static_cast<int>(value.size()));
    }
  }

  idem::fuzz::expect_only_idem_errors("postgres decode_record", [&] {
    const idem::IdempotencyRecord record =
        idem::postgres::detail::decode_record("k", "idem.idem_records", result, 0, 0);
    if (record.state == idem::IdempotencyRecord::State::completed && !record.report) {
      idem::fuzz::fail("a completed record decoded without its report");
    }
  });
  return 0;
}
