// The worker processes of the PostgreSQL process tests. Their executable (process_postgres)
// defines main() with IDEM_POSTGRES_WORKER_MAIN() once, in postgres_worker_main.cpp: run as
// `<binary> --postgres-worker COMMAND ...` it is a worker, otherwise it runs its tests. The
// tests start workers with fork+exec of /proc/self/exe (ThreadSanitizer-safe, see
// worker/child_process.hpp), so the PostgreSQL section needs no change to the shared
// idem_test_worker.
//
//   consume --schema S --mode exclusive|transactional --consumer C --events FILE --worker W
//           [--effects FILE] [--lease-ms N] [--wait-go]
//     Delivers every event id in FILE (one per line) to an IdempotentHandler on a
//     PostgresIdempotencyRecorder in schema S. The side effect of an event is
//       exclusive:     the line "<id>\n" appended to the --effects file (O_APPEND, one write),
//       transactional: a row (event_id, worker) in S.side_effects written through the
//                      handler's PostgresTransaction.
//     A delivery refused with a retryable error (AlreadyInProgress: another process runs it)
//     goes to the back of the queue, as a broker would redeliver it.
//     Prints "processed=N duplicate=M redelivered=K".
//   operations --schema S --keys FILE --worker W [--wait-go]
//     Calls a resilient() operation for every key in FILE on a PostgresIdempotencyStore in
//     schema S (other processes' keys in progress are waited for, through LISTEN/NOTIFY). The
//     operation inserts (key, worker) into S.executions on a connection of its own and returns
//     "<worker>:<key>". Writes "<key> <value> <status>" per call to FILE.out and prints
//     "executed=N replayed=M joined=J waits=W notified=X".
//   hang --schema S --mode exclusive|transactional --consumer C --event ID [--effects FILE]
//        [--lease-ms N]
//     Delivers one event whose handler writes its side effect, prints "ready" and blocks until
//     killed (SIGKILL by the test).
//   claim-hang --schema S --consumer C --event ID --lease-ms N
//     Claims the event on the recorder, prints "token <T>" and blocks until killed.
//   operation-hang --schema S --key K --lease-ms N
//     Runs a resilient() operation with key K whose body prints "ready" and blocks until killed
//     (its lease is renewed by the coordinator meanwhile).
//   wait --schema S --key K
//     Waits for K on a store (LISTEN started first), printing "blocked" once the wait blocks,
//     then "<state> notified=<wakeups by notification> rechecks=<safety-net re-reads>".
//
// Any command takes --clock-ahead-ms N: the worker's wall clock runs N ms ahead of the system's
// (a process that sees a lease as passed without anyone waiting for it).
//
// Exit codes: 0 done, 2 bad usage, 3 an unexpected error (printed on stderr), 4 gave up.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "../postgres_test_support.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "idem/resilient.hpp"
#include "worker/worker_support.hpp"

namespace idem::test::pg_worker {

using namespace idem::test::worker;

inline postgres::PostgresOptions options(const Args& args) {
  postgres::PostgresOptions options;
  options.url = test::pg::server_url().value_or("");
  options.schema = required(args, "--schema");
  options.create_schema = false;  // the test created it, as a deployment would
  const long long ahead = std::stoll(optional(args, "--clock-ahead-ms", "0"));
  if (ahead != 0) options.clock = std::make_shared<AheadClock>(std::chrono::milliseconds(ahead));
  return options;
}

struct Consumer {
  std::shared_ptr<postgres::PostgresIdempotencyRecorder> recorder;
  ConsumerSettings settings;
  std::string insert;  // transactional mode's side effect: a row of S.side_effects
};

inline Consumer make_consumer(const Args& args) {
  const postgres::PostgresOptions opts = options(args);
  Consumer c{std::make_shared<postgres::PostgresIdempotencyRecorder>(opts), consumer_settings(args),
             "INSERT INTO \"" + opts.schema + "\".side_effects (event_id, worker) VALUES ($1, $2)"};
  c.settings.options.clock = opts.clock;
  return c;
}

inline void side_effect(const Consumer& c, BusProxy& bus, const Event& event) {
  worker::side_effect<postgres::PostgresTransaction>(c.settings, bus, event, c.insert);
}

inline int consume(const Args& args) {
  Consumer c = make_consumer(args);
  std::deque<std::string> queue = read_lines(required(args, "--events"));
  auto handler = make_idempotent_handler<std::string>(
      c.settings.consumer, c.recorder,
      [&c](const std::string&, BusProxy& bus, const Event& event) { side_effect(c, bus, event); },
      c.settings.options);
  CollectingBusProxy bus(c.settings.consumer);
  if (!wait_go(args)) return 4;
  return consume_all(std::move(queue), *handler, bus);
}

inline int operations(const Args& args) {
  const postgres::PostgresOptions opts = options(args);
  auto store = std::make_shared<postgres::PostgresIdempotencyStore>(opts);
  const std::string worker = required(args, "--worker");
  const std::string keys_file = required(args, "--keys");
  const std::deque<std::string> keys = read_lines(keys_file);
  // The operation's own side effect, on a connection that is not idem's.
  auto side = test::pg::connect(opts.url);
  const std::string insert =
      "INSERT INTO \"" + opts.schema + "\".executions (key, worker) VALUES ($1, $2)";
  auto run = resilient(
      [&](const std::string& key) {
        const char* values[2] = {key.c_str(), worker.c_str()};
        PGresult* result =
            PQexecParams(side.get(), insert.c_str(), 2, nullptr, values, nullptr, nullptr, 0);
        const bool ok = PQresultStatus(result) == PGRES_COMMAND_OK;
        PQclear(result);
        if (!ok) throw std::runtime_error("recording the execution failed");
        return worker + ":" + key;
      },
      {.name = "multiprocess_operation",
       .idempotency_key = [](const std::string& key) { return key; },
       .idempotency_ttl = std::chrono::hours(1),
       .idempotency_store = store,
       .idempotency_in_progress = InProgressPolicy::wait,
       .idempotency_max_wait = std::chrono::milliseconds(60'000)});
  store->listen();
  if (!wait_go(args)) return 4;
  std::ofstream out(keys_file + ".out");
  std::map<std::string, long> statuses;
  for (const std::string& key : keys) {
    const auto result = run(key);
    const std::string status = result.report.metadata.at("idempotency_status");
    ++statuses[status];
    out << key << " " << result.value << " " << status << "\n";
  }
  out.close();
  const auto stats = store->stats();
  say("executed=" + std::to_string(statuses["executed"]) +
      " replayed=" + std::to_string(statuses["replayed"]) +
      " joined=" + std::to_string(statuses["joined"]) + " waits=" + std::to_string(stats.waits) +
      " notified=" + std::to_string(stats.wakeups_by_notification));
  return 0;
}

inline int hang(const Args& args) {
  Consumer c = make_consumer(args);
  auto handler = make_idempotent_handler<std::string>(
      c.settings.consumer, c.recorder,
      [&c](const std::string&, BusProxy& bus, const Event& event) {
        side_effect(c, bus, event);
        say("ready");
        block_until_killed();  // claim held, or transaction open
      },
      c.settings.options);
  CollectingBusProxy bus(c.settings.consumer);
  (void)(*handler)(event_with_id(required(args, "--event")), bus);
  return 3;
}

inline int claim_hang(const Args& args) {
  postgres::PostgresIdempotencyRecorder recorder(options(args));
  const Claim claim =
      recorder.claim(required(args, "--consumer"), required(args, "--event"),
                     std::chrono::milliseconds(std::stoll(required(args, "--lease-ms"))));
  if (claim.status != Claim::Status::acquired) throw std::runtime_error("claim not acquired");
  say("token " + std::to_string(claim.token));
  block_until_killed();
}

inline int operation_hang(const Args& args) {
  auto store = std::make_shared<postgres::PostgresIdempotencyStore>(options(args));
  auto run = resilient(
      [](const std::string&) -> std::string {
        say("ready");
        block_until_killed();
      },
      {.name = "operation_hang",
       .idempotency_key = [](const std::string& key) { return key; },
       .idempotency_store = store,
       .idempotency_lease = std::chrono::milliseconds(std::stoll(required(args, "--lease-ms")))});
  (void)run(required(args, "--key"));
  return 3;
}

inline int wait(const Args& args) {
  postgres::PostgresOptions opts = options(args);
  opts.wait_recheck_interval = std::chrono::hours(1);  // woken by NOTIFY or not at all
  postgres::PostgresIdempotencyStore store(opts);
  if (!store.listen()) throw std::runtime_error("the listener did not start");
  std::thread reporter([&store] {
    while (store.stats().blocked_waiters == 0)
      std::this_thread::yield();
    say("blocked");
  });
  const auto record = store.wait(required(args, "--key"),
                                 std::chrono::steady_clock::now() + std::chrono::hours(1), {});
  reporter.join();
  const auto stats = store.stats();
  say(std::string(record ? to_string(record->state) : "absent") +
      " notified=" + std::to_string(stats.wakeups_by_notification) +
      " rechecks=" + std::to_string(stats.rechecks));
  return 0;
}

inline int main(int argc, char** argv) {
  return worker_main("postgres worker", argc, argv, 2,
                     {{"consume", consume},
                      {"operations", operations},
                      {"hang", hang},
                      {"claim-hang", claim_hang},
                      {"operation-hang", operation_hang},
                      {"wait", wait}});
}

// What a deployment creates before the workers start (they open existing tables): idem's
// recorder and store tables in `schema`, and the consumers' side_effects table.
inline void create_tables(const test::pg::TempSchema& schema) {
  postgres::PostgresIdempotencyRecorder recorder(schema.options());
  postgres::PostgresIdempotencyStore store(schema.options());
  test::pg::query("CREATE TABLE " + schema.table("side_effects") +
                  " (event_id text NOT NULL, worker text NOT NULL)");
}

// The path of this test binary, which is also the worker.
inline std::string self_path() {
  char buffer[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof buffer - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(buffer, static_cast<std::size_t>(n));
}

}  // namespace idem::test::pg_worker

// main() of a process test binary: a worker when started with --postgres-worker, else gtest.
#define IDEM_POSTGRES_WORKER_MAIN()                                \
  int main(int argc, char** argv) {                                \
    if (argc > 1 && std::string(argv[1]) == "--postgres-worker") { \
      return ::idem::test::pg_worker::main(argc, argv);            \
    }                                                              \
    ::testing::InitGoogleTest(&argc, argv);                        \
    return RUN_ALL_TESTS();                                        \
  }
