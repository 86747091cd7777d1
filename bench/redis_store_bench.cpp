// What one call of the Redis store costs the server: sequential replays (claim of a key that is
// completed: one GET) and new keys (claim + complete: a plain SET NX GET and the complete script,
// since a claim that follows a new key's starts with the SET), next to a plain GET of an
// existing key and a SET NX EX of a new key sent with raw hiredis on the same server. Each
// benchmark resets the server's statistics (CONFIG RESETSTAT) before its timed loop and reads INFO
// afterwards, and reports per call:
//   server_us   the usec INFO commandstats gives the commands the client sent (a script's
//               EVALSHA includes the commands it runs, which are not counted again)
//   server_cpu_us  the server process's CPU (used_cpu_user + used_cpu_sys), network I/O included
// Use a server of its own: RESETSTAT clears everybody's statistics.
//
//   bench_redis_store --url=redis://127.0.0.1:PORT/0 [google-benchmark flags]
//   scripts/servers.sh bash -c 'build/release/bench/bench_redis_store --url=$IDEM_TEST_REDIS_URL'
//
// The URL comes from --url, IDEM_BENCH_REDIS_URL or IDEM_TEST_REDIS_URL. Keys go under the
// prefix "idem-bench:<pid>:" and are deleted at the end. bench/report.py prints the ratios.
#include <benchmark/benchmark.h>
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_flags.hpp"
#include "bench_ids.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/report.hpp"
#include "redis_bench_support.hpp"

namespace {

using namespace std::chrono_literals;

std::string g_prefix;
idem::redis::RedisOptions g_options;
std::shared_ptr<idem::redis::RedisIdempotencyStore> g_store;
std::uint64_t g_stream = 1;

redisContext* connect_raw() {
  timeval timeout{5, 0};
  redisContext* context = redisConnectWithTimeout(g_options.host.c_str(), g_options.port, timeout);
  if (context == nullptr || context->err != 0) {
    if (context != nullptr) redisFree(context);
    return nullptr;
  }
  if (g_options.db != 0) {
    freeReplyObject(redisCommand(context, "SELECT %d", g_options.db));
  }
  return context;
}

std::string command_text(redisContext* context, const char* command) {
  auto* reply = static_cast<redisReply*>(redisCommand(context, command));
  std::string text;
  if (reply != nullptr &&
      (reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_STATUS)) {
    text.assign(reply->str, reply->len);
  }
  freeReplyObject(reply);
  return text;
}

struct ServerStats {
  std::map<std::string, std::pair<double, double>> commands;  // name → (calls, usec)
  double cpu_seconds = 0;
};

ServerStats read_stats(redisContext* context) {
  ServerStats stats;
  std::istringstream lines(command_text(context, "INFO commandstats"));
  std::string line;
  while (std::getline(lines, line)) {
    // cmdstat_get:calls=10,usec=20,usec_per_call=2.00,...
    if (line.rfind("cmdstat_", 0) != 0) continue;
    const auto colon = line.find(':');
    const std::string name = line.substr(8, colon - 8);
    double calls = 0;
    double usec = 0;
    std::sscanf(line.c_str() + colon + 1, "calls=%lf,usec=%lf", &calls, &usec);
    stats.commands[name] = {calls, usec};
  }
  std::istringstream cpu(command_text(context, "INFO cpu"));
  while (std::getline(cpu, line)) {
    double value = 0;
    if (std::sscanf(line.c_str(), "used_cpu_user:%lf", &value) == 1) stats.cpu_seconds += value;
    if (std::sscanf(line.c_str(), "used_cpu_sys:%lf", &value) == 1) stats.cpu_seconds += value;
  }
  return stats;
}

// Resets the statistics on construction; report() sets the per-call counters.
class ServerCost {
 public:
  explicit ServerCost(redisContext* context) : context_(context) {
    freeReplyObject(redisCommand(context_, "CONFIG RESETSTAT"));
    before_ = read_stats(context_);
  }
  void report(benchmark::State& state, double calls) {
    const ServerStats after = read_stats(context_);
    // Scripts' inner commands are counted under their own names too: when the client sent
    // scripts (a new key's calls send nothing else), its own commands are the scripts.
    double scripts = 0;
    double plain = 0;
    for (const auto& [name, figures] : after.commands) {
      if (name == "info" || name == "config") continue;
      if (name == "evalsha" || name == "eval" || name == "fcall") {
        scripts += figures.second;
      } else {
        plain += figures.second;
      }
    }
    const double own = scripts > 0 ? scripts : plain;
    state.counters["server_us"] = own / calls;
    state.counters["server_cpu_us"] = (after.cpu_seconds - before_.cpu_seconds) * 1e6 / calls;
  }

 private:
  redisContext* context_;
  ServerStats before_;
};

idem::ExecutionReport sample_report() {
  idem::ExecutionReport report;
  report.operation = "charge";
  return report;
}

// A replay: the key was completed once; every iteration claims it again (status completed).
void BM_RedisStore_Replay(benchmark::State& state) {
  redisContext* stats = connect_raw();
  if (stats == nullptr) return state.SkipWithError("cannot connect");
  const std::string key = "replay-" + std::to_string(g_stream++);
  const auto first = g_store->claim(key, std::nullopt, 30s);
  if (!g_store->complete(key, first.token, idem::StoredValue{nullptr, std::nullopt, "42"},
                         sample_report(), 1h)) {
    return state.SkipWithError("the replayed key was fenced off");
  }
  // A run of replays: the claim after a replay starts with a GET (the first after the new key
  // above would start with SET NX GET, which returns the record as well).
  if (g_store->claim(key, std::nullopt, 30s).status != idem::ClaimOutcome::Status::completed) {
    return state.SkipWithError("not a replay");
  }
  ServerCost cost(stats);
  for (auto _ : state) {
    const auto outcome = g_store->claim(key, std::nullopt, 30s);
    if (outcome.status != idem::ClaimOutcome::Status::completed) {
      state.SkipWithError("not a replay");
      break;
    }
  }
  cost.report(state, static_cast<double>(state.iterations()));
  state.SetItemsProcessed(state.iterations());
  redisFree(stats);
}
BENCHMARK(BM_RedisStore_Replay)->UseRealTime();

// A new key: claim (SET NX GET, as after another new key) and complete: two round trips.
void BM_RedisStore_NewKey(benchmark::State& state) {
  redisContext* stats = connect_raw();
  if (stats == nullptr) return state.SkipWithError("cannot connect");
  idem::bench::IdSequence ids(g_stream++);
  const idem::ExecutionReport report = sample_report();
  ServerCost cost(stats);
  for (auto _ : state) {
    const std::string key(ids.next());
    const auto claim = g_store->claim(key, std::nullopt, 30s);
    benchmark::DoNotOptimize(g_store->complete(
        key, claim.token, idem::StoredValue{nullptr, std::nullopt, "42"}, report, 1h));
  }
  cost.report(state, static_cast<double>(state.iterations()));
  state.SetItemsProcessed(state.iterations());
  redisFree(stats);
}
BENCHMARK(BM_RedisStore_NewKey)->UseRealTime();

// The floors: one plain command per call with raw hiredis.
void BM_RawGet(benchmark::State& state) {
  redisContext* context = connect_raw();
  if (context == nullptr) return state.SkipWithError("cannot connect");
  const std::string key = g_prefix + "raw-get";
  freeReplyObject(redisCommand(context, "SET %b 42", key.data(), key.size()));
  ServerCost cost(context);
  for (auto _ : state)
    freeReplyObject(redisCommand(context, "GET %b", key.data(), key.size()));
  cost.report(state, static_cast<double>(state.iterations()));
  state.SetItemsProcessed(state.iterations());
  redisFree(context);
}
BENCHMARK(BM_RawGet)->UseRealTime();

void BM_RawSetNx(benchmark::State& state) {
  redisContext* context = connect_raw();
  if (context == nullptr) return state.SkipWithError("cannot connect");
  idem::bench::IdSequence ids(g_stream++);
  std::string key;
  ServerCost cost(context);
  for (auto _ : state) {
    key.assign(g_prefix).append("raw:").append(ids.next());
    freeReplyObject(redisCommand(context, "SET %b 42 NX EX 3600", key.data(), key.size()));
  }
  cost.report(state, static_cast<double>(state.iterations()));
  state.SetItemsProcessed(state.iterations());
  redisFree(context);
}
BENCHMARK(BM_RawSetNx)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  const std::string url = idem::bench::take_redis_url(argc, argv);
  if (url.empty()) {
    std::fprintf(stderr,
                 "bench_redis_store: give --url=redis://HOST:PORT/DB (or IDEM_BENCH_REDIS_URL)\n");
    return 2;
  }
  g_prefix = "idem-bench:" + std::to_string(::getpid()) + ":";
  g_options = idem::redis::RedisOptions::from_url(url);
  g_options.key_prefix = g_prefix;
  g_options.pool_size = 1;
  g_store = std::make_shared<idem::redis::RedisIdempotencyStore>(g_options);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_store.reset();
  idem::bench::delete_keys_under_prefix(g_options);
  return 0;
}
