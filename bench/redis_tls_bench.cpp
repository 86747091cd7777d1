// What TLS costs a Redis replay: the same calls over mutual TLS and over plaintext, to the same
// redis-server, in the same run; the ratio tls:1 / tls:0 of each pair is printed at the end.
//
//   BM_Replay/tls:T/threads:N       RedisIdempotencyStore::lookup of a completed record (the
//                                   replay of an operation that already ran: one HGETALL)
//   BM_IsProcessed/tls:T/threads:N  RedisIdempotencyRecorder::is_processed of a marked event
//                                   (one EXISTS)
//   BM_Connect/tls:T                a new pooled connection (TCP, plus the TLS 1.3 handshake with
//                                   a client certificate when T=1) and closing it: what a pool
//                                   pays once per connection
//
// The server is scripts/servers.sh's: IDEM_TEST_REDIS_URL for tls:0 and the TLS listener of the
// same instance (localhost:IDEM_TEST_REDIS_TLS_PORT, --tls-auth-clients yes) with the CA and
// client certificate of IDEM_TEST_TLS_DIR for tls:1.
//
//   scripts/servers.sh bash -c 'build/release/bench/bench_redis_tls --benchmark_repetitions=5
//     --benchmark_enable_random_interleaving=true'   (one line)
//
// Keys go under the prefix "idem-tls-bench:<pid>:" and are deleted at the end.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/report.hpp"
#include "tls_pairs.hpp"

namespace {

using namespace std::chrono_literals;

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

const std::string& prefix() {
  static const std::string value = "idem-tls-bench:" + std::to_string(::getpid()) + ":";
  return value;
}

idem::redis::RedisOptions options(bool tls) {
  idem::redis::RedisOptions o = idem::redis::RedisOptions::from_url(env("IDEM_TEST_REDIS_URL"));
  o.key_prefix = prefix();
  o.pool_size = idem::bench::kTlsMaxThreads;
  if (tls) {
    const std::string dir = env("IDEM_TEST_TLS_DIR");
    o.host = "localhost";
    o.port = std::atoi(env("IDEM_TEST_REDIS_TLS_PORT").c_str());
    o.tls = idem::redis::RedisTlsOptions{};
    o.tls->ca_file = dir + "/ca.crt";
    o.tls->cert_file = dir + "/client.crt";
    o.tls->key_file = dir + "/client.key";
  }
  return o;
}

bool skip_without_server(benchmark::State& state) {
  if (!env("IDEM_TEST_REDIS_URL").empty() && !env("IDEM_TEST_REDIS_TLS_PORT").empty() &&
      !env("IDEM_TEST_TLS_DIR").empty()) {
    return false;
  }
  state.SkipWithError("run through scripts/servers.sh (IDEM_TEST_REDIS_TLS_PORT)");
  return true;
}

// One store and one recorder per face, with a completed record and a marked event to replay.
struct Face {
  std::shared_ptr<idem::redis::RedisIdempotencyStore> store;
  std::shared_ptr<idem::redis::RedisIdempotencyRecorder> recorder;
};

Face& face(bool tls) {
  static std::once_flag once[2];
  static Face faces[2];
  std::call_once(once[tls ? 1 : 0], [&] {
    Face& f = faces[tls ? 1 : 0];
    f.store = std::make_shared<idem::redis::RedisIdempotencyStore>(options(tls));
    f.recorder = std::make_shared<idem::redis::RedisIdempotencyRecorder>(options(tls));
    const auto claim = f.store->claim("replayed", std::nullopt, 1h);
    if (claim.status == idem::ClaimOutcome::Status::acquired) {
      idem::StoredValue value;
      value.bytes = std::string(200, 'r');  // a small result, like a payment's receipt
      (void)f.store->complete("replayed", claim.token, value, idem::ExecutionReport{}, 24h);
    }
    f.recorder->mark_processed("bench", "seen");
  });
  return faces[tls ? 1 : 0];
}

void BM_Replay(benchmark::State& state) {
  if (skip_without_server(state)) return;
  auto store = face(state.range(0) != 0).store;
  for (auto _ : state) {
    auto record = store->lookup("replayed");
    if (!record || record->state != idem::IdempotencyRecord::State::completed) {
      state.SkipWithError("the completed record is missing");
      break;
    }
    benchmark::DoNotOptimize(record);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_IsProcessed(benchmark::State& state) {
  if (skip_without_server(state)) return;
  auto recorder = face(state.range(0) != 0).recorder;
  for (auto _ : state) {
    if (!recorder->is_processed("bench", "seen")) {
      state.SkipWithError("the marker is missing");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Connect(benchmark::State& state) {
  if (skip_without_server(state)) return;
  idem::redis::RedisOptions o = options(state.range(0) != 0);
  o.pool_size = 1;
  idem::redis::ConnectionPool pool(o);  // the TLS context is built once, as a pool does
  for (auto _ : state) {
    // QUIT makes the server close the connection (its +OK may be lost to the close, which
    // breaks the connection and the pool drops it); the next lease opens a new one (TCP
    // connect, and the TLS handshake for tls:1) with the pool's context.
    auto lease = pool.lease();
    try {
      (void)lease->command({"QUIT"}, idem::redis::CommandKind::read, "QUIT");
    } catch (const idem::redis::RedisError&) {
    }
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_Replay)->Apply(idem::bench::tls_pair_on_threads);
BENCHMARK(BM_IsProcessed)->Apply(idem::bench::tls_pair_on_threads);
BENCHMARK(BM_Connect)->Apply(idem::bench::tls_pair);

// The console output plus the ratio tls:1 / tls:0 of every pair (medians when repeated).
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const bool aggregate = run.run_type == Run::RT_Aggregate;
      if (aggregate && run.aggregate_name != "median") continue;
      const auto found = run.counters.find("items_per_second");
      if (found == run.counters.end()) continue;
      std::string name = run.run_name.str();
      rates_[name] = found->second.value;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%-52s %12s %12s %8s\n", "tls:1 / tls:0", "plain /s", "tls /s", "ratio");
    for (const auto& [name, plain] : rates_) {
      const auto at = name.find("tls:0");
      if (at == std::string::npos) continue;
      std::string tls_name = name;
      tls_name.replace(at, 5, "tls:1");
      const auto tls = rates_.find(tls_name);
      if (tls == rates_.end() || plain <= 0) continue;
      std::printf("%-52s %12.0f %12.0f %8.2f\n", tls_name.c_str(), plain, tls->second,
                  tls->second / plain);
    }
  }

 private:
  std::map<std::string, double> rates_;
};

void clean_up() {
  try {
    idem::redis::ConnectionPool pool(options(false));
    auto connection = pool.lease();
    std::string cursor = "0";
    do {
      const auto page =
          connection->command({"SCAN", cursor, "MATCH", prefix() + "*", "COUNT", "1000"},
                              idem::redis::CommandKind::read);
      cursor = page.elements.at(0).str;
      for (const auto& key : page.elements.at(1).elements)
        (void)connection->command({"DEL", key.str});
    } while (cursor != "0");
  } catch (...) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  clean_up();
  return 0;
}
