// The Redis recorder's mark throughput at concurrency C (threads, one pooled connection each)
// and pipelining P (ids per mark_processed_batch call; 1 = mark_processed), next to a raw hiredis
// loop sending the very same commands (SET <marker key> <ms> NX, P per round trip) from C threads
// with one connection each — the cost of idem itself, without redis-benchmark's event loop.
//
//   bench_redis_recorder --url=redis://127.0.0.1:6379/0 [--clients=C] [--pipeline=P] [--requests=N]
//               [google-benchmark flags]
//
// Without --clients/--pipeline it runs C in {1, 8} x P in {1, 16}. --requests fixes the marks
// per benchmark run (split over the threads), as redis-benchmark -n does; by default Google
// Benchmark picks the count. BM_IdemCheckMarkWindow/batch:B checks and marks windows of 64 new
// events on one connection, per event (B = 0) or with is_processed_many + mark_processed_many
// (B = 1). The URL comes from --url, IDEM_BENCH_REDIS_URL or
// IDEM_TEST_REDIS_URL. Keys go under the prefix "idem-bench:<pid>:" and are deleted at the end.
// bench/redis_vs_redis_benchmark.sh runs this next to redis-benchmark and prints the ratio.
#include <benchmark/benchmark.h>
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_flags.hpp"
#include "bench_ids.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "recorder_window.hpp"
#include "redis_bench_support.hpp"

namespace {

constexpr std::string_view kConsumer = "bench";

std::atomic<std::uint64_t> g_streams{1};  // a fresh id stream per thread and run

std::string g_prefix;
idem::redis::RedisOptions g_options;

// One benchmark: a recorder with exactly `clients` warm connections.
struct IdemCase {
  std::shared_ptr<idem::redis::RedisIdempotencyRecorder> recorder;
  int pipeline = 1;
};

void BM_IdemRecorder(benchmark::State& state, const IdemCase* c) {
  idem::bench::IdSequence ids(g_streams++);
  idem::bench::mark_stream(state, *c->recorder, kConsumer, ids, c->pipeline);
}

// A window of 64 new events on one connection: a check and a mark per event (batch:0), or one
// is_processed_many and one mark_processed_many (batch:1).
void BM_IdemCheckMarkWindow(benchmark::State& state, const IdemCase* c) {
  idem::bench::IdSequence ids(g_streams++);
  idem::bench::check_mark_window(state, *c->recorder, kConsumer, ids, state.range(0) != 0);
}

// The same commands with plain hiredis: the same marker keys, SET key ms NX, P per round trip.
void BM_RawHiredis(benchmark::State& state, int pipeline) {
  timeval timeout{2, 0};
  redisContext* context = redisConnectWithTimeout(g_options.host.c_str(), g_options.port, timeout);
  if (context == nullptr || context->err != 0) {
    state.SkipWithError("cannot connect");
    if (context != nullptr) redisFree(context);
    return;
  }
  idem::bench::IdSequence ids(g_streams++);
  const std::string marker_prefix = g_prefix + "m:{" + std::string(kConsumer) + ":";
  std::string key;
  for (auto _ : state) {
    const std::string ts = std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              std::chrono::system_clock::now().time_since_epoch())
                                              .count());
    for (int i = 0; i < pipeline; ++i) {
      key.assign(marker_prefix).append(ids.next()).append("}");
      const char* argv[] = {"SET", key.c_str(), ts.c_str(), "NX"};
      const size_t lengths[] = {3, key.size(), ts.size(), 2};
      redisAppendCommandArgv(context, 4, argv, lengths);
    }
    for (int i = 0; i < pipeline; ++i) {
      void* reply = nullptr;
      if (redisGetReply(context, &reply) != REDIS_OK) {
        state.SkipWithError(context->errstr);
        break;
      }
      freeReplyObject(reply);
    }
  }
  redisFree(context);
  state.SetItemsProcessed(state.iterations() * pipeline);
}

}  // namespace

int main(int argc, char** argv) {
  using idem::bench::take_flag;
  const std::string url = idem::bench::take_redis_url(argc, argv);
  const std::string clients_flag = take_flag(argc, argv, "clients");
  const std::string pipeline_flag = take_flag(argc, argv, "pipeline");
  const std::string requests_flag = take_flag(argc, argv, "requests");
  if (url.empty()) {
    std::fprintf(
        stderr,
        "bench_redis_recorder: give --url=redis://HOST:PORT/DB (or IDEM_BENCH_REDIS_URL)\n");
    return 2;
  }
  g_prefix = "idem-bench:" + std::to_string(::getpid()) + ":";
  g_options = idem::redis::RedisOptions::from_url(url);
  g_options.key_prefix = g_prefix;
  g_options.command_timeout = std::chrono::seconds(10);

  std::vector<int> clients = {1, 8};
  std::vector<int> pipelines = {1, 16};
  if (!clients_flag.empty()) clients = {std::stoi(clients_flag)};
  if (!pipeline_flag.empty()) pipelines = {std::stoi(pipeline_flag)};
  const long long requests = requests_flag.empty() ? 0 : std::stoll(requests_flag);

  std::vector<std::unique_ptr<IdemCase>> cases;
  for (int c : clients) {
    for (int p : pipelines) {
      auto options = g_options;
      options.pool_size = static_cast<std::size_t>(c);
      auto idem_case = std::make_unique<IdemCase>();
      idem_case->recorder = std::make_shared<idem::redis::RedisIdempotencyRecorder>(options);
      idem_case->pipeline = p;
      {  // open every connection now, not inside the timed loop
        std::vector<idem::redis::ConnectionLease> warm;
        for (int i = 0; i < c; ++i)
          warm.push_back(idem_case->recorder->pool()->lease());
      }
      const std::string suffix = "/c:" + std::to_string(c) + "/p:" + std::to_string(p);
      auto* idem_bench = benchmark::RegisterBenchmark(("BM_IdemRecorder" + suffix).c_str(),
                                                      BM_IdemRecorder, idem_case.get());
      auto* raw_bench =
          benchmark::RegisterBenchmark(("BM_RawHiredis" + suffix).c_str(), BM_RawHiredis, p);
      for (auto* b : {idem_bench, raw_bench}) {
        b->Threads(c)->UseRealTime();
        if (requests > 0) b->Iterations(std::max<long long>(1, requests / c / p));
      }
      cases.push_back(std::move(idem_case));
    }
  }
  {
    auto options = g_options;
    options.pool_size = 1;
    auto window_case = std::make_unique<IdemCase>();
    window_case->recorder = std::make_shared<idem::redis::RedisIdempotencyRecorder>(options);
    benchmark::RegisterBenchmark("BM_IdemCheckMarkWindow", BM_IdemCheckMarkWindow,
                                 window_case.get())
        ->Arg(0)
        ->Arg(1)
        ->ArgName("batch")
        ->UseRealTime();
    cases.push_back(std::move(window_case));
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  idem::bench::delete_keys_under_prefix(g_options);
  return 0;
}
