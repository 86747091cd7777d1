// The demo's ledger: the side effect of transactional mode, one row per payment (or shipment),
// written through the marker's transaction (idem::SqlTransaction), so it lives in the recorder's
// own database — a SQLite file or a PostgreSQL schema.
//
// The demo reaches that database only through its recorder: run_sql() runs statements in a
// committed recorder transaction that leaves no marker behind, count_ledger() reads in one that
// is always rolled back. So the ledger, and its removal, work on every SQL backend with the
// recorder's own connection settings, and no internal consumer shows in `idem stats`.
//
// Thread-safety: as the recorder's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "idem/recorder.hpp"
#include "idem/sql.hpp"

namespace idem::cli::demo {

// The ledger table for `recorder` named after `run` ("" for the default store, whose file is
// the demo's alone): "idem_demo_ledger[_<run>]" in a SQLite file, "<schema>.demo_ledger" on
// PostgreSQL (the demo's schema is its own). Empty: the demo has no ledger for this recorder.
std::string ledger_table(const IdempotencyRecorder& recorder, const std::string& run);

// Runs `fn` in a committed transaction of `recorder` (a SQL backend) and leaves no marker: the
// one run_transactional() inserts is deleted first, in the same transaction.
void run_sql(IdempotencyRecorder& recorder, const std::function<void(SqlTransaction&)>& fn);

void create_ledger(IdempotencyRecorder& recorder, const std::string& ledger);

struct LedgerCount {
  std::int64_t rows = 0;
  std::int64_t distinct_events = 0;
  std::int64_t distinct_orders = 0;
};

// The side effects of `consumer` in the ledger.
LedgerCount count_ledger(IdempotencyRecorder& recorder, const std::string& ledger,
                         const std::string& consumer);

// The INSERT of one ledger row: $1 consumer, $2 event id, $3 order number, $4 amount in cents.
std::string ledger_insert(const std::string& ledger);

}  // namespace idem::cli::demo
