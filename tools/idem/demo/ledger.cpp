// The demo's ledger (ledger.hpp).
#include "ledger.hpp"

#include "idem/error.hpp"
#include "idem/event.hpp"

#ifdef IDEM_HAVE_SQLITE
#include "idem/sqlite/sqlite_recorder.hpp"
#endif
#ifdef IDEM_HAVE_POSTGRES
#include "idem/postgres/postgres_recorder.hpp"
#endif

namespace idem::cli::demo {
namespace {

constexpr const char* kLedgerColumns =
    "(consumer TEXT NOT NULL, event_id TEXT NOT NULL, order_no BIGINT, amount_cents BIGINT)";

// The consumer of run_sql()'s own marker, deleted in the transaction that made it.
constexpr const char* kSqlConsumer = "idem-demo-sql";

std::string quoted(const std::string& identifier) {
  return "\"" + identifier + "\"";
}

// The recorder's markers table, as SQL.
std::string markers_table([[maybe_unused]] const IdempotencyRecorder& recorder) {
#ifdef IDEM_HAVE_POSTGRES
  if (const auto* pg = dynamic_cast<const postgres::PostgresIdempotencyRecorder*>(&recorder)) {
    const auto& options = pg->pool()->options();
    return quoted(options.schema) + "." + quoted(options.processed_log_table);
  }
#endif
  return "processed_log";  // SQLite (docs/sqlite.md)
}

}  // namespace

std::string ledger_table([[maybe_unused]] const IdempotencyRecorder& recorder,
                         [[maybe_unused]] const std::string& run) {
#ifdef IDEM_HAVE_SQLITE
  if (dynamic_cast<const sqlite::SqliteIdempotencyRecorder*>(&recorder) != nullptr) {
    if (run.empty()) return "idem_demo_ledger";
    std::string table;  // "idem-demo-1a2b3c4d" -> "idem_demo_1a2b3c4d_ledger"
    for (const char c : run)
      table += (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ? c : '_';
    return table + "_ledger";
  }
#endif
#ifdef IDEM_HAVE_POSTGRES
  if (const auto* pg = dynamic_cast<const postgres::PostgresIdempotencyRecorder*>(&recorder)) {
    return quoted(pg->pool()->options().schema) + ".demo_ledger";
  }
#endif
  return {};
}

void run_sql(IdempotencyRecorder& recorder, const std::function<void(SqlTransaction&)>& fn) {
  const std::string id = new_event_id();
  const std::string markers = markers_table(recorder);
  static_cast<void>(recorder.run_transactional(kSqlConsumer, id, [&](Transaction& tx) {
    auto& sql = dynamic_cast<SqlTransaction&>(tx);
    sql.exec("DELETE FROM " + markers + " WHERE consumer = $1 AND event_id = $2",
             {kSqlConsumer, id});
    fn(sql);
  }));
}

void create_ledger(IdempotencyRecorder& recorder, const std::string& ledger) {
  run_sql(recorder, [&](SqlTransaction& sql) {
    sql.exec("CREATE TABLE IF NOT EXISTS " + ledger + kLedgerColumns);
  });
}

LedgerCount count_ledger(IdempotencyRecorder& recorder, const std::string& ledger,
                         const std::string& consumer) {
  struct Rollback {};
  LedgerCount count;
  try {
    // Always rolled back by the Rollback thrown below, its marker with it.
    static_cast<void>(
        recorder.run_transactional(kSqlConsumer, new_event_id(), [&](Transaction& tx) {
          auto& sql = dynamic_cast<SqlTransaction&>(tx);
          const std::string where = " WHERE consumer = $1";
          count.rows =
              sql.query_int64("SELECT COUNT(*) FROM " + ledger + where, {consumer}).value_or(0);
          count.distinct_events =
              sql.query_int64("SELECT COUNT(DISTINCT event_id) FROM " + ledger + where, {consumer})
                  .value_or(0);
          count.distinct_orders =
              sql.query_int64("SELECT COUNT(DISTINCT order_no) FROM " + ledger + where, {consumer})
                  .value_or(0);
          throw Rollback{};
        }));
  } catch (const Rollback&) {
  }
  return count;
}

std::string ledger_insert(const std::string& ledger) {
  return "INSERT INTO " + ledger +
         "(consumer, event_id, order_no, amount_cents) VALUES ($1, $2, $3, $4)";
}

}  // namespace idem::cli::demo
