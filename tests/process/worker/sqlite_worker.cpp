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
#include <unistd.h>

#include <chrono>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>

#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "worker_support.hpp"

namespace {

using namespace idem::test::worker;
namespace worker = idem::test::worker;

struct Setup {
  std::shared_ptr<idem::sqlite::SqliteIdempotencyRecorder> recorder;
  ConsumerSettings settings;
};

Setup make_setup(const Args& args) {
  return {std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(required(args, "--db")),
          consumer_settings(args)};
}

// The side effect of one event, written the way the mode promises to protect.
void side_effect(const Setup& setup, idem::BusProxy& bus, const idem::Event& event) {
  worker::side_effect<idem::sqlite::SqliteTransaction>(
      setup.settings, bus, event, "INSERT INTO side_effects(event_id, worker) VALUES (?, ?)");
}

int consume(const Args& args) {
  Setup setup = make_setup(args);
  std::deque<std::string> queue = read_lines(required(args, "--events"));
  auto handler = idem::make_idempotent_handler<std::string>(
      setup.settings.consumer, setup.recorder,
      [&setup](const std::string&, idem::BusProxy& bus, const idem::Event& event) {
        side_effect(setup, bus, event);
      },
      setup.settings.options);
  idem::CollectingBusProxy bus(setup.settings.consumer);
  if (!wait_go(args)) return 4;
  // AlreadyInProgress or a busy database: redelivered later, as a real broker would.
  return consume_all(std::move(queue), *handler, bus);
}

int hang(const Args& args) {
  Setup setup = make_setup(args);
  auto handler = idem::make_idempotent_handler<std::string>(
      setup.settings.consumer, setup.recorder,
      [&setup](const std::string&, idem::BusProxy& bus, const idem::Event& event) {
        side_effect(setup, bus, event);
        say("ready");
        block_until_killed();  // claim held, or transaction open
      },
      setup.settings.options);
  idem::CollectingBusProxy bus(setup.settings.consumer);
  (void)(*handler)(event_with_id(required(args, "--event")), bus);
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  return worker_main("idem_test_worker", argc, argv, 1, {{"consume", consume}, {"hang", hang}});
}
