// idem_test_sqlite_store_worker: a process calling idempotent operations through resilient() on a
// SqliteIdempotencyStore, for the multi-process and lease tests of the SQLite store. Tests start
// it with fork+exec (ChildProcess) and talk to it through pipes.
//
//   run --db PATH --keys FILE --effects FILE [--policy wait|reject] [--lease-ms N]
//       [--max-wait-ms N] [--work-us N] [--wait-go]
//     Calls the operation once for every key listed in FILE (one per line). The operation's side
//     effect is the line "<key> <pid>" appended to the effects file (O_APPEND, one write); it
//     then computes for --work-us microseconds (default 0: a wider window for duplicates from
//     other processes to find the key in progress) and returns "value:<key>". A call refused with
//     AlreadyInProgress (reject policy, or max_wait passed) goes to the back of the queue, as a
//     broker would redeliver it. --wait-go: wait for one byte on stdin first, so a test can start
//     several workers at once. Prints "executed=N replayed=M joined=J waited=A redelivered=R
//     takeovers=T wrong=W" and exits 0 (waited: calls that found the key in progress in another
//     process and waited for it; wrong: replays whose value differs from the executed one).
//
//   call --db PATH --key K --effects FILE [--policy wait|reject] [--lease-ms N] [--max-wait-ms N]
//        [--hold]
//     One call; the operation returns "value:<key>:<pid>". Prints "waiting" when the call starts
//     waiting for another process's owner (the store's wait() is entered), then one outcome line:
//       "executed <value> took_over=<0|1>" | "replayed <value>" | "rejected <message>".
//     --hold: after writing its side effect the operation prints "ready" and blocks reading
//     stdin: the line "finish" lets it return; EOF (the test went away) makes it throw.
//
//   claim --db PATH --key K --lease-ms N
//     A bare store-API owner (no coordinator, no heartbeat): claims K and prints "token=<T>"
//     (or "status=<status>"), then obeys stdin lines "complete", "release", "renew" (printing
//     "complete=<true|false>", ...) until "exit" or EOF — a stalled owner coming back late.
//
// Exit codes: 0 done, 2 bad usage, 3 an unexpected error (printed on stderr), 4 gave up.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "idem/error.hpp"
#include "idem/events.hpp"
#include "idem/resilient.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "idem/wrapper.hpp"
#include "worker_support.hpp"

namespace {

using namespace idem::test::worker;

// Forwards to the SQLite store and counts the calls that waited for another process's owner;
// with `announce`, says "waiting" the first time, so a test knows this process waits.
class WaitCountingStore final : public idem::StoreWrapper {
 public:
  WaitCountingStore(std::shared_ptr<idem::IdempotencyStore> inner, bool announce)
      : StoreWrapper(std::move(inner)), announce_(announce) {}

  long waits() const { return waits_.load(); }

 private:
  std::optional<idem::IdempotencyRecord> do_wait(std::string_view key, idem::SteadyTime deadline,
                                                 std::stop_token stop) override {
    if (waits_.fetch_add(1) == 0 && announce_) say("waiting");
    return StoreWrapper::do_wait(key, deadline, std::move(stop));
  }

  bool announce_;
  std::atomic<long> waits_{0};
};

using Operation = idem::Resilient<std::string(const std::string&)>;

// The operation every command runs, with the idempotency settings from the command line.
Operation make_operation(const Args& args, std::shared_ptr<idem::IdempotencyStore> store,
                         std::function<std::string(const std::string&)> body,
                         std::atomic<int>& takeovers) {
  const std::string policy = optional(args, "--policy", "wait");
  if (policy != "wait" && policy != "reject") throw Usage("--policy must be wait or reject");
  auto sink = std::make_shared<idem::CallbackEventSink>([&takeovers](const auto& event) {
    if (event.type == idem::EventType::idempotency_takeover) ++takeovers;
  });
  return idem::resilient<std::string(const std::string&)>(
      std::move(body),
      {.name = "store_worker",
       .events = {sink},
       .idempotency_key = [](const std::string& key) { return key; },
       .idempotency_store = std::move(store),
       .idempotency_in_progress =
           policy == "wait" ? idem::InProgressPolicy::wait : idem::InProgressPolicy::reject,
       .idempotency_max_wait = millis(args, "--max-wait-ms", 20'000),
       .idempotency_lease = millis(args, "--lease-ms", 30'000)});
}

int run(const Args& args) {
  auto store = std::make_shared<WaitCountingStore>(
      std::make_shared<idem::sqlite::SqliteIdempotencyStore>(required(args, "--db")),
      /*announce=*/false);
  const EffectsFile effects(required(args, "--effects"));
  std::deque<std::string> queue = read_lines(required(args, "--keys"));
  std::atomic<int> takeovers{0};
  const auto work = std::chrono::microseconds(std::stol(optional(args, "--work-us", "0")));
  const Operation op = make_operation(
      args, store,
      [&effects, work](const std::string& key) {
        effects.append(key + " " + std::to_string(::getpid()));  // "<key> <pid>": who ran it
        const auto until = std::chrono::steady_clock::now() + work;
        while (std::chrono::steady_clock::now() < until) {
        }
        return "value:" + key;
      },
      takeovers);
  if (!wait_go(args)) return 4;
  long executed = 0;
  long replayed = 0;
  long joined = 0;
  long wrong = 0;
  const long redelivered = deliver_all(
      std::move(queue),
      [&](const std::string& key) {
        const auto result = op(key);
        const std::string& status = result.report.metadata.at("idempotency_status");
        if (status == "executed") {
          ++executed;
        } else if (status == "replayed") {
          ++replayed;
        } else {
          ++joined;
        }
        if (result.value != "value:" + key) ++wrong;
      },
      // Only a key another process still runs is redelivered (a reject-policy refusal).
      [](const idem::Error& e) {
        return dynamic_cast<const idem::AlreadyInProgress*>(&e) != nullptr;
      });
  if (redelivered < 0) return 4;
  say("executed=" + std::to_string(executed) + " replayed=" + std::to_string(replayed) +
      " joined=" + std::to_string(joined) + " waited=" + std::to_string(store->waits()) +
      " redelivered=" + std::to_string(redelivered) +
      " takeovers=" + std::to_string(takeovers.load()) + " wrong=" + std::to_string(wrong));
  return 0;
}

int call(const Args& args) {
  auto store = std::make_shared<WaitCountingStore>(
      std::make_shared<idem::sqlite::SqliteIdempotencyStore>(required(args, "--db")),
      /*announce=*/true);
  const EffectsFile effects(required(args, "--effects"));
  const bool hold = args.count("--hold") != 0;
  std::atomic<int> takeovers{0};
  const Operation op = make_operation(
      args, store,
      [&effects, hold](const std::string& key) {
        effects.append(key + " " + std::to_string(::getpid()));  // "<key> <pid>": who ran it
        if (hold) {
          say("ready");
          std::string line;
          if (!std::getline(std::cin, line) || line != "finish") {
            throw std::runtime_error("the test closed stdin instead of saying finish");
          }
        }
        return "value:" + key + ":" + std::to_string(::getpid());
      },
      takeovers);
  try {
    const auto result = op(required(args, "--key"));
    const std::string& status = result.report.metadata.at("idempotency_status");
    if (status == "executed") {
      say("executed " + result.value + " took_over=" + std::to_string(takeovers.load()));
    } else {
      say(status + " " + result.value);
    }
  } catch (const idem::AlreadyInProgress& e) {
    say(std::string("rejected ") + e.what());
  }
  return 0;
}

int claim(const Args& args) {
  idem::sqlite::SqliteIdempotencyStore store(required(args, "--db"));
  const std::string key = required(args, "--key");
  const auto lease = millis(args, "--lease-ms", 30'000);
  const auto outcome = store.claim(key, std::nullopt, lease);
  if (outcome.status != idem::ClaimOutcome::Status::acquired) {
    say("status=" + std::string(idem::to_string(outcome.status)));
    return 0;
  }
  say("token=" + std::to_string(outcome.token));
  for (std::string line; std::getline(std::cin, line) && line != "exit";) {
    bool done = false;
    if (line == "complete") {
      idem::StoredValue value;
      value.bytes = "value:late:" + std::to_string(::getpid());
      done =
          store.complete(key, outcome.token, value, idem::ExecutionReport{}, std::chrono::hours(1));
    } else if (line == "release") {
      done = store.release(key, outcome.token);
    } else if (line == "renew") {
      done = store.renew(key, outcome.token, lease);
    } else {
      throw Usage("unknown claim command " + line);
    }
    say(line + "=" + (done ? "true" : "false"));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return worker_main("idem_test_sqlite_store_worker", argc, argv, 1,
                     {{"run", run}, {"call", call}, {"claim", claim}});
}
