// The SQLite idempotency store against a raw sqlite3 loop doing the equivalent statements at the
// same durability (WAL; synchronous=NORMAL, or FULL with full:1), measured in one run.
//
//   BM_RawSqliteStore_ClaimComplete   per key: the claim upsert (INSERT ... ON CONFLICT DO UPDATE
//                                     ... WHERE <expired> RETURNING token) and the completing
//                                     UPDATE, each an autocommit statement; the token comes from
//                                     a C++ counter, the report is JSON serialised once up front
//   BM_SqliteStore_ClaimComplete      store.claim() + store.complete() per key: the same two
//                                     statements plus advancing the file's token counter, inside
//                                     BEGIN IMMEDIATE ... COMMIT, and the report serialised per
//                                     call
//   BM_SqliteStore_ClaimReplay        store.claim() of a completed key (answered completed)
//   BM_SqliteStore_ResilientReplay    resilient() replaying a result from the SQLite store
//   BM_SqliteStore_ResilientExecute   resilient() with a new key per call (claim, run, complete,
//                                     plus the heartbeat bookkeeping)
#include <benchmark/benchmark.h>
#include <sqlite3.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "bench_ids.hpp"
#include "idem/clock.hpp"
#include "idem/report.hpp"
#include "idem/resilient.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "sqlite_bench_db.hpp"

namespace {

using idem::bench::remove_db;

std::string fresh_db_path() {
  return idem::bench::fresh_db_path("idem-store-bench");
}

bool full_of(const benchmark::State& state) {
  return state.range(0) != 0;
}

idem::sqlite::SqliteOptions options_of(const benchmark::State& state) {
  idem::sqlite::SqliteOptions options;
  options.durability =
      full_of(state) ? idem::sqlite::Durability::full : idem::sqlite::Durability::normal;
  return options;
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// What an operation's report looks like: one successful attempt.
idem::ExecutionReport sample_report() {
  idem::ExecutionReport report;
  report.operation = "create_payment";
  report.started_at = std::chrono::system_clock::now();
  report.duration = std::chrono::microseconds(180);
  idem::AttemptRecord attempt;
  attempt.number = 1;
  attempt.duration = std::chrono::microseconds(170);
  report.attempts.push_back(attempt);
  return report;
}

const std::string kValue = R"({"payment_id":"pay_8f14e45f","status":"captured","amount":2499})";

// ---- raw sqlite3 ----------------------------------------------------------------------------

class RawStore {
 public:
  RawStore(const std::string& path, bool full) : db_(path, full) {
    // The store's table and index, as SqliteIdempotencyStore creates them.
    db_.exec(
        "CREATE TABLE IF NOT EXISTS idem_records (key TEXT PRIMARY KEY NOT NULL, state TEXT NOT "
        "NULL CHECK (state IN ('in_progress', 'completed')), token INTEGER NOT NULL, fingerprint "
        "TEXT, lease_until_ms INTEGER, completed_at_ms INTEGER, expires_at_ms INTEGER, value "
        "BLOB, report TEXT, took_over INTEGER NOT NULL DEFAULT 0)");
    db_.exec(
        "CREATE INDEX IF NOT EXISTS idem_records_expiry ON idem_records(expires_at_ms) WHERE "
        "state = 'completed'");
    claim_ = db_.prepare(
        "INSERT INTO idem_records(key, state, token, fingerprint, lease_until_ms, took_over) "
        "VALUES (?1, 'in_progress', ?5, ?2, ?3, 0) "
        "ON CONFLICT(key) DO UPDATE SET state = 'in_progress', token = excluded.token, "
        "fingerprint = excluded.fingerprint, lease_until_ms = excluded.lease_until_ms, "
        "completed_at_ms = NULL, expires_at_ms = NULL, value = NULL, report = NULL, "
        "took_over = (idem_records.state = 'in_progress') "
        "WHERE (idem_records.state = 'completed' AND idem_records.expires_at_ms <= ?4) "
        "OR (idem_records.state = 'in_progress' AND idem_records.lease_until_ms <= ?4) "
        "RETURNING token, took_over");
    complete_ = db_.prepare(
        "UPDATE idem_records SET state = 'completed', lease_until_ms = NULL, "
        "completed_at_ms = ?3, expires_at_ms = ?4, value = ?5, report = ?6 "
        "WHERE key = ?1 AND state = 'in_progress' AND token = ?2");
  }
  std::int64_t claim(std::string_view key) {
    const std::int64_t now = now_ms();
    sqlite3_bind_text(claim_, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_null(claim_, 2);
    sqlite3_bind_int64(claim_, 3, now + 30'000);
    sqlite3_bind_int64(claim_, 4, now);
    sqlite3_bind_int64(claim_, 5, ++last_token_);
    std::int64_t token = 0;
    if (sqlite3_step(claim_) == SQLITE_ROW) token = sqlite3_column_int64(claim_, 0);
    while (sqlite3_step(claim_) == SQLITE_ROW) {
    }
    sqlite3_reset(claim_);
    if (token == 0) throw std::runtime_error("raw claim failed");
    return token;
  }

  void complete(std::string_view key, std::int64_t token, const std::string& value,
                const std::string& report) {
    const std::int64_t now = now_ms();
    sqlite3_bind_text(complete_, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_int64(complete_, 2, token);
    sqlite3_bind_int64(complete_, 3, now);
    sqlite3_bind_int64(complete_, 4, now + 3'600'000);
    sqlite3_bind_blob(complete_, 5, value.data(), static_cast<int>(value.size()), SQLITE_STATIC);
    sqlite3_bind_text(complete_, 6, report.data(), static_cast<int>(report.size()), SQLITE_STATIC);
    const int rc = sqlite3_step(complete_);
    sqlite3_reset(complete_);
    if (rc != SQLITE_DONE || sqlite3_changes(db_.get()) != 1) {
      throw std::runtime_error("raw complete failed");
    }
  }

 private:
  idem::bench::RawDb db_;
  sqlite3_stmt* claim_ = nullptr;
  sqlite3_stmt* complete_ = nullptr;
  std::int64_t last_token_ = 0;
};

void BM_RawSqliteStore_ClaimComplete(benchmark::State& state) {
  idem::bench::on_db_file(state, fresh_db_path(), [&](const std::string& path) {
    RawStore store(path, full_of(state));
    const std::string report = sample_report().to_json();
    idem::bench::IdSequence ids(1);
    for (auto _ : state) {
      const std::string_view key = ids.next();
      static_cast<void>(store.complete(key, store.claim(key), kValue, report));
    }
  });
}
BENCHMARK(BM_RawSqliteStore_ClaimComplete)->Arg(0)->Arg(1)->ArgName("full")->UseRealTime();

// ---- idem -----------------------------------------------------------------------------------

void BM_SqliteStore_ClaimComplete(benchmark::State& state) {
  idem::bench::on_db_file(state, fresh_db_path(), [&](const std::string& path) {
    idem::sqlite::SqliteIdempotencyStore store(path, options_of(state));
    const idem::ExecutionReport report = sample_report();
    idem::bench::IdSequence ids(1);
    for (auto _ : state) {
      const std::string_view key = ids.next();
      const auto claim = store.claim(key, std::nullopt, std::chrono::seconds(30));
      idem::StoredValue value;
      value.bytes = kValue;
      if (!store.complete(key, claim.token, std::move(value), report, std::chrono::hours(1))) {
        state.SkipWithError("complete was refused");
        break;
      }
    }
  });
}
BENCHMARK(BM_SqliteStore_ClaimComplete)->Arg(0)->Arg(1)->ArgName("full")->UseRealTime();

void BM_SqliteStore_ClaimReplay(benchmark::State& state) {
  idem::bench::on_db_file(state, fresh_db_path(), [&](const std::string& path) {
    idem::sqlite::SqliteIdempotencyStore store(path, options_of(state));
    const auto claim = store.claim("request-123", std::nullopt, std::chrono::seconds(30));
    idem::StoredValue value;
    value.bytes = kValue;
    if (!store.complete("request-123", claim.token, value, sample_report(),
                        std::chrono::hours(1))) {
      return state.SkipWithError("the replayed key was fenced off");
    }
    for (auto _ : state) {
      auto outcome = store.claim("request-123", std::nullopt, std::chrono::seconds(30));
      benchmark::DoNotOptimize(outcome);
    }
  });
}
BENCHMARK(BM_SqliteStore_ClaimReplay)->Arg(0)->ArgName("full")->UseRealTime();

struct Payment {
  std::string id;
  int amount = 0;
};
void to_json(nlohmann::json& j, const Payment& p) {
  j = nlohmann::json{{"id", p.id}, {"amount", p.amount}};
}
void from_json(const nlohmann::json& j, Payment& p) {
  j.at("id").get_to(p.id);
  j.at("amount").get_to(p.amount);
}

void BM_SqliteStore_ResilientReplay(benchmark::State& state) {
  idem::bench::on_db_file(state, fresh_db_path(), [&](const std::string& path) {
    auto store = std::make_shared<idem::sqlite::SqliteIdempotencyStore>(path, options_of(state));
    auto call = idem::resilient(
        [](const std::string& request_id, int amount) {
          return Payment{request_id, amount};
        },
        {.name = "create_payment",
         .idempotency_key = [](const std::string& id, int) { return "create-payment:" + id; },
         .idempotency_store = store});
    const std::string id = "request-123";
    (void)call(id, 2499);
    for (auto _ : state)
      benchmark::DoNotOptimize(call(id, 2499).value);
  });
}
BENCHMARK(BM_SqliteStore_ResilientReplay)->Arg(0)->ArgName("full")->UseRealTime();

void BM_SqliteStore_ResilientExecute(benchmark::State& state) {
  idem::bench::on_db_file(state, fresh_db_path(), [&](const std::string& path) {
    auto store = std::make_shared<idem::sqlite::SqliteIdempotencyStore>(path, options_of(state));
    auto call = idem::resilient(
        [](const std::string& request_id, int amount) {
          return Payment{request_id, amount};
        },
        {.name = "execute",
         .idempotency_key = [](const std::string& id, int) { return id; },
         .idempotency_store = store});
    idem::bench::IdSequence ids(1);
    for (auto _ : state)
      benchmark::DoNotOptimize(call(std::string(ids.next()), 2499).value);
  });
}
BENCHMARK(BM_SqliteStore_ResilientExecute)->Arg(0)->Arg(1)->ArgName("full")->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
