// idem_test_redis_worker: a consumer / caller process for the Redis multi-process and crash
// tests. Tests start it with fork+exec (ChildProcess) and talk to it through pipes.
//
//   consume  --url URL --prefix P --consumer NAME --events FILE --effects FILE
//            [--lease-ms N] [--clock-offset-ms N] [--wait-go]
//     Delivers every event id of FILE (one per line) to an exclusive-mode IdempotentHandler on a
//     RedisIdempotencyRecorder. The side effect of an event is the line "<id>\n" appended to the
//     effects file (O_APPEND, one write). A delivery refused with a retryable error that is not in
//     doubt (AlreadyInProgress: another process runs it) goes to the back of the queue, as a
//     broker would redeliver it. Prints "processed=N duplicate=M redelivered=K".
//
//   hang     --url URL --prefix P --consumer NAME --event ID --effects FILE [--lease-ms N]
//     Delivers one event whose handler writes its side effect, prints "ready" and blocks inside
//     the handler (claim held) until the test SIGKILLs it.
//
//   run-keys --url URL --prefix P --keys FILE --effects FILE [--lease-ms N]
//            [--clock-offset-ms N] [--wait-go]
//     Calls an idem::resilient() operation once per line of FILE (a key; duplicates allowed)
//     with idempotency on a RedisIdempotencyStore. The operation appends "<key>\n" to the effects
//     file and returns "value:<key>"; every call must get that value back, executed or replayed.
//     A call refused with a retryable error (another process still runs the key past max_wait)
//     is queued again. Prints "executed=N replayed=M joined=J redelivered=K took_over=T".
//
//   hang-key --url URL --prefix P --key K --effects FILE [--lease-ms N]
//     Runs one such operation whose body writes its side effect, prints "ready" and blocks (the
//     key claimed in the store) until the test SIGKILLs it.
//
// --clock-offset-ms moves this process's wall clock ahead, as if that much time had passed: a
// test uses it to let a fresh process find a dead owner's lease over without sleeping.
//
// Exit codes: 0 done, 2 bad usage, 3 an unexpected error (printed on stderr), 4 gave up.
#include <chrono>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/events.hpp"
#include "idem/handler.hpp"
#include "idem/redis/redis_options.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/resilient.hpp"
#include "worker_support.hpp"

namespace {

using namespace idem::test::worker;

idem::redis::RedisOptions redis_options(const Args& args) {
  auto options = idem::redis::RedisOptions::from_url(required(args, "--url"));
  options.key_prefix = required(args, "--prefix");
  options.clock = std::make_shared<AheadClock>(
      std::chrono::milliseconds(std::stoll(optional(args, "--clock-offset-ms", "0"))));
  return options;
}

std::chrono::milliseconds lease_of(const Args& args) {
  return std::chrono::milliseconds(std::stoll(optional(args, "--lease-ms", "30000")));
}

// ---- recorder -------------------------------------------------------------------------------

// The exclusive-mode handler of both commands: its side effect is the event id appended to the
// effects file; with `hang` it then says "ready" and blocks there, its claim held, until killed.
auto exclusive_handler(const Args& args, const EffectsFile& effects, bool hang) {
  auto recorder = std::make_shared<idem::redis::RedisIdempotencyRecorder>(redis_options(args));
  idem::HandlerOptions options;
  options.mode = idem::HandlerMode::exclusive;
  options.lease = lease_of(args);
  return idem::make_idempotent_handler<std::string>(
      required(args, "--consumer"), recorder,
      [&effects, hang](const std::string&, idem::BusProxy&, const idem::Event& event) {
        effects.append(event.id);
        if (hang) {
          say("ready");
          block_until_killed();
        }
      },
      options);
}

int consume(const Args& args) {
  const EffectsFile effects(required(args, "--effects"));
  auto handler = exclusive_handler(args, effects, /*hang=*/false);
  idem::CollectingBusProxy bus(required(args, "--consumer"));
  std::deque<std::string> queue = read_lines(required(args, "--events"));
  if (!wait_go(args)) return 4;
  return consume_all(std::move(queue), *handler, bus);
}

int hang(const Args& args) {
  const EffectsFile effects(required(args, "--effects"));
  auto handler = exclusive_handler(args, effects, /*hang=*/true);
  idem::CollectingBusProxy bus(required(args, "--consumer"));
  (void)(*handler)(event_with_id(required(args, "--event")), bus);
  return 3;
}

// ---- store ----------------------------------------------------------------------------------

using Operation = std::string(const std::string&);

idem::Resilient<Operation> keyed_operation(const Args& args,
                                           std::shared_ptr<idem::IdempotencyStore> store,
                                           std::function<std::string(const std::string&)> body,
                                           std::shared_ptr<idem::EventSink> events = nullptr) {
  idem::ResilientOptions<Operation> options;
  if (events) options.events = {std::move(events)};
  options.name = "redis-worker";
  options.idempotency_key = [](const std::string& key) { return key; };
  options.idempotency_store = std::move(store);
  options.idempotency_ttl = std::chrono::hours(1);
  options.idempotency_lease = lease_of(args);
  options.idempotency_max_wait = std::chrono::seconds(5);
  return idem::resilient<Operation>(std::move(body), std::move(options));
}

int run_keys(const Args& args) {
  auto store = std::make_shared<idem::redis::RedisIdempotencyStore>(redis_options(args));
  EffectsFile effects(required(args, "--effects"));
  auto events = std::make_shared<idem::CountingEventSink>();
  auto operation = keyed_operation(
      args, store,
      [&effects](const std::string& key) {
        effects.append(key);
        return "value:" + key;
      },
      events);
  std::deque<std::string> queue = read_lines(required(args, "--keys"));
  if (!wait_go(args)) return 4;
  std::map<std::string, long> statuses;
  const long redelivered = deliver_all(std::move(queue), [&](const std::string& key) {
    const auto result = operation(key);
    if (result.value != "value:" + key) {
      throw std::runtime_error("key " + key + " got the value '" + result.value + "'");
    }
    ++statuses[result.report.metadata.at("idempotency_status")];
  });
  if (redelivered < 0) return 4;
  std::cout << "executed=" << statuses["executed"] << " replayed=" << statuses["replayed"]
            << " joined=" << statuses["joined"] << " redelivered=" << redelivered
            << " took_over=" << events->count(idem::EventType::idempotency_takeover) << std::endl;
  return 0;
}

int hang_key(const Args& args) {
  auto store = std::make_shared<idem::redis::RedisIdempotencyStore>(redis_options(args));
  EffectsFile effects(required(args, "--effects"));
  auto operation = keyed_operation(args, store, [&effects](const std::string& key) -> std::string {
    effects.append(key);
    say("ready");
    block_until_killed();
    return {};
  });
  (void)operation(required(args, "--key"));
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  return worker_main(
      "idem_test_redis_worker", argc, argv, 1,
      {{"consume", consume}, {"hang", hang}, {"run-keys", run_keys}, {"hang-key", hang_key}});
}
