// idem_test_crash_worker: the process the crash matrix (tests/process/crash_matrix_test.cpp)
// kills. It opens its recorder or store by URL (any durable backend), wraps it in
// idem::testing::CrashingRecorder / CrashingStore with the plan of its environment
// (IDEM_CRASH_POINT, IDEM_CRASH_ACTION — CrashPlan::from_env()), and does one piece of work:
//
//   consume --url URL --mode check_then_mark|exclusive|transactional --consumer C --event ID
//           --effects FILE [--table T] [--lease-ms N] [--clock-ahead-ms N]
//     Delivers event ID once to an IdempotentHandler. Its side effect is the line "<ID>\n"
//     appended to FILE (O_APPEND, then fsync: it survives the SIGKILL that follows), and in
//     transactional mode also a row (event_id) inserted into table T through the handler's
//     transaction (SQLite: SqliteTransaction, PostgreSQL: PostgresTransaction). The handler then
//     passes crash_point(after_side_effect); after it returned, crash_point(after_commit_before_
//     ack) — the moment a consumer would acknowledge the delivery. Prints "processed" or
//     "duplicate" — or "in_progress" when a live claim of another process refused it.
//
//   operate --url URL --key K --effects FILE [--lease-ms N] [--clock-ahead-ms N]
//     Calls an idem::resilient() operation with idempotency key K on the store. Its body appends
//     "<K>\n" to FILE (fsync) and passes crash_point(after_side_effect); after the call returned,
//     crash_point(after_commit_before_ack) (the caller about to use the result). Prints the
//     idempotency status ("executed" / "replayed" / "joined") and the value, or "in_progress" when
//     another process's live claim holds the key (it does not wait).
//
// --clock-ahead-ms N runs this process's wall clock N ms ahead of the system's: a fresh process
// started that far ahead finds a killed owner's lease over without anyone waiting for it.
//
// Exit codes: 0 done, 2 bad usage, 3 an unexpected error (printed on stderr). A fired kill plan
// ends the process with SIGKILL.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/open.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/crash_points.hpp"
#if __has_include("idem/sqlite/sqlite_transaction.hpp")
#include "idem/sqlite/sqlite_transaction.hpp"
#define IDEM_CRASH_WORKER_SQLITE 1
#endif
#if __has_include("idem/postgres/postgres_transaction.hpp")
#include "idem/postgres/postgres_transaction.hpp"
#include "worker_support.hpp"
#define IDEM_CRASH_WORKER_POSTGRES 1
#endif

namespace {

using namespace idem::test::worker;

using idem::testing::CrashPlan;
using idem::testing::CrashPoint;

idem::OpenOptions open_options(const Args& args) {
  idem::OpenOptions options;
  options.clock = std::make_shared<AheadClock>(
      std::chrono::milliseconds(std::stoll(optional(args, "--clock-ahead-ms", "0"))));
  return options;
}

std::chrono::milliseconds lease_of(const Args& args) {
  return std::chrono::milliseconds(std::stoll(optional(args, "--lease-ms", "60000")));
}

idem::HandlerMode mode_of(const std::string& text) {
  if (text == "check_then_mark") return idem::HandlerMode::check_then_mark;
  if (text == "exclusive") return idem::HandlerMode::exclusive;
  if (text == "transactional") return idem::HandlerMode::transactional;
  throw Usage("unknown mode " + text);
}

// The transactional side effect: a row written through the handler's own transaction.
void insert_row(idem::Transaction* tx, const std::string& table, const std::string& event_id) {
  if (tx == nullptr) throw std::runtime_error("transactional mode without a transaction");
#ifdef IDEM_CRASH_WORKER_SQLITE
  if (auto* sqlite = dynamic_cast<idem::sqlite::SqliteTransaction*>(tx)) {
    sqlite->exec("INSERT INTO " + table + "(event_id) VALUES (?)", {event_id});
    return;
  }
#endif
#ifdef IDEM_CRASH_WORKER_POSTGRES
  if (auto* postgres = dynamic_cast<idem::postgres::PostgresTransaction*>(tx)) {
    postgres->exec("INSERT INTO " + table + "(event_id) VALUES ($1)", {event_id});
    return;
  }
#endif
  throw std::runtime_error("a transaction of a backend this worker does not know");
}

int consume(const Args& args, const CrashPlan& plan) {
  const idem::HandlerMode mode = mode_of(required(args, "--mode"));
  const std::string consumer = required(args, "--consumer");
  const std::string table = optional(args, "--table", "");
  if (mode == idem::HandlerMode::transactional && table.empty()) {
    throw Usage("transactional mode needs --table");
  }
  EffectsFile effects(required(args, "--effects"), /*fsync=*/true);
  auto recorder = std::make_shared<idem::testing::CrashingRecorder>(
      idem::open_recorder(required(args, "--url"), open_options(args)), plan);
  idem::HandlerOptions options;
  options.mode = mode;
  options.lease = lease_of(args);
  auto handler = idem::make_idempotent_handler<std::string>(
      consumer, recorder,
      [&](const std::string&, idem::BusProxy& bus, const idem::Event& event) {
        if (mode == idem::HandlerMode::transactional) {
          insert_row(bus.transaction(), table, event.id);
        }
        effects.append(event.id);
        idem::testing::crash_point(CrashPoint::after_side_effect, plan);
      },
      options);
  idem::CollectingBusProxy bus(consumer);
  idem::Event event;
  event.id = required(args, "--event");
  event.type = "crash.matrix";
  idem::HandleResult result;
  try {
    result = (*handler)(event, bus);
  } catch (const idem::AlreadyInProgress&) {
    std::cout << "in_progress" << std::endl;  // a live claim holds the event: not acknowledged
    return 0;
  }
  idem::testing::crash_point(CrashPoint::after_commit_before_ack, plan);
  std::cout << idem::to_string(result) << std::endl;
  return 0;
}

using Operation = std::string(const std::string&);

int operate(const Args& args, const CrashPlan& plan) {
  EffectsFile effects(required(args, "--effects"), /*fsync=*/true);
  const auto clock = open_options(args).clock;
  auto store = std::make_shared<idem::testing::CrashingStore>(
      idem::open_store(required(args, "--url"), idem::OpenOptions{clock}), plan);
  idem::ResilientOptions<Operation> options;
  options.name = "crash-worker";
  options.idempotency_key = [](const std::string& key) { return key; };
  options.idempotency_store = store;
  options.idempotency_ttl = std::chrono::hours(1);
  options.idempotency_lease = lease_of(args);
  // A fresh process that still finds the key in progress is a test failure, not a wait.
  options.idempotency_in_progress = idem::InProgressPolicy::reject;
  options.clock = clock;
  auto operation = idem::resilient<Operation>(
      [&](const std::string& key) {
        effects.append(key);
        idem::testing::crash_point(CrashPoint::after_side_effect, plan);
        return "value:" + key;
      },
      std::move(options));
  std::optional<idem::OperationResult<std::string>> result;
  try {
    result = operation(required(args, "--key"));
  } catch (const idem::AlreadyInProgress&) {
    std::cout << "in_progress" << std::endl;  // a live claim holds the key
    return 0;
  }
  idem::testing::crash_point(CrashPoint::after_commit_before_ack, plan);
  std::cout << result->report.metadata.at("idempotency_status") << " " << result->value
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return worker_main("idem_test_crash_worker", argc, argv, 1,
                     [](const std::string& command, const Args& args) -> int {
                       const CrashPlan plan = CrashPlan::from_env();
                       if (command == "consume") return consume(args, plan);
                       if (command == "operate") return operate(args, plan);
                       throw Usage("unknown command " + command);
                     });
}
