// What every worker program of the process tests shares (idem_test_<name>, tests/process/worker/,
// and the PostgreSQL worker inside its test binaries, postgres_worker.hpp): the command line
// ("<command> --name value ... [--flag]"), main()'s exit codes, the effects file that counts side
// effects across processes, a clock running ahead, small I/O helpers, and the delivery loop of a
// worker that plays a broker's consumer (every item in turn, a refused one redelivered later).
//
// Exit codes of worker_main(): what the command returned; 2 for bad usage; 3 for an unexpected
// error (printed on stderr as "<worker>: <message>").
//
// Thread-safety: for a worker's main thread.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>

#include "idem/clock.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"

namespace idem::test::worker {

// A command line the worker cannot follow (exit code 2).
struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using Args = std::map<std::string, std::string>;

// "--name value" pairs from argv[first] on; a name in `flags` takes no value (it reads "1").
inline Args parse_args(int argc, char** argv, int first,
                       std::initializer_list<std::string_view> flags = {"--wait-go", "--hold"}) {
  Args args;
  for (int i = first; i < argc; ++i) {
    const std::string key = argv[i];
    if (key.rfind("--", 0) != 0) throw Usage("unexpected argument " + key);
    if (std::find(flags.begin(), flags.end(), key) != flags.end()) {
      args[key] = "1";
    } else if (i + 1 < argc) {
      args[key] = argv[++i];
    } else {
      throw Usage("missing value for " + key);
    }
  }
  return args;
}

inline std::string required(const Args& args, const std::string& key) {
  const auto it = args.find(key);
  if (it == args.end()) throw Usage("missing " + key);
  return it->second;
}

inline std::string optional(const Args& args, const std::string& key, std::string fallback = {}) {
  const auto it = args.find(key);
  return it == args.end() ? fallback : it->second;
}

inline std::chrono::milliseconds millis(const Args& args, const std::string& key,
                                        long long fallback) {
  return std::chrono::milliseconds(std::stoll(optional(args, key, std::to_string(fallback))));
}

// One line on stdout, flushed: the test reads it through a pipe.
inline void say(const std::string& line) {
  std::cout << line << std::endl;
}

// With --wait-go, waits for one byte on stdin first, so a test can start several workers and
// release them at once; false when stdin closed instead.
inline bool wait_go(const Args& args) {
  if (args.count("--wait-go") == 0) return true;
  char go = 0;
  return ::read(STDIN_FILENO, &go, 1) == 1;
}

// Blocks (inside a handler or an operation: its claim held, its transaction open) until the test
// SIGKILLs this process; throws when the test closes stdin instead.
[[noreturn]] inline void block_until_killed() {
  char byte = 0;
  while (::read(STDIN_FILENO, &byte, 1) > 0) {
  }
  throw std::runtime_error("the test closed stdin instead of killing the worker");
}

// The lines of `path`, empty ones left out.
inline std::deque<std::string> read_lines(const std::string& path) {
  std::deque<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

inline Event event_with_id(const std::string& id) {
  Event event;
  event.id = id;
  event.type = "test.event";
  return event;
}

// Appends whole lines with O_APPEND: each write() lands in one piece even with several processes
// appending to the same file, and survives the process being killed right after. With `fsync`
// the line is also on disk before append() returns (the crash matrix's worker).
class EffectsFile {
 public:
  explicit EffectsFile(const std::string& path, bool fsync = false)
      : fd_(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)), fsync_(fsync) {
    if (fd_ < 0) throw std::runtime_error("cannot open effects file " + path);
  }
  EffectsFile(const EffectsFile&) = delete;
  EffectsFile& operator=(const EffectsFile&) = delete;
  ~EffectsFile() { ::close(fd_); }

  void append(const std::string& line) const {
    const std::string text = line + "\n";
    if (::write(fd_, text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
        (fsync_ && ::fsync(fd_) != 0)) {
      throw std::runtime_error("could not append to the effects file");
    }
  }

 private:
  int fd_;
  bool fsync_;
};

// The system clock, its wall time `ahead` in the future (a process started that far ahead finds a
// killed owner's lease over without anyone waiting for it).
class AheadClock final : public Clock {
 public:
  explicit AheadClock(std::chrono::milliseconds ahead) : ahead_(ahead) {}
  WallTime wall_now() const override { return std::chrono::system_clock::now() + ahead_; }
  SteadyTime steady_now() const override { return std::chrono::steady_clock::now(); }
  bool sleep_for(std::chrono::nanoseconds duration, std::stop_token stop) override {
    return system_.sleep_for(duration, stop);
  }

 private:
  std::chrono::milliseconds ahead_;
  SystemClock system_;
};

// What a consumer command's line says: --consumer NAME, --worker W (default: the pid), --mode
// exclusive|transactional, --lease-ms N (default 30 s), and in exclusive mode --effects FILE.
struct ConsumerSettings {
  std::string consumer;
  std::string worker;
  HandlerOptions options;
  std::unique_ptr<EffectsFile> effects;  // exclusive mode: where the side effects go
};

inline ConsumerSettings consumer_settings(const Args& args) {
  ConsumerSettings settings;
  const std::string mode = required(args, "--mode");
  if (mode == "exclusive") {
    settings.options.mode = HandlerMode::exclusive;
    settings.effects = std::make_unique<EffectsFile>(required(args, "--effects"));
  } else if (mode == "transactional") {
    settings.options.mode = HandlerMode::transactional;
  } else {
    throw Usage("--mode must be exclusive or transactional, not " + mode);
  }
  settings.options.lease = millis(args, "--lease-ms", 30'000);
  settings.consumer = required(args, "--consumer");
  settings.worker = optional(args, "--worker", std::to_string(::getpid()));
  return settings;
}

// The side effect of one event, written the way the mode promises to protect: exclusive mode
// appends the id to the effects file; transactional mode runs `insert` (its parameters: the
// event id and the worker) through the handler's transaction, a `Transaction`.
template <class Transaction>
void side_effect(const ConsumerSettings& settings, BusProxy& bus, const Event& event,
                 const std::string& insert) {
  if (settings.effects) {
    settings.effects->append(event.id);
    return;
  }
  auto* tx = dynamic_cast<Transaction*>(bus.transaction());
  if (tx == nullptr)
    throw std::runtime_error("transactional handler got no transaction of its kind");
  tx->exec(insert, {event.id, settings.worker});
}

// A delivery refused with `e` is one a broker redelivers: retryable and not in doubt
// (AlreadyInProgress: another process runs it; a busy store).
inline bool redeliverable(const Error& e) {
  return e.retryable() && !e.in_doubt();
}

// Gives every item of `queue` to `deliver`, in order, as a broker would: an item refused with an
// idem::Error that `redeliver_if` accepts is not acknowledged, so it goes to the back of the
// queue and comes again after a short redelivery delay; any other error propagates. Returns how
// many redeliveries that took, or -1 past 1000 per item (the worker gives up: exit code 4).
template <class Deliver, class RedeliverIf = bool (*)(const Error&)>
long deliver_all(std::deque<std::string> queue, Deliver&& deliver,
                 RedeliverIf redeliver_if = &redeliverable) {
  long redelivered = 0;
  const long max_redeliveries = 1000L * static_cast<long>(queue.size() + 1);
  while (!queue.empty()) {
    const std::string item = queue.front();
    queue.pop_front();
    try {
      deliver(item);
    } catch (const Error& e) {
      if (!redeliver_if(e)) throw;
      queue.push_back(item);
      if (++redelivered > max_redeliveries) return -1;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  return redelivered;
}

// Delivers every event id of `queue` to an idempotent `handler` (redelivering as deliver_all
// does) and prints "processed=N duplicate=M redelivered=K"; returns the exit code (0, or 4 when
// it gave up).
template <class Handler>
int consume_all(std::deque<std::string> queue, Handler& handler, BusProxy& bus) {
  long processed = 0;
  long duplicate = 0;
  const long redelivered = deliver_all(std::move(queue), [&](const std::string& id) {
    if (handler(event_with_id(id), bus) == HandleResult::processed) {
      ++processed;
    } else {
      ++duplicate;
    }
  });
  if (redelivered < 0) return 4;
  say("processed=" + std::to_string(processed) + " duplicate=" + std::to_string(duplicate) +
      " redelivered=" + std::to_string(redelivered));
  return 0;
}

// A worker's main(): the command is argv[command_at], its arguments follow; `dispatch(command,
// args)` runs it (throwing Usage for an unknown command) and returns the exit code.
template <class Dispatch>
int worker_main(const char* name, int argc, char** argv, int command_at, Dispatch&& dispatch) {
  try {
    if (argc <= command_at) throw Usage("missing command");
    const std::string command = argv[command_at];
    const Args args = parse_args(argc, argv, command_at + 1);
    return dispatch(command, args);
  } catch (const Usage& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return 3;
  }
}

// The commands of a worker by name, for worker_main().
using Commands = std::map<std::string, std::function<int(const Args&)>>;

// A worker's main() that runs one of `commands` (another name is bad usage).
inline int worker_main(const char* name, int argc, char** argv, int command_at,
                       const Commands& commands) {
  return worker_main(name, argc, argv, command_at,
                     [&](const std::string& command, const Args& args) -> int {
                       const auto it = commands.find(command);
                       if (it == commands.end()) throw Usage("unknown command " + command);
                       return it->second(args);
                     });
}

}  // namespace idem::test::worker
