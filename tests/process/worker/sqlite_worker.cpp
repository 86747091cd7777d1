// idem_test_worker: a consumer process for the multi-process and crash tests of the SQLite
// recorder. Tests start it with fork+exec (so it works under ThreadSanitizer, which dislikes
// fork() in a process that has threads) and talk to it through pipes.
//
//   idem_test_worker consume --db PATH --mode exclusive|transactional --consumer NAME
//                            --events FILE [--effects FILE] [--worker NAME] [--lease-ms N]
//                            [--wait-go]
//     Delivers every event id listed in FILE (one per line) to an IdempotentHandler on a
//     SqliteIdempotencyRecorder at PATH. The side effect of an event is
//       exclusive:     the line "<id>\n" appended to the --effects file (O_APPEND, one write),
//       transactional: a row (event_id, worker) in the table side_effects, written through the
//                      handler's SqliteTransaction.
//     A delivery refused with AlreadyInProgress (another process runs that event) or a
//     retryable store error goes to the back of the queue: the redelivery a broker would make.
//     --wait-go: wait for one byte on stdin first, so a test can start several workers at once.
//     Prints "processed=N duplicate=M redelivered=K" and exits 0.
//
//   idem_test_worker hang --db PATH --mode exclusive|transactional --consumer NAME --event ID
//                         [--effects FILE] [--lease-ms N]
//     Delivers one event whose handler writes its side effect as above, then prints "ready\n"
//     and blocks inside the handler until stdin closes — the test SIGKILLs it there.
//
// Exit codes: 0 done, 2 bad usage, 3 an unexpected error (printed on stderr), 4 gave up.
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

#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "worker_support.hpp"

namespace {

using namespace idem::test::worker;

struct Setup {
  std::shared_ptr<idem::sqlite::SqliteIdempotencyRecorder> recorder;
  idem::HandlerOptions options;
  std::string consumer;
  std::string worker;
  std::unique_ptr<EffectsFile> effects;
};

Setup make_setup(const Args& args) {
  Setup setup;
  setup.recorder =
      std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(required(args, "--db"));
  const std::string mode = required(args, "--mode");
  if (mode == "exclusive") {
    setup.options.mode = idem::HandlerMode::exclusive;
    setup.effects = std::make_unique<EffectsFile>(required(args, "--effects"));
  } else if (mode == "transactional") {
    setup.options.mode = idem::HandlerMode::transactional;
  } else {
    throw Usage("--mode must be exclusive or transactional, not " + mode);
  }
  setup.options.lease =
      std::chrono::milliseconds(std::stoll(optional(args, "--lease-ms", "30000")));
  setup.consumer = required(args, "--consumer");
  setup.worker = optional(args, "--worker", std::to_string(::getpid()));
  return setup;
}

// The side effect of one event, written the way the mode promises to protect.
void side_effect(const Setup& setup, idem::BusProxy& bus, const idem::Event& event) {
  if (setup.effects) {
    setup.effects->append(event.id);
    return;
  }
  auto* tx = dynamic_cast<idem::sqlite::SqliteTransaction*>(bus.transaction());
  if (tx == nullptr) throw std::runtime_error("transactional handler got no SqliteTransaction");
  tx->exec("INSERT INTO side_effects(event_id, worker) VALUES (?, ?)", {event.id, setup.worker});
}

int consume(const Args& args) {
  Setup setup = make_setup(args);
  std::deque<std::string> queue;
  {
    std::ifstream in(required(args, "--events"));
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) queue.push_back(line);
    }
  }
  auto handler = idem::make_idempotent_handler<std::string>(
      setup.consumer, setup.recorder,
      [&setup](const std::string&, idem::BusProxy& bus, const idem::Event& event) {
        side_effect(setup, bus, event);
      },
      setup.options);
  idem::CollectingBusProxy bus(setup.consumer);

  if (args.count("--wait-go") != 0) {
    char go = 0;
    if (::read(STDIN_FILENO, &go, 1) != 1) return 4;
  }
  long processed = 0;
  long duplicate = 0;
  long redelivered = 0;
  const long max_redeliveries = 1000L * static_cast<long>(queue.size() + 1);
  while (!queue.empty()) {
    const std::string id = queue.front();
    queue.pop_front();
    try {
      if ((*handler)(event_with_id(id), bus) == idem::HandleResult::processed) {
        ++processed;
      } else {
        ++duplicate;
      }
    } catch (const idem::Error& e) {
      if (!e.retryable() || e.in_doubt()) throw;
      // AlreadyInProgress or a busy database: not acknowledged, so the "broker" delivers it
      // again later, after a short redelivery delay (as a real broker would).
      queue.push_back(id);
      if (++redelivered > max_redeliveries) return 4;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  std::cout << "processed=" << processed << " duplicate=" << duplicate
            << " redelivered=" << redelivered << std::endl;
  return 0;
}

int hang(const Args& args) {
  Setup setup = make_setup(args);
  auto handler = idem::make_idempotent_handler<std::string>(
      setup.consumer, setup.recorder,
      [&setup](const std::string&, idem::BusProxy& bus, const idem::Event& event) {
        side_effect(setup, bus, event);
        const char ready[] = "ready\n";
        if (::write(STDOUT_FILENO, ready, sizeof ready - 1) < 0) std::_Exit(3);
        // Block inside the handler (claim held, or transaction open) until the test kills us;
        // if the test goes away instead, stdin closes and we fail the delivery.
        char byte = 0;
        while (::read(STDIN_FILENO, &byte, 1) > 0) {
        }
        throw std::runtime_error("the test closed stdin instead of killing the worker");
      },
      setup.options);
  idem::CollectingBusProxy bus(setup.consumer);
  (void)(*handler)(event_with_id(required(args, "--event")), bus);
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  return worker_main("idem_test_worker", argc, argv, 1,
                     [](const std::string& command, const Args& args) -> int {
                       if (command == "consume") return consume(args);
                       if (command == "hang") return hang(args);
                       throw Usage("unknown command " + command);
                     });
}
