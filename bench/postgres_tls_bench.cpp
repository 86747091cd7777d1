// What TLS costs a PostgreSQL mark: the same recorder calls over a verify-full TLS connection
// and over a plaintext one, to the same server, in the same run (report the ratio tls:1 /
// tls:0 of each pair).
//
//   BM_Mark/tls:T/threads:N      mark_processed of a new event (one autocommit INSERT per call)
//   BM_CheckMark/tls:T/threads:N is_processed then mark_processed of a new event
//   BM_Connect/tls:T             opening one connection (TCP, TLS handshake and SCRAM when T=1;
//                                TCP and SCRAM when T=0) and closing it: the cost a pool pays once
//                                per connection
//
// The server is scripts/servers.sh's TLS PostgreSQL: IDEM_TEST_POSTGRES_TLS_URL (user idem_tls,
// sslmode=verify-full) for tls:1, and the same host and port as user idem_plain with
// sslmode=disable (the one plaintext rule of that server) for tls:0; both authenticate with
// scram-sha-256 and the password in IDEM_TEST_TLS_DIR/pg-password. Tables live in schema
// idem_tls_bench_<user>, created on first use and left in place.
#include <benchmark/benchmark.h>
#if __has_include(<libpq-fe.h>)
#include <libpq-fe.h>
#else
#include <postgresql/libpq-fe.h>
#endif

#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "bench_ids.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "tls_pairs.hpp"

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// postgresql://USER@localhost:PORT/idem_test?... for tls (true) or plaintext (false).
std::string url(bool tls) {
  const std::string tls_url = env("IDEM_TEST_POSTGRES_TLS_URL");
  if (tls || tls_url.empty()) return tls_url;
  const std::string port = env("IDEM_TEST_POSTGRES_TLS_PORT");
  return "postgresql://idem_plain@localhost:" + port + "/idem_test?sslmode=disable";
}

idem::postgres::PostgresOptions options(bool tls) {
  idem::postgres::PostgresOptions o;
  o.url = url(tls);
  o.schema = tls ? "idem_tls_bench_tls" : "idem_tls_bench_plain";
  o.pool_size = idem::bench::kTlsMaxThreads;
  o.password_file = env("IDEM_TEST_TLS_DIR") + "/pg-password";
  return o;
}

std::shared_ptr<idem::postgres::PostgresIdempotencyRecorder> recorder(bool tls) {
  static std::once_flag once[2];
  static std::shared_ptr<idem::postgres::PostgresIdempotencyRecorder> instance[2];
  std::call_once(once[tls ? 1 : 0], [&] {
    instance[tls ? 1 : 0] =
        std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(options(tls));
  });
  return instance[tls ? 1 : 0];
}

idem::bench::IdSequence ids() {
  static std::mutex mutex;
  static std::mt19937_64 random{std::random_device{}()};
  std::lock_guard lock(mutex);
  return idem::bench::IdSequence(random());
}

bool skip_without_server(benchmark::State& state) {
  if (!env("IDEM_TEST_POSTGRES_TLS_URL").empty() && !env("IDEM_TEST_TLS_DIR").empty()) return false;
  state.SkipWithError("run through scripts/servers.sh (IDEM_TEST_POSTGRES_TLS_URL)");
  return true;
}

void BM_Mark(benchmark::State& state) {
  if (skip_without_server(state)) return;
  auto marks = recorder(state.range(0) != 0);
  auto sequence = ids();
  for (auto _ : state)
    marks->mark_processed("bench", sequence.next());
  state.SetItemsProcessed(state.iterations());
}

void BM_CheckMark(benchmark::State& state) {
  if (skip_without_server(state)) return;
  auto marks = recorder(state.range(0) != 0);
  auto sequence = ids();
  for (auto _ : state) {
    const std::string id(sequence.next());
    if (!marks->is_processed("bench-check", id)) marks->mark_processed("bench-check", id);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Connect(benchmark::State& state) {
  if (skip_without_server(state)) return;
  const bool tls = state.range(0) != 0;
  std::string password = env("IDEM_TEST_POSTGRES_TLS_PASSWORD");
  const std::string conninfo = url(tls);
  const char* keys[] = {"dbname", "password", nullptr};
  const char* values[] = {conninfo.c_str(), password.c_str(), nullptr};
  for (auto _ : state) {
    PGconn* conn = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
    if (PQstatus(conn) != CONNECTION_OK) state.SkipWithError(PQerrorMessage(conn));
    PQfinish(conn);
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_Mark)->Apply(idem::bench::tls_pair_on_threads);
BENCHMARK(BM_CheckMark)->Apply(idem::bench::tls_pair_on_threads);
BENCHMARK(BM_Connect)->Apply(idem::bench::tls_pair);

}  // namespace

BENCHMARK_MAIN();
