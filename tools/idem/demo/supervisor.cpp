// The demo's signals, phases and child processes (supervisor.hpp).
#include "supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "../demo.hpp"

extern char** environ;

namespace idem::cli::demo {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "used from a signal handler");

constexpr int kHandled[] = {SIGINT, SIGTERM, SIGPIPE};
struct sigaction g_previous[3];

extern "C" void on_signal(int signal) {
  int none = 0;
  g_signal.compare_exchange_strong(none, signal);
}

std::string& phase_name() {
  static std::string phase = "starting";
  return phase;
}

}  // namespace

Interrupted::Interrupted(int signal)
    : signal_(signal), what_("stopped by " + signal_name(signal)) {}

SignalScope::SignalScope() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a blocking call returns with EINTR
  for (std::size_t i = 0; i < std::size(kHandled); ++i)
    ::sigaction(kHandled[i], &action, &g_previous[i]);
}

SignalScope::~SignalScope() {
  for (std::size_t i = 0; i < std::size(kHandled); ++i)
    ::sigaction(kHandled[i], &g_previous[i], nullptr);
}

int pending_signal() noexcept {
  return g_signal.load();
}

void check_interrupted() {
  if (const int signal = pending_signal(); signal != 0) throw Interrupted(signal);
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGPIPE:
      return "SIGPIPE";
    default:
      return "signal " + std::to_string(signal);
  }
}

void enter_phase(const std::string& phase) {
  phase_name() = phase;
  if (const char* raise_at = std::getenv(kDemoRaiseAtVariable)) {
    const std::string_view hook(raise_at);
    const std::size_t colon = hook.find(':');
    if (hook.substr(0, colon) == phase) {
      const std::string_view which = colon == hook.npos ? "INT" : hook.substr(colon + 1);
      ::raise(which == "TERM" ? SIGTERM : which == "PIPE" ? SIGPIPE : SIGINT);
    }
  }
  check_interrupted();
}

const std::string& current_phase() {
  return phase_name();
}

DemoProcess::DemoProcess(std::vector<std::string> args, const ChildEnvironment& environment,
                         int inherit_fd) {
  // Everything is built before fork(): the child may only call async-signal-safe functions.
  const std::string store_prefix = std::string(kDemoStoreVariable) + "=";
  const std::string broker_prefix = std::string(kDemoBrokerVariable) + "=";
  std::string store_variable = store_prefix + environment.store_url;
  std::string broker_variable = broker_prefix + environment.broker;
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.rfind(store_prefix, 0) != 0 && entry.rfind(broker_prefix, 0) != 0 &&
        entry.rfind(std::string(kDemoRaiseAtVariable) + "=", 0) != 0)
      envp.push_back(*e);
  }
  envp.push_back(store_variable.data());
  if (!environment.broker.empty()) envp.push_back(broker_variable.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the demo died before the line above
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGINT, &ignore, nullptr);
    if (inherit_fd >= 0) ::fcntl(inherit_fd, F_SETFD, 0);
    ::execve("/proc/self/exe", argv.data(), envp.data());
    static constexpr char kFailed[] = "idem demo: cannot start a child process (exec failed)\n";
    (void)!::write(STDERR_FILENO, kFailed, sizeof kFailed - 1);
    ::_exit(127);
  }
}

DemoProcess::~DemoProcess() {
  if (pid_ > 0 && !status_) kill();
}

std::optional<int> DemoProcess::exited() {
  if (status_) return status_;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) status_ = status;
  return status_;
}

int DemoProcess::kill() {
  if (status_) return *status_;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  status_ = status;
  return status;
}

WatchResult watch(DemoProcess& child, int notify_fd, DeliveryLogReader& log, ProgressBar& bar,
                  const std::function<std::uint64_t(const DeliveryStats&)>& progress,
                  const std::function<std::string(const DeliveryStats&)>& note) {
  for (;;) {
    check_interrupted();
    const DeliveryStats& stats = log.poll();
    bar.update(progress(stats), note(stats));
    if (notify_fd >= 0) {
      pollfd p{notify_fd, POLLIN, 0};
      // A child that exited also makes the pipe readable (EOF): only a message means "stalled".
      if (::poll(&p, 1, 50) > 0) {
        char buffer[32];
        const ssize_t n = ::read(notify_fd, buffer, sizeof buffer);
        if (n > 0) {
          child.kill();
          check_interrupted();
          const DeliveryStats& last = log.poll();
          bar.update(progress(last), note(last));
          WatchResult result{.stalled = true, .message = std::string(buffer, std::size_t(n))};
          while (!result.message.empty() && result.message.back() == '\n')
            result.message.pop_back();
          return result;
        }
        if (n == 0) notify_fd = -1;  // exited: wait for its status
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (const std::optional<int> status = child.exited()) {
      check_interrupted();  // a child that died of the terminal's signal is the demo's stop
      const DeliveryStats& last = log.poll();
      bar.update(progress(last), note(last));
      return WatchResult{.stalled = false, .message = {}, .status = *status};
    }
  }
}

}  // namespace idem::cli::demo
