// The worker processes of the PostgreSQL process tests. A test binary that includes this header
// defines main() with IDEM_POSTGRES_WORKER_MAIN(): run as `<binary> --postgres-worker COMMAND
// ...` it is a worker, otherwise it runs its tests. The tests start workers with fork+exec of
// /proc/self/exe (ThreadSanitizer-safe, see worker/child_process.hpp), so the PostgreSQL section
// needs no change to the shared idem_test_worker.
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

inline void wait_go(const Args& args) {
  if (args.count("--wait-go") == 0) return;
  char go = 0;
  if (::read(STDIN_FILENO, &go, 1) != 1) throw std::runtime_error("no go signal");
}

[[noreturn]] inline void block_until_killed() {
  char byte = 0;
  while (::read(STDIN_FILENO, &byte, 1) > 0) {
  }
  throw std::runtime_error("the test closed stdin instead of killing the worker");
}

struct Consumer {
  std::shared_ptr<postgres::PostgresIdempotencyRecorder> recorder;
  HandlerOptions handler_options;
  std::string consumer;
  std::string worker;
  std::string side_effects;  // S.side_effects
  std::unique_ptr<EffectsFile> effects;
};

inline Consumer make_consumer(const Args& args) {
  Consumer c;
  const postgres::PostgresOptions opts = options(args);
  c.recorder = std::make_shared<postgres::PostgresIdempotencyRecorder>(opts);
  c.handler_options.clock = opts.clock;
  const std::string mode = required(args, "--mode");
  if (mode == "exclusive") {
    c.handler_options.mode = HandlerMode::exclusive;
    c.effects = std::make_unique<EffectsFile>(required(args, "--effects"));
  } else if (mode == "transactional") {
    c.handler_options.mode = HandlerMode::transactional;
  } else {
    throw Usage("--mode must be exclusive or transactional, not " + mode);
  }
  c.handler_options.lease =
      std::chrono::milliseconds(std::stoll(optional(args, "--lease-ms", "30000")));
  c.consumer = required(args, "--consumer");
  c.worker = optional(args, "--worker", std::to_string(::getpid()));
  c.side_effects = "\"" + opts.schema + "\".side_effects";
  return c;
}

inline void side_effect(const Consumer& c, BusProxy& bus, const Event& event) {
  if (c.effects) {
    c.effects->append(event.id);
    return;
  }
  auto* tx = dynamic_cast<postgres::PostgresTransaction*>(bus.transaction());
  if (tx == nullptr) throw std::runtime_error("transactional handler got no PostgresTransaction");
  tx->exec("INSERT INTO " + c.side_effects + " (event_id, worker) VALUES ($1, $2)",
           {event.id, c.worker});
}

inline int consume(const Args& args) {
  Consumer c = make_consumer(args);
  std::deque<std::string> queue = read_lines(required(args, "--events"));
  auto handler = make_idempotent_handler<std::string>(
      c.consumer, c.recorder,
      [&c](const std::string&, BusProxy& bus, const Event& event) { side_effect(c, bus, event); },
      c.handler_options);
  CollectingBusProxy bus(c.consumer);
  wait_go(args);
  long processed = 0;
  long duplicate = 0;
  long redelivered = 0;
  const long max_redeliveries = 1000L * static_cast<long>(queue.size() + 1);
  while (!queue.empty()) {
    const std::string id = queue.front();
    queue.pop_front();
    try {
      if ((*handler)(event_with_id(id), bus) == HandleResult::processed) {
        ++processed;
      } else {
        ++duplicate;
      }
    } catch (const Error& e) {
      if (!e.retryable() || e.in_doubt()) throw;
      // Not acknowledged: the "broker" delivers it again later.
      queue.push_back(id);
      if (++redelivered > max_redeliveries) return 4;
      std::this_thread::yield();
    }
  }
  say("processed=" + std::to_string(processed) + " duplicate=" + std::to_string(duplicate) +
      " redelivered=" + std::to_string(redelivered));
  return 0;
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
  wait_go(args);
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
      c.consumer, c.recorder,
      [&c](const std::string&, BusProxy& bus, const Event& event) {
        side_effect(c, bus, event);
        say("ready");
        block_until_killed();  // claim held, or transaction open
      },
      c.handler_options);
  CollectingBusProxy bus(c.consumer);
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
                     [](const std::string& command, const Args& args) -> int {
                       if (command == "consume") return consume(args);
                       if (command == "operations") return operations(args);
                       if (command == "hang") return hang(args);
                       if (command == "claim-hang") return claim_hang(args);
                       if (command == "operation-hang") return operation_hang(args);
                       if (command == "wait") return wait(args);
                       throw Usage("unknown command " + command);
                     });
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
