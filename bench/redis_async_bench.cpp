// The coroutine face of the Redis store against the blocking one and against raw pipelined
// hiredis, with 50 calls in flight:
//   async     AsyncRedisStore, 50 coroutines on one thread, one pipelined connection
//   blocking  RedisIdempotencyStore, 50 threads over its default pool (pool_size 8)
//   raw       one hiredis connection sending the very same commands 50 at a time
//             (append 50, read 50): the floor any client of these commands pays
// for new keys (claim: SET NX GET, as a claim after a new key starts; then complete: two round
// trips per call) and replays (claim of a completed key: one GET, as after a replay). Each
// mode runs 3 times; the medians and the ratios of the same run are printed. Then the same for one
// call in flight (async: one coroutine, blocking: one thread), and each mode's CPU per call: the
// client's (getrusage of this process) and the Redis server's (INFO cpu, user + system), both
// taken around the timed loop only.
//
//   bench_redis_async --url=redis://127.0.0.1:6379/0 [--calls=N]
//   bench_redis_async --url=... --mode=MODE --workload=new|replay [--calls=N]
//
// With --mode (async, blocking, raw, async-seq, blocking-seq: the last two with one call in
// flight) it runs that mode once and prints one JSON line: calls/s, client and server CPU µs per
// call (bench/redis_peers.sh runs it next to other clients this way).
//
// The URL comes from --url, IDEM_BENCH_REDIS_URL or IDEM_TEST_REDIS_URL. Keys go under
// "idem-bench-async:<pid>:" and are deleted at the end.
#include <hiredis/hiredis.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../backends/redis/src/operations.hpp"  // the very commands the stores send
#include "bench_flags.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "idem/redis/redis_store.hpp"
#include "redis_bench_support.hpp"

namespace {

using Seconds = std::chrono::duration<double>;
constexpr int kInFlight = 50;

idem::redis::RedisOptions g_options;
std::atomic<int> g_run{0};
std::unique_ptr<idem::redis::ConnectionPool> g_stats;  // INFO, apart from the measured clients

// One timed run: calls/s, and CPU µs per call of this process and of the Redis server.
struct Measurement {
  double rate = 0;
  double client_us = 0;
  double server_us = 0;
};

double server_cpu_seconds() {
  const auto info = g_stats->lease()->command({"INFO", "cpu"}).str;
  double seconds = 0;
  for (const char* field : {"used_cpu_user:", "used_cpu_sys:"}) {
    const auto at = info.find(field);
    if (at == std::string::npos) {
      std::fprintf(stderr, "INFO cpu has no %s\n", field);
      std::exit(1);
    }
    seconds += std::strtod(info.c_str() + at + std::strlen(field), nullptr);
  }
  return seconds;
}

double client_cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Times loop() (which makes `calls` calls), with the client's and the server's CPU around it.
template <typename Loop>
Measurement measure(int calls, Loop&& loop) {
  const double server_before = server_cpu_seconds();
  const double client_before = client_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  loop();
  const double elapsed = Seconds(std::chrono::steady_clock::now() - start).count();
  const double client = client_cpu_seconds() - client_before;
  const double server = server_cpu_seconds() - server_before;
  return {calls / elapsed, client * 1e6 / calls, server * 1e6 / calls};
}

std::string key_of(int run, int i) {
  return "k" + std::to_string(run) + ":" + std::to_string(i);
}

std::int64_t now_ms() {
  return idem::redis::detail::to_ms(idem::system_clock()->wall_now());
}

// ---- async ----------------------------------------------------------------------------------

Measurement run_async(int calls, bool replay, int run, int in_flight = kInFlight) {
  asio::io_context io;
  idem::redis::AsyncRedisStore store(io.get_executor(), g_options);
  const idem::ExecutionReport report;
  idem::StoredValue value;
  value.bytes = "result";
  if (replay) {  // set up the completed keys first
    std::atomic<int> next{0};
    for (int w = 0; w < kInFlight; ++w) {
      asio::co_spawn(
          io,
          [&]() -> idem::async::Task<void> {
            for (int i = next++; i < calls; i = next++) {
              const auto key = key_of(run, i);
              auto claim = co_await store.claim(key, std::nullopt, std::chrono::seconds(60));
              (void)co_await store.complete(key, claim.token, value, report,
                                            std::chrono::minutes(10));
            }
          },
          asio::detached);
    }
    io.run();
    io.restart();
  }
  std::atomic<int> next{0};
  for (int w = 0; w < in_flight; ++w) {
    asio::co_spawn(
        io,
        [&]() -> idem::async::Task<void> {
          for (int i = next++; i < calls; i = next++) {
            const auto key = key_of(run, i);
            auto claim = co_await store.claim(key, std::nullopt, std::chrono::seconds(60));
            if (!replay) {
              (void)co_await store.complete(key, claim.token, value, report,
                                            std::chrono::minutes(10));
            } else if (claim.status != idem::ClaimOutcome::Status::completed) {
              std::fprintf(stderr, "replay: key %s was not completed\n", key.c_str());
              std::exit(1);
            }
          }
        },
        asio::detached);
  }
  return measure(calls, [&] { io.run(); });
}

// ---- blocking -------------------------------------------------------------------------------

Measurement run_blocking(int calls, bool replay, int run, int in_flight = kInFlight) {
  idem::redis::RedisIdempotencyStore store(g_options);
  const idem::ExecutionReport report;
  idem::StoredValue value;
  value.bytes = "result";
  const auto in_threads = [&](int count, auto body) {
    std::atomic<int> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < count; ++t) {
      threads.emplace_back([&] {
        for (int i = next++; i < calls; i = next++)
          body(key_of(run, i));
      });
    }
    for (auto& thread : threads)
      thread.join();
  };
  const auto complete_new = [&](const std::string& key) {
    auto claim = store.claim(key, std::nullopt, std::chrono::seconds(60));
    (void)store.complete(key, claim.token, value, report, std::chrono::minutes(10));
  };
  if (replay) in_threads(kInFlight, complete_new);
  return measure(calls, [&] {
    if (replay) {
      in_threads(in_flight, [&](const std::string& key) {
        if (store.claim(key, std::nullopt, std::chrono::seconds(60)).status !=
            idem::ClaimOutcome::Status::completed) {
          std::fprintf(stderr, "replay: key %s was not completed\n", key.c_str());
          std::exit(1);
        }
      });
    } else {
      in_threads(in_flight, complete_new);
    }
  });
}

// ---- raw pipelined hiredis ------------------------------------------------------------------

void append(redisContext* context, const std::vector<std::string_view>& argv) {
  std::vector<const char*> pointers;
  std::vector<size_t> lengths;
  for (auto arg : argv) {
    pointers.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  redisAppendCommandArgv(context, static_cast<int>(argv.size()), pointers.data(), lengths.data());
}

void append(redisContext* context, const idem::redis::detail::ScriptInvocation& call) {
  const std::string numkeys = std::to_string(call.keys.size());
  append(context, idem::redis::detail::script_argv(call, numkeys, false));
}

void append(redisContext* context, const idem::redis::detail::Request& request) {
  if (request.is_script()) {
    append(context, request.script);
  } else {
    append(context, request.command_views());
  }
}

// hiredis's reply as idem's (what the stores' steps read).
idem::redis::RedisReply convert(const redisReply* r) {
  using Type = idem::redis::RedisReply::Type;
  idem::redis::RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = Type::string;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = Type::status;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = Type::error;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = Type::integer;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Type::array;
      for (std::size_t i = 0; i < r->elements; ++i)
        out.elements.push_back(convert(r->element[i]));
      break;
    default:
      out.type = Type::nil;
      break;
  }
  return out;
}

redisReply* get(redisContext* context) {
  void* reply = nullptr;
  if (redisGetReply(context, &reply) != REDIS_OK || reply == nullptr) {
    std::fprintf(stderr, "raw: %s\n", context->errstr);
    std::exit(1);
  }
  auto* r = static_cast<redisReply*>(reply);
  if (r->type == REDIS_REPLY_ERROR) {
    std::fprintf(stderr, "raw: %s\n", r->str);
    std::exit(1);
  }
  return r;
}

Measurement run_raw(int calls, bool replay, int run) {
  timeval timeout{10, 0};
  redisContext* context = redisConnectWithTimeout(g_options.host.c_str(), g_options.port, timeout);
  if (context == nullptr || context->err != 0) {
    std::fprintf(stderr, "raw: cannot connect\n");
    std::exit(1);
  }
  const idem::ExecutionReport report;
  idem::StoredValue value;
  value.bytes = "result";
  const auto window = [&](int first, int n, bool complete) {
    // Every claim's steps, pipelined across the window: all first requests, then all second ones.
    std::vector<std::string> keys;
    keys.reserve(static_cast<std::size_t>(n));
    std::vector<idem::redis::detail::StoreClaim> claims;
    claims.reserve(static_cast<std::size_t>(n));
    for (int i = first; i < first + n; ++i) {
      keys.push_back(key_of(run, i));
      // Started as idem's claims start in a run of the same kind (next_claim_reads_first()):
      // replays read first, new keys go straight to SET NX GET.
      claims.emplace_back(g_options, now_ms(), keys.back(), std::nullopt, std::chrono::seconds(60),
                          /*read_first=*/!complete);
    }
    std::vector<std::size_t> pending(claims.size());
    for (std::size_t i = 0; i < pending.size(); ++i)
      pending[i] = i;
    while (!pending.empty()) {
      for (std::size_t i : pending)
        append(context, claims[i].request());
      std::vector<std::size_t> next;
      for (std::size_t i : pending) {
        redisReply* r = get(context);
        if (!claims[i].read(convert(r), "raw")) next.push_back(i);
        freeReplyObject(r);
      }
      pending = std::move(next);
    }
    std::vector<std::uint64_t> tokens;
    for (auto& claim : claims)
      tokens.push_back(claim.outcome().token);
    if (!complete) return;
    for (int i = 0; i < n; ++i) {
      append(context, idem::redis::detail::store_complete_call(
                          g_options, now_ms(), key_of(run, first + i), tokens[i], value, report,
                          std::chrono::minutes(10)));
    }
    for (int i = 0; i < n; ++i)
      freeReplyObject(get(context));
  };
  const auto all = [&](bool complete) {
    for (int first = 0; first < calls; first += kInFlight)
      window(first, std::min(kInFlight, calls - first), complete);
  };
  // The script is cached by the earlier modes' runs; SCRIPT LOAD makes sure.
  {
    const std::string source(idem::redis::detail::store_complete_script().source);
    freeReplyObject(redisCommand(context, "SCRIPT LOAD %b", source.data(), source.size()));
  }
  if (replay) all(true);
  const auto measured = measure(calls, [&] { all(!replay); });
  redisFree(context);
  return measured;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double median(const std::vector<Measurement>& runs, double Measurement::*field) {
  std::vector<double> v;
  for (const auto& run : runs)
    v.push_back(run.*field);
  return median(std::move(v));
}

}  // namespace

int main(int argc, char** argv) {
  using idem::bench::take_flag;
  const std::string url = idem::bench::take_redis_url(argc, argv);
  const std::string calls_flag = take_flag(argc, argv, "calls");
  const std::string mode = take_flag(argc, argv, "mode");
  const std::string workload = take_flag(argc, argv, "workload");
  if (url.empty()) {
    std::fprintf(stderr, "bench_redis_async: give --url=redis://HOST:PORT/DB\n");
    return 2;
  }
  const int calls = calls_flag.empty() ? 20000 : std::stoi(calls_flag);
  g_options = idem::redis::RedisOptions::from_url(url);
  g_options.key_prefix = "idem-bench-async:" + std::to_string(::getpid()) + ":";
  g_options.command_timeout = std::chrono::seconds(10);
  g_stats = std::make_unique<idem::redis::ConnectionPool>(g_options);

  const auto run_mode = [&](const std::string& name, bool replay) -> Measurement {
    if (name == "async") return run_async(calls, replay, g_run++);
    if (name == "blocking") return run_blocking(calls, replay, g_run++);
    if (name == "raw") return run_raw(calls, replay, g_run++);
    if (name == "async-seq") return run_async(calls, replay, g_run++, 1);
    return run_blocking(calls, replay, g_run++, 1);  // blocking-seq
  };
  if (!mode.empty()) {
    const std::vector<std::string> modes{"async", "blocking", "raw", "async-seq", "blocking-seq"};
    if (std::find(modes.begin(), modes.end(), mode) == modes.end() ||
        (workload != "new" && workload != "replay")) {
      std::fprintf(stderr,
                   "bench_redis_async: --mode is async, blocking, raw, async-seq or blocking-seq; "
                   "--workload is new or replay\n");
      return 2;
    }
    const auto m = run_mode(mode, workload == "replay");
    idem::bench::delete_keys_under_prefix(g_options);
    std::printf(
        "{\"library\":\"idem\",\"mode\":\"%s\",\"workload\":\"%s\",\"calls\":%d,"
        "\"in_flight\":%d,\"calls_per_s\":%.1f,\"client_cpu_us_per_call\":%.3f,"
        "\"server_cpu_us_per_call\":%.3f}\n",
        mode.c_str(), workload.c_str(), calls, mode.ends_with("-seq") ? 1 : kInFlight, m.rate,
        m.client_us, m.server_us);
    return 0;
  }

  std::printf("%d calls per run, %d in flight, medians of 3 (calls/s)\n", calls, kInFlight);
  std::printf("%-9s %12s %12s %12s %16s %12s\n", "workload", "async", "blocking", "raw",
              "async/blocking", "raw/async");
  const std::vector<std::string> modes{"async", "blocking", "raw", "async-seq", "blocking-seq"};
  std::vector<std::vector<Measurement>> runs[2];  // [replay][mode]
  for (const bool replay : {false, true}) {
    auto& by_mode = runs[replay];
    by_mode.resize(modes.size());
    for (int repeat = 0; repeat < 3; ++repeat) {
      for (std::size_t m = 0; m < modes.size(); ++m)
        by_mode[m].push_back(run_mode(modes[m], replay));
      idem::bench::delete_keys_under_prefix(g_options);
    }
    const double a = median(by_mode[0], &Measurement::rate);
    const double b = median(by_mode[1], &Measurement::rate);
    const double r = median(by_mode[2], &Measurement::rate);
    std::printf("%-9s %12.0f %12.0f %12.0f %15.2fx %11.2fx\n", replay ? "replay" : "new", a, b, r,
                a / b, r / a);
  }
  std::printf("\n1 in flight, medians of 3 (calls/s)\n%-9s %12s %12s %16s\n", "workload", "async",
              "blocking", "async/blocking");
  for (const bool replay : {false, true}) {
    const double a = median(runs[replay][3], &Measurement::rate);
    const double b = median(runs[replay][4], &Measurement::rate);
    std::printf("%-9s %12.0f %12.0f %15.2fx\n", replay ? "replay" : "new", a, b, a / b);
  }
  std::printf("\nCPU per call, medians of 3 (µs, client / Redis server)\n%-9s", "workload");
  for (const auto& name : modes)
    std::printf(" %15s", name.c_str());
  std::printf("\n");
  for (const bool replay : {false, true}) {
    std::printf("%-9s", replay ? "replay" : "new");
    for (const auto& by_mode : runs[replay]) {
      std::printf(" %7.1f /%6.1f", median(by_mode, &Measurement::client_us),
                  median(by_mode, &Measurement::server_us));
    }
    std::printf("\n");
  }
  idem::bench::delete_keys_under_prefix(g_options);
  return 0;
}
