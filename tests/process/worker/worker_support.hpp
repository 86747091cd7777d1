// What every worker program of the process tests shares (idem_test_<name>, tests/process/worker/,
// and the PostgreSQL worker inside its test binaries, postgres_worker.hpp): the command line
// ("<command> --name value ... [--flag]"), main()'s exit codes, the effects file that counts side
// effects across processes, a clock running ahead, and small I/O helpers.
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
#include <deque>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <map>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>

#include "idem/clock.hpp"
#include "idem/event.hpp"

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

}  // namespace idem::test::worker
