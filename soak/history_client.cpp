// idem_history_client: one client process of the failover soak (scripts/failover-soak.sh).
//
//   idem_history_client --url URL --out FILE [--seconds 15] [--process-id N] [--keys 16]
//                       [--lease-ms 1000] [--call-deadline-ms 30000] [--final-seconds 60]
//                       [--pace-ms 1] [--threads 4]
//
// Opens a recorder and an idempotency store on URL (idem::open_recorder / open_store: any scheme,
// a Redis Cluster, a Sentinel group, a PostgreSQL pair with target_session_attrs=read-write) and
// runs --threads threads, each a bounded loop of calls (one at a time, --pace-ms apart) for
// --seconds, while the script kills servers or moves slots under it. Every call is written to
// FILE (appended, one JSON object a line, flushed before the call starts and after it ends):
//
//   {"p":P,"c":N,"op":OP,"key":K,"phase":"invoke","t":MS}
//   {"p":P,"c":N,"op":OP,"key":K,"phase":"ok","t":MS, ...what the call returned}
//   {"p":P,"c":N,"op":OP,"key":K,"phase":"fail","class":"retryable|in_doubt|fatal","t":MS,
//    "error":"..."}
//
// P is --process-id, N counts this process's calls, MS is CLOCK_MONOTONIC in milliseconds (with
// microseconds as the fraction; one clock for every process of the machine, so histories merge).
// The operations:
//
//   mark      recorder mark_processed("history", K) of an event id K unique to this process
//             ("p<P>-e<n>"): once acknowledged, it must be visible for ever after.
//   check     is_processed("history", K) of an event this process marked before; ok carries
//             "found".
//   claim     store claim(K, no fingerprint, lease) of a shared key: every process draws keys
//             "w<window>-k<i>" (i < --keys, window = MS / 500), so the processes contend for
//             them; 40% of claims draw from the 8 windows before (where abandoned and stalled
//             claims are taken over). ok carries "status"
//             (acquired|completed|in_progress|mismatch), "token" (acquired: ours; else the
//             record's), "took_over".
//   complete  store complete(K, token, value, ...) after an acquired claim; the value is
//             "p<P>-t<token>". ok carries "token", "value" and "accepted" (false: fenced off).
//             ~10% of owners stall: they complete 1.5 to 3 leases later, while the loop goes
//             on (another process may take the key over meanwhile: the stale completion must
//             be refused); ~3% walk away (a crashed owner, taken over after the lease).
//   get       store lookup(K) of a key seen before; ok carries "state" (absent|in_progress|
//             completed), "token" and, when completed, "value".
//
// After its loop, each thread's final phase re-reads every event it marked (acknowledged or in
// doubt) with check, and every key it completed (accepted or in doubt) with get, each logged with
// "phase":"final" (or "final_fail" when no read succeeded within --final-seconds: the store
// never came back). A call that runs past --call-deadline-ms makes a watchdog write
// {"phase":"stuck",...} and end the process with status 3; its invoke stays without an outcome
// (scripts/check_history.py reports it as a call that never ended).
//
// Exit status: 0 done, 2 bad arguments, 3 a call never ended, 4 the URL was refused (ConfigError
// or NotSupported: a scheme this idem does not open), 1 anything else.
#include <fmt/core.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/error.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/open.hpp"
#include "idem/recorder.hpp"
#include "idem/report.hpp"

namespace {

using namespace std::chrono_literals;

const std::string kConsumer = "history";
constexpr double kMarkShare = 0.35;
constexpr double kCheckShare = 0.15;
constexpr double kClaimShare = 0.40;  // the rest: get
constexpr double kStallRate = 0.10;
constexpr double kAbandonRate = 0.03;
constexpr std::int64_t kWindowMs = 500;
constexpr double kOldKeyShare = 0.4;
constexpr std::int64_t kOldWindows = 8;

struct Options {
  std::string url;
  std::string out;
  int seconds = 15;
  int process_id = 0;
  int keys = 16;
  int lease_ms = 1000;
  int call_deadline_ms = 30000;
  int final_seconds = 60;
  int pace_ms = 1;
  int threads = 4;
};

double now_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// The history file: whole lines, flushed at once (the process may be killed at any moment).
class History {
 public:
  History(const std::string& path, int process_id) : process_id_(process_id) {
    file_ = std::fopen(path.c_str(), "a");
    if (file_ == nullptr) throw std::runtime_error("cannot open " + path);
  }
  ~History() { std::fclose(file_); }
  History(const History&) = delete;
  History& operator=(const History&) = delete;

  // One line: {"p":..,"c":..,"op":..,"key":..,"phase":..,"t":..<extra>}
  void write(std::uint64_t call, std::string_view op, std::string_view key, std::string_view phase,
             const std::string& extra = {}) {
    const std::string line = fmt::format(
        "{{\"p\":{},\"c\":{},\"op\":{},\"key\":{},\"phase\":{},\"t\":{:.3f}{}}}\n", process_id_,
        call, json_string(op), json_string(key), json_string(phase), now_ms(), extra);
    std::lock_guard lock(mutex_);
    std::fputs(line.c_str(), file_);
    std::fflush(file_);
  }

 private:
  int process_id_;
  std::FILE* file_ = nullptr;
  std::mutex mutex_;
};

// Ends the process when one call runs past the deadline: its invoke then has no outcome. One
// slot per worker thread.
class Watchdog {
 public:
  Watchdog(History& history, std::chrono::milliseconds deadline, std::size_t slots)
      : history_(history), deadline_(deadline), slots_(slots) {
    thread_ = std::jthread([this](std::stop_token stop) { run(stop); });
  }

  void begin(std::size_t slot, std::uint64_t call, const char* op) {
    slots_[slot].op.store(op);
    slots_[slot].call.store(call);
    slots_[slot].started.store(now_ms());
  }
  void end(std::size_t slot) { slots_[slot].started.store(0); }

 private:
  struct Slot {
    std::atomic<double> started{0};
    std::atomic<std::uint64_t> call{0};
    std::atomic<const char*> op{""};
  };

  void run(const std::stop_token& stop) {
    while (!stop.stop_requested()) {
      std::this_thread::sleep_for(100ms);
      for (Slot& slot : slots_) {
        const double started = slot.started.load();
        if (started > 0 && now_ms() - started > static_cast<double>(deadline_.count())) {
          history_.write(slot.call.load(), slot.op.load(), "", "stuck",
                         fmt::format(",\"after_ms\":{:.0f}", now_ms() - started));
          std::_Exit(3);
        }
      }
    }
  }

  History& history_;
  std::chrono::milliseconds deadline_;
  std::vector<Slot> slots_;
  std::jthread thread_;
};

std::string failure_extra(const std::exception_ptr& error) {
  std::string cls = "fatal";
  std::string what;
  try {
    std::rethrow_exception(error);
  } catch (const idem::Error& e) {
    cls = e.in_doubt() ? "in_doubt" : e.retryable() ? "retryable" : "fatal";
    what = e.what();
  } catch (const std::exception& e) {
    what = e.what();
  }
  if (what.size() > 200) what.resize(200);
  return fmt::format(",\"class\":\"{}\",\"error\":{}", cls, json_string(what));
}

std::string_view status_name(idem::ClaimOutcome::Status status) {
  switch (status) {
    case idem::ClaimOutcome::Status::acquired:
      return "acquired";
    case idem::ClaimOutcome::Status::completed:
      return "completed";
    case idem::ClaimOutcome::Status::in_progress:
      return "in_progress";
    case idem::ClaimOutcome::Status::mismatch:
      return "mismatch";
  }
  return "unknown";
}

std::string record_extra(const std::optional<idem::IdempotencyRecord>& record) {
  if (!record) return ",\"state\":\"absent\"";
  if (record->state == idem::IdempotencyRecord::State::in_progress) {
    return fmt::format(",\"state\":\"in_progress\",\"token\":{}", record->token);
  }
  return fmt::format(",\"state\":\"completed\",\"token\":{},\"value\":{}", record->token,
                     json_string(record->value.bytes.value_or("")));
}

// What the worker threads of one process share.
struct Shared {
  Shared(const Options& o)
      : options(o),
        history(o.out, o.process_id),
        watchdog(history, std::chrono::milliseconds(o.call_deadline_ms),
                 static_cast<std::size_t>(o.threads)) {}

  // 0 opened; 4 the URL was refused; 1 the servers never answered.
  int open() {
    const double until = now_ms() + 20000;
    for (;;) {
      try {
        recorder = idem::open_recorder(options.url);
        store = idem::open_store(options.url);
        return 0;
      } catch (const idem::ConfigError& e) {
        fmt::print(stderr, "idem_history_client: URL refused: {}\n", e.what());
        return 4;
      } catch (const idem::NotSupported& e) {
        fmt::print(stderr, "idem_history_client: URL refused: {}\n", e.what());
        return 4;
      } catch (const idem::Error& e) {
        if (!e.retryable() || now_ms() > until) {
          fmt::print(stderr, "idem_history_client: cannot open: {}\n", e.what());
          return 1;
        }
      }
      std::this_thread::sleep_for(200ms);
    }
  }

  Options options;
  History history;
  Watchdog watchdog;
  std::shared_ptr<idem::IdempotencyRecorder> recorder;
  std::shared_ptr<idem::IdempotencyStore> store;
  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::uint64_t> events{0};
};

// One thread of calls: its own events, keys and stalled completions.
class Worker {
 public:
  Worker(Shared& shared, std::size_t slot)
      : shared_(shared),
        slot_(slot),
        random_(std::random_device{}() ^ (static_cast<unsigned>(shared.options.process_id) << 8) ^
                static_cast<unsigned>(slot)) {}

  void run() {
    const double end = now_ms() + shared_.options.seconds * 1000.0;
    while (now_ms() < end) {
      complete_stalled();
      const double pick = std::uniform_real_distribution<double>(0, 1)(random_);
      if (pick < kMarkShare) {
        mark();
      } else if (pick < kMarkShare + kCheckShare) {
        check();
      } else if (pick < kMarkShare + kCheckShare + kClaimShare) {
        claim_and_complete();
      } else {
        get();
      }
      if (shared_.options.pace_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(shared_.options.pace_ms));
    }
  }

  void final_phase() {
    const double until = now_ms() + shared_.options.final_seconds * 1000.0;
    for (const std::string& event : marked_) {
      final_read("check", event, until, [&] {
        return fmt::format(",\"found\":{}", shared_.recorder->is_processed(kConsumer, event));
      });
    }
    std::sort(completed_.begin(), completed_.end());
    completed_.erase(std::unique(completed_.begin(), completed_.end()), completed_.end());
    for (const std::string& key : completed_) {
      final_read("get", key, until, [&] { return record_extra(shared_.store->lookup(key)); });
    }
  }

 private:
  // Runs `fn` as call `id` under the watchdog: what it returns goes to `extra`; returns what it
  // threw (null when it returned).
  std::exception_ptr watched(std::uint64_t id, const char* op,
                             const std::function<std::string()>& fn, std::string& extra) {
    shared_.watchdog.begin(slot_, id, op);
    std::exception_ptr error;
    try {
      extra = fn();
    } catch (...) {
      error = std::current_exception();
    }
    shared_.watchdog.end(slot_);
    return error;
  }

  // Runs one logged call: invoke, then ok with what `fn` returns, or fail with the class of
  // the error. True when it returned.
  bool call(const char* op, const std::string& key, const std::string& invoke_extra,
            const std::function<std::string()>& fn) {
    const std::uint64_t id = ++shared_.calls;
    shared_.history.write(id, op, key, "invoke", invoke_extra);
    std::string extra;
    const std::exception_ptr error = watched(id, op, fn, extra);
    if (error) {
      shared_.history.write(id, op, key, "fail", failure_extra(error));
      return false;
    }
    shared_.history.write(id, op, key, "ok", extra);
    return true;
  }

  void final_read(const char* op, const std::string& key, double until,
                  const std::function<std::string()>& fn) {
    for (;;) {
      const std::uint64_t id = ++shared_.calls;
      std::string extra;
      const std::exception_ptr error = watched(id, op, fn, extra);
      if (!error) {
        shared_.history.write(id, op, key, "final", extra);
        return;
      }
      if (now_ms() > until) {
        shared_.history.write(id, op, key, "final_fail", failure_extra(error));
        return;
      }
      std::this_thread::sleep_for(100ms);
    }
  }

  void mark() {
    const std::string event = fmt::format("p{}-e{}", shared_.options.process_id, ++shared_.events);
    call("mark", event, {}, [&] {
      shared_.recorder->mark_processed(kConsumer, event);
      return std::string();
    });
    // Acknowledged, failed or in doubt: the final phase reads it either way (the checker
    // decides what each answer means).
    marked_.push_back(event);
  }

  void check() {
    if (marked_.empty()) return;
    const std::string& event =
        marked_[std::uniform_int_distribution<std::size_t>(0, marked_.size() - 1)(random_)];
    call("check", event, {}, [&] {
      return fmt::format(",\"found\":{}", shared_.recorder->is_processed(kConsumer, event));
    });
  }

  // A key of the current window mostly; else one of the last few windows (past a lease), where
  // abandoned and stalled claims wait to be taken over.
  std::string shared_key() {
    auto window = static_cast<std::int64_t>(now_ms()) / kWindowMs;
    if (std::uniform_real_distribution<double>(0, 1)(random_) < kOldKeyShare) {
      window -= std::uniform_int_distribution<std::int64_t>(1, kOldWindows)(random_);
    }
    return fmt::format("w{}-k{}", window,
                       std::uniform_int_distribution<int>(0, shared_.options.keys - 1)(random_));
  }

  void claim_and_complete() {
    const std::string key = shared_key();
    seen_.push_back(key);
    const idem::Millis lease(shared_.options.lease_ms);
    idem::ClaimOutcome outcome;
    const bool claimed = call("claim", key, {}, [&] {
      outcome = shared_.store->claim(key, std::nullopt, lease);
      const std::uint64_t token = outcome.status == idem::ClaimOutcome::Status::acquired
                                      ? outcome.token
                                      : (outcome.record ? outcome.record->token : 0);
      return fmt::format(",\"status\":\"{}\",\"token\":{},\"took_over\":{}",
                         status_name(outcome.status), token, outcome.took_over);
    });
    if (!claimed || outcome.status != idem::ClaimOutcome::Status::acquired) return;
    const double fate = std::uniform_real_distribution<double>(0, 1)(random_);
    if (fate < kAbandonRate) return;  // a crashed owner: taken over after the lease
    if (fate < kAbandonRate + kStallRate) {
      // A stalled owner: it completes 1.5 to 3 leases later (the loop goes on meanwhile), by
      // when another process may have taken the key over and fenced this token off.
      const double delay =
          shared_.options.lease_ms * std::uniform_real_distribution<double>(1.5, 3)(random_);
      stalled_.push_back({now_ms() + delay, key, outcome.token});
      return;
    }
    complete(key, outcome.token);
  }

  // The stalled completions now due.
  void complete_stalled() {
    const double now = now_ms();
    for (std::size_t i = 0; i < stalled_.size();) {
      if (stalled_[i].due > now) {
        ++i;
        continue;
      }
      const Stalled due = stalled_[i];
      stalled_.erase(stalled_.begin() + static_cast<std::ptrdiff_t>(i));
      complete(due.key, due.token);
    }
  }

  void complete(const std::string& key, std::uint64_t token) {
    const std::string value = fmt::format("p{}-t{}", shared_.options.process_id, token);
    completed_.push_back(key);
    call("complete", key, fmt::format(",\"token\":{},\"value\":{}", token, json_string(value)),
         [&] {
           idem::StoredValue stored;
           stored.bytes = value;
           idem::ExecutionReport report;
           report.operation = "history";
           const bool accepted = shared_.store->complete(key, token, stored, report, 1h);
           return fmt::format(",\"token\":{},\"value\":{},\"accepted\":{}", token,
                              json_string(value), accepted);
         });
  }

  void get() {
    if (seen_.empty()) return;
    const std::string& key =
        seen_[std::uniform_int_distribution<std::size_t>(0, seen_.size() - 1)(random_)];
    call("get", key, {}, [&] { return record_extra(shared_.store->lookup(key)); });
  }

  Shared& shared_;
  std::size_t slot_;
  std::mt19937_64 random_;
  std::vector<std::string> marked_;     // every event a mark was invoked for
  std::vector<std::string> completed_;  // every key a completion was invoked for
  std::vector<std::string> seen_;       // every key claimed
  struct Stalled {
    double due;
    std::string key;
    std::uint64_t token;
  };
  std::vector<Stalled> stalled_;  // completions put off (stalled owners); dropped at the end
};

int parse_int(const char* text, const char* name) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 0 || value > 1000000) {
    fmt::print(stderr, "idem_history_client: bad value for {}: {}\n", name, text);
    std::exit(2);
  }
  return static_cast<int>(value);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) {
      fmt::print(stderr, "idem_history_client: {} needs a value\n", arg);
      return 2;
    }
    const char* value = argv[++i];
    if (arg == "--url") {
      options.url = value;
    } else if (arg == "--out") {
      options.out = value;
    } else if (arg == "--seconds") {
      options.seconds = parse_int(value, "--seconds");
    } else if (arg == "--process-id") {
      options.process_id = parse_int(value, "--process-id");
    } else if (arg == "--keys") {
      options.keys = std::max(1, parse_int(value, "--keys"));
    } else if (arg == "--lease-ms") {
      options.lease_ms = std::max(1, parse_int(value, "--lease-ms"));
    } else if (arg == "--call-deadline-ms") {
      options.call_deadline_ms = std::max(1, parse_int(value, "--call-deadline-ms"));
    } else if (arg == "--final-seconds") {
      options.final_seconds = parse_int(value, "--final-seconds");
    } else if (arg == "--threads") {
      options.threads = std::max(1, std::min(64, parse_int(value, "--threads")));
    } else if (arg == "--pace-ms") {
      options.pace_ms = parse_int(value, "--pace-ms");
    } else {
      fmt::print(stderr, "idem_history_client: unknown argument {}\n", arg);
      return 2;
    }
  }
  if (options.url.empty() || options.out.empty()) {
    fmt::print(stderr,
               "usage: idem_history_client --url URL --out FILE [--seconds N] "
               "[--process-id N] [--keys N]\n");
    return 2;
  }
  try {
    Shared shared(options);
    if (const int status = shared.open(); status != 0) return status;
    std::vector<std::jthread> threads;
    for (int i = 0; i < options.threads; ++i) {
      threads.emplace_back([&shared, i] {
        Worker worker(shared, static_cast<std::size_t>(i));
        worker.run();
        worker.final_phase();
      });
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "idem_history_client: {}\n", e.what());
    return 1;
  }
  return 0;
}
