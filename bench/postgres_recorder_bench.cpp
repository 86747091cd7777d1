// The PostgreSQL recorder against raw libpq doing the same statement, at N clients.
//
//   BM_RawLibpqMark/threads:N    N threads, one connection each, a prepared
//                                INSERT ... ON CONFLICT (consumer, event_id) DO NOTHING per
//                                iteration (autocommit), a new event each time
//   BM_RecorderMark/threads:N    the same marks through one PostgresIdempotencyRecorder shared by
//                                the N threads (pool_size N)
//   BM_RecorderClaimComplete/threads:N   exclusive mode's claim + complete of a new event
//   BM_StoreClaimComplete/threads:N      the store's claim + complete (value and report)
//
// The server: IDEM_BENCH_POSTGRES_URL, else IDEM_TEST_POSTGRES_URL (scripts/servers.sh sets it).
// Tables live in schema IDEM_BENCH_POSTGRES_SCHEMA (default idem_bench), created on first use and
// left in place. bench/postgres_vs_pgbench.sh runs pgbench on the same INSERT for comparison.
#include <benchmark/benchmark.h>
#if __has_include(<libpq-fe.h>)
#include <libpq-fe.h>
#else
#include <postgresql/libpq-fe.h>  // Debian's location, when the include dir is not on the path
#endif

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "bench_ids.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "recorder_window.hpp"

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

std::string server_url() {
  return env_or("IDEM_BENCH_POSTGRES_URL", env_or("IDEM_TEST_POSTGRES_URL", ""));
}

std::string schema() {
  return env_or("IDEM_BENCH_POSTGRES_SCHEMA", "idem_bench");
}

constexpr int kMaxThreads = 16;

idem::postgres::PostgresOptions bench_options() {
  idem::postgres::PostgresOptions options;
  options.url = server_url();
  options.schema = schema();
  options.pool_size = kMaxThreads;
  return options;
}

// One recorder/store per process, shared by every benchmark's threads.
std::shared_ptr<idem::postgres::PostgresIdempotencyRecorder> recorder() {
  static std::once_flag once;
  static std::shared_ptr<idem::postgres::PostgresIdempotencyRecorder> instance;
  std::call_once(once, [] {
    instance = std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(bench_options());
  });
  return instance;
}

std::shared_ptr<idem::postgres::PostgresIdempotencyStore> store() {
  static std::once_flag once;
  static std::shared_ptr<idem::postgres::PostgresIdempotencyStore> instance;
  std::call_once(once, [] {
    instance = std::make_shared<idem::postgres::PostgresIdempotencyStore>(bench_options());
  });
  return instance;
}

// Ids no other run (or repetition, or thread) has used: a random stream per thread.
idem::bench::IdSequence ids() {
  static std::mutex mutex;
  static std::mt19937_64 random{std::random_device{}()};
  std::lock_guard lock(mutex);
  return idem::bench::IdSequence(random());
}

bool skip_without_server(benchmark::State& state) {
  if (!server_url().empty()) return false;
  state.SkipWithError("set IDEM_BENCH_POSTGRES_URL or IDEM_TEST_POSTGRES_URL");
  return true;
}

void BM_RawLibpqMark(benchmark::State& state) {
  if (skip_without_server(state)) return;
  recorder();  // creates the tables
  PGconn* conn = PQconnectdb(server_url().c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    state.SkipWithError(PQerrorMessage(conn));
    PQfinish(conn);
    return;
  }
  const std::string sql = "INSERT INTO \"" + schema() +
                          "\".processed_log (consumer, event_id, ts) VALUES ($1, $2, $3) "
                          "ON CONFLICT (consumer, event_id) DO NOTHING";
  PQclear(PQprepare(conn, "mark", sql.c_str(), 3, nullptr));
  auto sequence = ids();
  for (auto _ : state) {
    const std::string id(sequence.next());
    const char* values[3] = {"bench-raw", id.c_str(), "2026-11-30 04:05:06.123456+00"};
    PGresult* result = PQexecPrepared(conn, "mark", 3, values, nullptr, nullptr, 0);
    if (PQresultStatus(result) != PGRES_COMMAND_OK) state.SkipWithError(PQerrorMessage(conn));
    PQclear(result);
  }
  state.SetItemsProcessed(state.iterations());
  PQfinish(conn);
}

void BM_RecorderMark(benchmark::State& state) {
  if (skip_without_server(state)) return;
  auto marks = recorder();
  auto sequence = ids();
  for (auto _ : state)
    marks->mark_processed("bench", sequence.next());
  state.SetItemsProcessed(state.iterations());
}

// A window of 64 new events: a check and a mark per event (batch:0), or one is_processed_many
// and one mark_processed_many (batch:1).
void BM_RecorderCheckMarkWindow(benchmark::State& state) {
  if (skip_without_server(state)) return;
  auto marks = recorder();
  auto sequence = ids();
  idem::bench::check_mark_window(state, *marks, "bench", sequence, state.range(0) != 0);
}

void BM_RecorderClaimComplete(benchmark::State& state) {
  if (skip_without_server(state)) return;
  auto claims = recorder();
  auto sequence = ids();
  for (auto _ : state) {
    const std::string id(sequence.next());
    const idem::Claim claim = claims->claim("bench-claims", id, std::chrono::seconds(30));
    if (claim.status != idem::Claim::Status::acquired ||
        !claims->complete("bench-claims", id, claim.token)) {
      state.SkipWithError("claim/complete failed");
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_StoreClaimComplete(benchmark::State& state) {
  if (skip_without_server(state)) return;
  auto records = store();
  auto sequence = ids();
  idem::ExecutionReport report;
  report.operation = "bench";
  idem::StoredValue value;
  value.bytes = std::string(64, 'v');
  for (auto _ : state) {
    const std::string key(sequence.next());
    const idem::ClaimOutcome outcome = records->claim(key, std::nullopt, std::chrono::seconds(30));
    if (outcome.status != idem::ClaimOutcome::Status::acquired ||
        !records->complete(key, outcome.token, value, report, std::chrono::hours(1))) {
      state.SkipWithError("claim/complete failed");
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void threads(benchmark::internal::Benchmark* b) {
  for (int n : {1, 2, 4, 8, kMaxThreads})
    b->Threads(n);
  b->UseRealTime();
}

BENCHMARK(BM_RawLibpqMark)->Apply(threads);
BENCHMARK(BM_RecorderMark)->Apply(threads);
BENCHMARK(BM_RecorderCheckMarkWindow)->Arg(0)->Arg(1)->ArgName("batch")->UseRealTime();
BENCHMARK(BM_RecorderClaimComplete)->Apply(threads);
BENCHMARK(BM_StoreClaimComplete)->Apply(threads);

}  // namespace

BENCHMARK_MAIN();
