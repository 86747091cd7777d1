// The demo's supervision: the signals that stop it, the phase it is in, and its child processes.
//
// Signals: a SignalScope installs handlers for SIGINT, SIGTERM and SIGPIPE before the demo
// starts anything, and puts the previous dispositions back when it goes. A handler only records
// the first signal; check_interrupted() — called at every phase boundary and in every wait —
// then throws Interrupted, so the way out is the ordinary unwinding that kills the children and
// removes what the demo made. The handlers are installed without SA_RESTART, so a blocking call
// (a connect, a read from a server) returns early with EINTR and its error unwinds the same way.
//
// Phases: enter_phase() names the step the demo is in, for the summary after a signal, and is
// where the test hook IDEM_DEMO_RAISE_AT ("PHASE[:INT|TERM|PIPE]") makes the demo raise a signal
// against itself. The phases, in order: starting (the work dir and store namespace exist),
// producing, consuming (the first consumer is running), consumer-restarted, relaying,
// relay-restarted, shipping, shipping-restarted (these four with --hops 2), results.
//
// Children: a DemoProcess is this executable started again (fork, then exec of /proc/self/exe)
// with the store and broker URLs in its environment. It dies with the demo (PR_SET_PDEATHSIG,
// so even a SIGKILLed demo leaves none behind), ignores SIGINT (a terminal's Ctrl-C reaches the
// whole process group; the demo decides what happens to its children), and is SIGKILLed and
// reaped by its destructor if it is still running.
//
// Thread-safety: the demo is one thread; none of this is for use from several.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "../progress.hpp"
#include "delivery_log.hpp"

namespace idem::cli::demo {

// Thrown by check_interrupted() once SIGINT, SIGTERM or SIGPIPE arrived.
class Interrupted : public std::exception {
 public:
  explicit Interrupted(int signal);
  int signal() const noexcept { return signal_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  int signal_;
  std::string what_;
};

class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
};

// The first signal caught since the SignalScope was made, or 0.
int pending_signal() noexcept;
// Throws Interrupted when a signal was caught.
void check_interrupted();
// "SIGINT", "SIGTERM", "SIGPIPE", or "signal N".
std::string signal_name(int signal);

// Names the phase the demo enters (and raises IDEM_DEMO_RAISE_AT's signal when it is this one),
// then check_interrupted().
void enter_phase(const std::string& phase);
const std::string& current_phase();

// What a child process gets in its environment.
struct ChildEnvironment {
  std::string store_url;  // IDEM_DEMO_STORE
  std::string broker;     // IDEM_DEMO_BROKER (when not empty)
};

class DemoProcess {
 public:
  // Starts `args` (args[0] is the name `ps` shows) with `environment`; `inherit_fd` (when >= 0)
  // stays open in the child, every other descriptor the demo opened with O_CLOEXEC does not.
  DemoProcess(std::vector<std::string> args, const ChildEnvironment& environment,
              int inherit_fd = -1);
  ~DemoProcess();
  DemoProcess(const DemoProcess&) = delete;
  DemoProcess& operator=(const DemoProcess&) = delete;

  pid_t pid() const noexcept { return pid_; }
  // The wait status once the child exited (reaped), else nothing.
  std::optional<int> exited();
  // SIGKILL, then reap; returns the wait status.
  int kill();

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// How a watched child ended.
struct WatchResult {
  bool stalled = false;  // it reported a stall (and was killed): `message` is what it wrote
  std::string message;
  int status = 0;  // otherwise: its wait status
};

// Follows `child` until it exits or — when `notify_fd` >= 0 — until it writes to that pipe that
// it stalled, then kills it with SIGKILL. Meanwhile the bar shows `progress` of its delivery log
// with `note`. Throws Interrupted (the child is left to its destructor) when a signal arrives.
WatchResult watch(DemoProcess& child, int notify_fd, DeliveryLogReader& log, ProgressBar& bar,
                  const std::function<std::uint64_t(const DeliveryStats&)>& progress,
                  const std::function<std::string(const DeliveryStats&)>& note);

}  // namespace idem::cli::demo
