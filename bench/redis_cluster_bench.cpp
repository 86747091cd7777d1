// The Redis backend on a Redis Cluster, a primary with a replica (min_replicas) and a Sentinel
// group, next to raw hiredis sending the same commands to the same nodes. Two modes:
//
//   bench_redis_cluster --url=URL [--clients=C] [--pipeline=P] [--requests=N]
//                       [--replay-keys=K] [google-benchmark flags]
//   bench_redis_cluster --mode=recover --url=URL --kill-pid=PID [--primary-port=PORT]
//
// Benchmarks (URL: redis://, redis+cluster://, with or without ?min_replicas=N):
//   BM_IdemMarks/c:C/p:P     C threads, each marking fresh ids: mark_processed (P = 1) or
//                            mark_processed_batch of P ids (split by node, one round trip each,
//                            all nodes written before any reply is read)
//   BM_RawMarks/c:C/p:P      the same SET <marker key> <ms> NX commands with hiredis: C threads,
//                            each with a connection to every primary, the P keys of a batch routed
//                            by their slot (CLUSTER SLOTS, read once), every node's part written
//                            before any reply is read
//   BM_IdemReplays/c:C       C threads, each a store claim of a completed key (status completed:
//                            one GET), cycling over K keys "replay:<12 digits>" completed first
//   BM_RawReplays/c:C        the same GET of the same record keys with hiredis, routed by slot
//   BM_IdemClaimComplete/c:C recorder claim + complete of fresh ids (two scripts)
//   BM_StoreClaimComplete/c:C  store claim + complete of fresh keys
// --requests fixes the calls per benchmark run (split over the threads, in ids for the marks);
// without it Google Benchmark picks the count. Keys go under the prefix "idem:" (the shape
// redis-benchmark is given by bench/redis_cluster_bench.sh); use servers of your own, the binary
// does not delete them (the script flushes every node between runs).
//
// --mode=recover: time to the first success after a primary is killed. A recorder on URL (a
// redis+cluster:// or redis+sentinel:// URL; connect and command timeout 100 / 200 ms, one
// connection) marks fresh ids until 200 have succeeded; then this program sends SIGKILL to PID
// (the primary's redis-server) and marks again, a fresh id per call and 5 ms between failed calls,
// until one succeeds or 60 s pass. On a cluster, --primary-port=PORT names the killed primary and
// only ids whose marker key hashes to a slot it served are used, so the first success is on the
// replica promoted in its place. Meanwhile a second thread asks the servers every 10 ms who the
// primary is (CLUSTER SLOTS of another primary; SENTINEL get-master-addr-by-name of the first
// sentinel) until they name another one. Prints "recovery_ms=<ms> promoted_ms=<ms>
// failed_calls=<n>" (promoted_ms -1: not reported within 5 s of the success); exits 1 when no call
// succeeded in time. bench/redis_cluster_bench.sh runs all of this.
#include <benchmark/benchmark.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_flags.hpp"
#include "bench_ids.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "recorder_window.hpp"

namespace {

using namespace std::chrono_literals;

constexpr std::string_view kConsumer = "bench";
constexpr std::size_t kSlots = 16384;

std::atomic<std::uint64_t> g_streams{1};  // a fresh id stream per thread and run
idem::redis::RedisOptions g_options;
std::size_t g_replay_keys = 1000;

// CRC16/XMODEM, the hash Redis Cluster takes modulo 16384 (of the hash tag when the key has one).
std::uint16_t crc16(std::string_view data) {
  std::uint16_t crc = 0;
  for (unsigned char byte : data) {
    crc = static_cast<std::uint16_t>(crc ^ (byte << 8));
    for (int bit = 0; bit < 8; ++bit)
      crc = (crc & 0x8000) != 0 ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<std::uint16_t>(crc << 1);
  }
  return crc;
}

std::size_t key_slot(std::string_view key) {
  const auto open = key.find('{');
  if (open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return crc16(key) % kSlots;
}

struct Node {
  std::string host;
  int port = 0;
};

redisContext* connect_node(const Node& node) {
  timeval timeout{5, 0};
  redisContext* context = redisConnectWithTimeout(node.host.c_str(), node.port, timeout);
  if (context == nullptr || context->err != 0) {
    if (context != nullptr) redisFree(context);
    throw std::runtime_error("cannot connect to " + node.host + ":" + std::to_string(node.port));
  }
  return context;
}

// The primaries and which of them serves each slot: CLUSTER SLOTS of the first seed on a cluster,
// the one server (all slots) otherwise.
struct Layout {
  std::vector<Node> primaries;
  std::array<std::uint16_t, kSlots> slot_node{};

  static Layout read(const idem::redis::RedisOptions& options) {
    Layout layout;
    if (!options.is_cluster()) {
      layout.primaries.push_back({options.host, options.port});
      return layout;
    }
    const auto& seed = options.cluster_nodes.front();
    redisContext* context = connect_node({seed.host, seed.port});
    auto* reply = static_cast<redisReply*>(redisCommand(context, "CLUSTER SLOTS"));
    if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY) {
      redisFree(context);
      throw std::runtime_error("CLUSTER SLOTS failed");
    }
    for (std::size_t i = 0; i < reply->elements; ++i) {
      const redisReply* range = reply->element[i];
      const redisReply* primary = range->element[2];
      Node node{std::string(primary->element[0]->str, primary->element[0]->len),
                static_cast<int>(primary->element[1]->integer)};
      std::size_t index = 0;
      while (index < layout.primaries.size() && (layout.primaries[index].host != node.host ||
                                                 layout.primaries[index].port != node.port))
        ++index;
      if (index == layout.primaries.size()) layout.primaries.push_back(node);
      for (long long slot = range->element[0]->integer; slot <= range->element[1]->integer; ++slot)
        layout.slot_node[static_cast<std::size_t>(slot)] = static_cast<std::uint16_t>(index);
    }
    freeReplyObject(reply);
    redisFree(context);
    return layout;
  }
};

Layout g_layout;

// One connection to every primary, as a raw client of a cluster holds.
class RawNodes {
 public:
  RawNodes() {
    for (const Node& node : g_layout.primaries)
      contexts_.push_back(connect_node(node));
  }
  ~RawNodes() {
    for (redisContext* context : contexts_)
      redisFree(context);
  }
  RawNodes(const RawNodes&) = delete;
  RawNodes& operator=(const RawNodes&) = delete;

  // Queues a command for the primary of `key`'s slot.
  void append(std::string_view key, int argc, const char** argv, const size_t* lengths) {
    const std::size_t node = g_layout.slot_node[key_slot(key)];
    redisAppendCommandArgv(contexts_[node], argc, argv, lengths);
    order_.push_back(node);
  }
  // Writes every node's queued commands, then reads the replies; false on an error.
  bool flush() {
    for (redisContext* context : contexts_) {
      int done = 0;
      while (done == 0) {
        if (redisBufferWrite(context, &done) != REDIS_OK) return false;
      }
    }
    bool ok = true;
    for (std::size_t node : order_) {
      void* reply = nullptr;
      if (redisGetReply(contexts_[node], &reply) != REDIS_OK) return false;
      if (static_cast<redisReply*>(reply)->type == REDIS_REPLY_ERROR) ok = false;
      freeReplyObject(reply);
    }
    order_.clear();
    return ok;
  }

 private:
  std::vector<redisContext*> contexts_;
  std::vector<std::size_t> order_;
};

struct Case {
  std::shared_ptr<idem::redis::RedisIdempotencyRecorder> recorder;
  std::shared_ptr<idem::redis::RedisIdempotencyStore> store;
  int pipeline = 1;
};

void BM_IdemMarks(benchmark::State& state, const Case* c) {
  idem::bench::IdSequence ids(g_streams++);
  idem::bench::mark_stream(state, *c->recorder, kConsumer, ids, c->pipeline);
}

void BM_RawMarks(benchmark::State& state, int pipeline) {
  std::unique_ptr<RawNodes> nodes;
  try {
    nodes = std::make_unique<RawNodes>();
  } catch (const std::exception& e) {
    return state.SkipWithError(e.what());
  }
  idem::bench::IdSequence ids(g_streams++);
  const std::string marker_prefix = g_options.key_prefix + "m:{" + std::string(kConsumer) + ":";
  std::vector<std::string> keys(static_cast<std::size_t>(pipeline));
  for (auto _ : state) {
    const std::string ts = std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              std::chrono::system_clock::now().time_since_epoch())
                                              .count());
    for (std::string& key : keys) {
      key.assign(marker_prefix).append(ids.next()).append("}");
      const char* argv[] = {"SET", key.c_str(), ts.c_str(), "NX"};
      const size_t lengths[] = {3, key.size(), ts.size(), 2};
      nodes->append(key, 4, argv, lengths);
    }
    if (!nodes->flush()) {
      state.SkipWithError("a SET failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * pipeline);
}

std::string replay_key(std::size_t i) {
  char digits[16];
  std::snprintf(digits, sizeof digits, "%012zu", i);
  return std::string("replay:") + digits;
}

idem::ExecutionReport sample_report() {
  idem::ExecutionReport report;
  report.operation = "charge";
  return report;
}

// Completes the K replay keys (once per process; later calls find them completed).
void complete_replay_keys(idem::redis::RedisIdempotencyStore& store) {
  const idem::ExecutionReport report = sample_report();
  for (std::size_t i = 0; i < g_replay_keys; ++i) {
    const std::string key = replay_key(i);
    const auto outcome = store.claim(key, std::nullopt, 30s);
    if (outcome.status == idem::ClaimOutcome::Status::acquired) {
      (void)store.complete(key, outcome.token, idem::StoredValue{nullptr, std::nullopt, "42"},
                           report, 24h);
    }
  }
}

void BM_IdemReplays(benchmark::State& state, const Case* c) {
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < g_replay_keys; ++i)
    keys.push_back(replay_key(i));
  std::size_t next = static_cast<std::size_t>(state.thread_index()) * 7919;
  for (auto _ : state) {
    const auto outcome = c->store->claim(keys[next++ % keys.size()], std::nullopt, 30s);
    if (outcome.status != idem::ClaimOutcome::Status::completed) {
      state.SkipWithError("not a replay");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_RawReplays(benchmark::State& state, const Case* c) {
  std::unique_ptr<RawNodes> nodes;
  try {
    nodes = std::make_unique<RawNodes>();
  } catch (const std::exception& e) {
    return state.SkipWithError(e.what());
  }
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < g_replay_keys; ++i)
    keys.push_back(c->store->record_key(replay_key(i)));
  std::size_t next = static_cast<std::size_t>(state.thread_index()) * 7919;
  for (auto _ : state) {
    const std::string& key = keys[next++ % keys.size()];
    const char* argv[] = {"GET", key.c_str()};
    const size_t lengths[] = {3, key.size()};
    nodes->append(key, 2, argv, lengths);
    if (!nodes->flush()) {
      state.SkipWithError("a GET failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_IdemClaimComplete(benchmark::State& state, const Case* c) {
  idem::bench::IdSequence ids(g_streams++);
  for (auto _ : state) {
    const std::string_view id = ids.next();
    const auto claim = c->recorder->claim(kConsumer, id, 30s);
    if (claim.status != idem::Claim::Status::acquired ||
        !c->recorder->complete(kConsumer, id, claim.token)) {
      state.SkipWithError("a new id was not claimed and completed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_StoreClaimComplete(benchmark::State& state, const Case* c) {
  idem::bench::IdSequence ids(g_streams++);
  const idem::ExecutionReport report = sample_report();
  for (auto _ : state) {
    const std::string key(ids.next());
    const auto claim = c->store->claim(key, std::nullopt, 30s);
    if (claim.status != idem::ClaimOutcome::Status::acquired ||
        !c->store->complete(key, claim.token, idem::StoredValue{nullptr, std::nullopt, "42"},
                            report, 1h)) {
      state.SkipWithError("a new key was not claimed and completed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

// The port the primary has now, as the servers report it: CLUSTER SLOTS of `context` (a node
// that stays up) for `slot`, or SENTINEL get-master-addr-by-name of `context` (a sentinel). 0 when
// the reply says nothing yet.
int reported_primary(redisContext* context, std::size_t slot, const std::string& master) {
  auto* reply = static_cast<redisReply*>(
      master.empty()
          ? redisCommand(context, "CLUSTER SLOTS")
          : redisCommand(context, "SENTINEL get-master-addr-by-name %s", master.c_str()));
  int port = 0;
  if (reply != nullptr && reply->type == REDIS_REPLY_ARRAY) {
    if (!master.empty() && reply->elements == 2) {
      port = std::atoi(reply->element[1]->str);
    } else if (master.empty()) {
      for (std::size_t i = 0; i < reply->elements; ++i) {
        const redisReply* range = reply->element[i];
        if (static_cast<std::size_t>(range->element[0]->integer) <= slot &&
            slot <= static_cast<std::size_t>(range->element[1]->integer))
          port = static_cast<int>(range->element[2]->element[1]->integer);
      }
    }
  }
  if (reply != nullptr) freeReplyObject(reply);
  return port;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::steady_clock::now() - start)
                                 .count()) /
         1e3;
}

// --mode=recover: see the top of this file.
int recover(const std::string& url, pid_t victim, int primary_port) {
  auto options = idem::redis::RedisOptions::from_url(url);
  options.connect_timeout = 100ms;
  options.command_timeout = 200ms;
  options.wait_timeout = 200ms;
  options.pool_size = 1;
  idem::redis::RedisIdempotencyRecorder recorder(options);

  // On a cluster, the slots the victim serves, and another primary to ask who serves them; through
  // Sentinel, the first sentinel and the primary it names now.
  std::vector<bool> victim_slot(kSlots, true);
  std::size_t watched_slot = 0;
  Node witness;
  int victim_port = primary_port;
  std::string master;
  if (options.is_cluster()) {
    const Layout layout = Layout::read(options);
    std::fill(victim_slot.begin(), victim_slot.end(), false);
    std::size_t served = 0;
    for (std::size_t slot = 0; slot < kSlots; ++slot) {
      if (layout.primaries[layout.slot_node[slot]].port == primary_port) {
        if (served++ == 0) watched_slot = slot;
        victim_slot[slot] = true;
      }
    }
    for (const Node& node : layout.primaries) {
      if (node.port != primary_port) witness = node;
    }
    if (served == 0 || witness.port == 0) {
      std::fprintf(stderr, "bench_redis_cluster: give --primary-port=PORT, a primary's port\n");
      return 2;
    }
  } else if (options.is_sentinel()) {
    witness = {options.sentinel_nodes.front().host, options.sentinel_nodes.front().port};
    master = options.sentinel_master;
  } else {
    std::fprintf(stderr, "bench_redis_cluster: --mode=recover needs a cluster or sentinel URL\n");
    return 2;
  }
  redisContext* watch = connect_node(witness);
  if (master.size() > 0) victim_port = reported_primary(watch, 0, master);

  idem::bench::IdSequence ids(static_cast<std::uint64_t>(::getpid()));
  std::string id;
  auto next_id = [&] {
    do {
      id.assign(ids.next());
    } while (!victim_slot[key_slot(recorder.marker_key(kConsumer, id))]);
    return std::string_view(id);
  };
  for (int marked = 0; marked < 200; ++marked)
    recorder.mark_processed(kConsumer, next_id());

  if (::kill(victim, SIGKILL) != 0) {
    std::perror("bench_redis_cluster: kill");
    redisFree(watch);
    return 2;
  }
  const auto killed = std::chrono::steady_clock::now();
  // The servers' side: polled every 10 ms until they name another primary.
  std::atomic<bool> done{false};
  std::atomic<double> promoted_ms{-1};
  std::thread watcher([&] {
    while (!done && std::chrono::steady_clock::now() - killed < 60s) {
      const int port = reported_primary(watch, watched_slot, master);
      if (port != 0 && port != victim_port) {
        promoted_ms = ms_since(killed);
        return;
      }
      std::this_thread::sleep_for(10ms);
    }
  });
  long failed = 0;
  double recovered_ms = -1;
  while (std::chrono::steady_clock::now() - killed < 60s) {
    try {
      recorder.mark_processed(kConsumer, next_id());
      recovered_ms = ms_since(killed);
      break;
    } catch (const std::exception&) {
      ++failed;
      std::this_thread::sleep_for(5ms);
    }
  }
  // The servers may name the new primary only after the first success: up to 5 s more for it.
  for (int i = 0; i < 500 && promoted_ms < 0 && recovered_ms >= 0; ++i)
    std::this_thread::sleep_for(10ms);
  done = true;
  watcher.join();
  redisFree(watch);
  if (recovered_ms < 0) {
    std::printf("recovery_ms=none promoted_ms=%.1f failed_calls=%ld\n", promoted_ms.load(), failed);
    return 1;
  }
  std::printf("recovery_ms=%.1f promoted_ms=%.1f failed_calls=%ld\n", recovered_ms,
              promoted_ms.load(), failed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using idem::bench::take_flag;
  const std::string url = take_flag(argc, argv, "url");
  const std::string clients_flag = take_flag(argc, argv, "clients");
  const std::string pipeline_flag = take_flag(argc, argv, "pipeline");
  const std::string requests_flag = take_flag(argc, argv, "requests");
  const std::string replay_flag = take_flag(argc, argv, "replay-keys");
  const std::string mode = take_flag(argc, argv, "mode");
  const std::string victim_flag = take_flag(argc, argv, "kill-pid");
  const std::string primary_flag = take_flag(argc, argv, "primary-port");
  if (url.empty()) {
    std::fprintf(stderr, "bench_redis_cluster: give --url=redis://... or redis+cluster://...\n");
    return 2;
  }
  try {
    if (mode == "recover") {
      if (victim_flag.empty()) {
        std::fprintf(stderr, "bench_redis_cluster: --mode=recover needs --kill-pid=PID\n");
        return 2;
      }
      return recover(url, static_cast<pid_t>(std::stol(victim_flag)),
                     primary_flag.empty() ? 0 : std::stoi(primary_flag));
    }
    g_options = idem::redis::RedisOptions::from_url(url);
    g_options.key_prefix = "idem:";
    g_options.command_timeout = std::chrono::seconds(10);
    if (!replay_flag.empty()) g_replay_keys = std::stoul(replay_flag);
    g_layout = Layout::read(g_options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_redis_cluster: %s\n", e.what());
    return 1;
  }

  std::vector<int> clients = {1, 8};
  std::vector<int> pipelines = {1, 16};
  if (!clients_flag.empty()) clients = {std::stoi(clients_flag)};
  if (!pipeline_flag.empty()) pipelines = {std::stoi(pipeline_flag)};
  const long long requests = requests_flag.empty() ? 0 : std::stoll(requests_flag);

  std::vector<std::unique_ptr<Case>> cases;
  try {  // the recorders connect (and complete the replay keys) here
    for (int c : clients) {
      auto options = g_options;
      options.pool_size = static_cast<std::size_t>(c);
      auto recorder = std::make_shared<idem::redis::RedisIdempotencyRecorder>(options);
      auto store = std::make_shared<idem::redis::RedisIdempotencyStore>(recorder->pool());
      {  // open every connection now (on a cluster: to every primary), not inside the timed loop
        idem::bench::IdSequence ids(g_streams++);
        std::vector<std::string> warm_ids;
        for (int i = 0; i < 64; ++i)
          warm_ids.emplace_back(ids.next());
        std::vector<std::thread> threads;
        for (int i = 0; i < c; ++i)
          threads.emplace_back([&] { recorder->mark_processed_batch(kConsumer, warm_ids); });
        for (auto& thread : threads)
          thread.join();
      }
      complete_replay_keys(*store);
      const std::string per_client = "/c:" + std::to_string(c);
      auto limit = [&](benchmark::internal::Benchmark* b, int per_call) {
        b->Threads(c)->UseRealTime();
        if (requests > 0) b->Iterations(std::max<long long>(1, requests / c / per_call));
      };
      for (int p : pipelines) {
        auto idem_case = std::make_unique<Case>();
        idem_case->recorder = recorder;
        idem_case->store = store;
        idem_case->pipeline = p;
        const std::string suffix = per_client + "/p:" + std::to_string(p);
        limit(benchmark::RegisterBenchmark(("BM_IdemMarks" + suffix).c_str(), BM_IdemMarks,
                                           idem_case.get()),
              p);
        limit(benchmark::RegisterBenchmark(("BM_RawMarks" + suffix).c_str(), BM_RawMarks, p), p);
        cases.push_back(std::move(idem_case));
      }
      auto single = std::make_unique<Case>();
      single->recorder = recorder;
      single->store = store;
      limit(benchmark::RegisterBenchmark(("BM_IdemReplays" + per_client).c_str(), BM_IdemReplays,
                                         single.get()),
            1);
      limit(benchmark::RegisterBenchmark(("BM_RawReplays" + per_client).c_str(), BM_RawReplays,
                                         single.get()),
            1);
      limit(benchmark::RegisterBenchmark(("BM_IdemClaimComplete" + per_client).c_str(),
                                         BM_IdemClaimComplete, single.get()),
            1);
      limit(benchmark::RegisterBenchmark(("BM_StoreClaimComplete" + per_client).c_str(),
                                         BM_StoreClaimComplete, single.get()),
            1);
      cases.push_back(std::move(single));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_redis_cluster: %s\n", e.what());
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
