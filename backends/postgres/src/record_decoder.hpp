// Internal: an idempotency record row (the kRecordColumns of postgres_store.cpp, in binary
// format) decoded back into an IdempotencyRecord. Its own file so the record fuzzer
// (fuzz/postgres_record_fuzzer.cpp) runs the very code the store runs on whatever bytes a row may
// hold.
#pragma once

#include <string_view>

#include "connection.hpp"
#include "idem/idempotency_store.hpp"

namespace idem::postgres::detail {

inline constexpr std::string_view kInProgress = "in_progress";
inline constexpr std::string_view kCompleted = "completed";

// The record in the nine record columns of `row` that start at column `first`: state, token,
// fingerprint, lease_until, took_over (not read here), completed_at, expires_at, value, report.
// Anything missing or malformed throws StoreError(store_corrupt_record) naming `key` and `table`.
// Without `with_value` the value and report columns are not read (list()).
IdempotencyRecord decode_record(std::string_view key, std::string_view table, const Result& result,
                                int row, int first, bool with_value = true);

}  // namespace idem::postgres::detail
