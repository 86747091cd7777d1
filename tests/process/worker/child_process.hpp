// The two ways a test runs a child process; every test uses one of them.
//
// ChildProcess: runs idem_test_worker (or any program) with pipes to its stdin and stdout, for
// the multi-process tests. fork+exec, so the child is a fresh process even when the test has
// threads (ThreadSanitizer-safe). read_line(), read_all() and wait() wait within a bound: a child
// still there at the bound is killed with SIGKILL and reaped, and the call throws, so a hang fails
// the test instead of hanging it. The destructor SIGKILLs and reaps a child still running.
//
// ForkedChild: a copy of this process made with fork() and no exec, for what needs the copy
// itself: a process that has used idem (the fork tests), a handler killed by SIGKILL in the
// middle, a child that gives up root. Its body runs in the child, writes what it has to say
// through a pipe, and the child _exits without the parent's static destructors. wait() reads
// that report and reaps the child within a bound, SIGKILLing one that is still there, so a hang
// fails the test instead of hanging it. In a process with threads the child has only the
// forking thread: the body must not need the others (that is what the fork tests check).
//
// Thread-safety: use one ChildProcess or ForkedChild from one thread.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace idem::test {

namespace detail {

using Deadline = std::chrono::steady_clock::time_point;

// Milliseconds left until `deadline` (0 once it has passed), for poll().
inline int remaining_ms(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<std::chrono::milliseconds::rep>(0, left.count()));
}

// Kills `pid` with SIGKILL and reaps it (a killed child exits at once).
inline void sigkill_and_reap(pid_t pid, int& status) {
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

// Reaps `pid` into `status`; a child still running at `deadline` is killed with SIGKILL and reaped
// (returns false).
inline bool reap_by(pid_t pid, int& status, Deadline deadline) {
  for (;;) {
    const pid_t reaped = ::waitpid(pid, &status, WNOHANG);
    if (reaped == pid) return true;
    if (reaped < 0 && errno != EINTR) throw std::runtime_error("waitpid failed");
    if (remaining_ms(deadline) == 0) {
      sigkill_and_reap(pid, status);
      return false;
    }
    pollfd none{-1, 0, 0};
    (void)::poll(&none, 1, std::min(remaining_ms(deadline), 10));
  }
}

// Waits until `fd` has something to read (or is closed) or `deadline` passes; false at the
// deadline (also when a writer that never stops keeps it readable).
inline bool readable_by(int fd, Deadline deadline) {
  for (;;) {
    if (remaining_ms(deadline) == 0) return false;
    pollfd ready{fd, POLLIN, 0};
    const int n = ::poll(&ready, 1, remaining_ms(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error("poll failed");
    return n > 0;
  }
}

}  // namespace detail

class ChildProcess {
 public:
  explicit ChildProcess(std::vector<std::string> argv) {
    int in[2];
    int out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe failed");
    }
    std::vector<char*> args;
    for (auto& a : argv)
      args.push_back(a.data());
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      // Only async-signal-safe calls until exec.
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    if (pid_ > 0 && !reaped_) detail::sigkill_and_reap(pid_, status_);
    close_stdin();
    if (stdout_ >= 0) ::close(stdout_);
  }

  // How long read_line(), read_all() and wait() wait unless told: more than any worker of the
  // process tests needs (under the sanitizers too), well within ctest's timeout.
  static constexpr std::chrono::milliseconds kBound = std::chrono::minutes(5);

  pid_t pid() const { return pid_; }

  void write_stdin(const std::string& data) {
    if (::write(stdin_, data.data(), data.size()) != static_cast<ssize_t>(data.size())) {
      throw std::runtime_error("write to child failed");
    }
  }
  void close_stdin() {
    if (stdin_ >= 0) ::close(stdin_);
    stdin_ = -1;
  }

  // Waits until the child writes a whole line and returns it (without the '\n'); "" at EOF.
  // Throws (the child killed) when no whole line came within `bound`.
  std::string read_line(std::chrono::milliseconds bound = kBound) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    std::string line;
    char c = 0;
    for (;;) {
      if (!detail::readable_by(stdout_, deadline)) give_up("write a line", bound, line);
      const ssize_t n = ::read(stdout_, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || c == '\n') return line;
      line += c;
    }
  }

  // Everything the child writes until it closes stdout. Throws (the child killed) when it has not
  // closed stdout within `bound`.
  std::string read_all(std::chrono::milliseconds bound = kBound) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    std::string all;
    char buffer[4096];
    for (;;) {
      if (!detail::readable_by(stdout_, deadline)) give_up("close its stdout", bound, all);
      const ssize_t n = ::read(stdout_, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return all;
      all.append(buffer, static_cast<std::size_t>(n));
    }
  }

  void kill(int signal) { ::kill(pid_, signal); }

  // Reaps the child; returns the raw waitpid status. Throws (the child killed) when it has not
  // exited within `bound`: a status "killed by SIGKILL" would pass a test that kills it itself.
  int wait(std::chrono::milliseconds bound = kBound) {
    if (reaped_) return status_;
    const bool exited = detail::reap_by(pid_, status_, std::chrono::steady_clock::now() + bound);
    reaped_ = true;
    if (!exited) give_up("exit", bound, "");
    return status_;
  }

 private:
  // The child did not `what` in time: kill and reap it, and fail the call.
  [[noreturn]] void give_up(const char* what, std::chrono::milliseconds bound,
                            const std::string& output) {
    if (!reaped_) detail::sigkill_and_reap(pid_, status_);
    reaped_ = true;
    throw std::runtime_error("child process " + std::to_string(pid_) + " did not " + what +
                             " within " + std::to_string(bound.count()) +
                             " ms (killed); its output so far: '" + output.substr(0, 2000) + "'");
  }

  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

namespace detail {

// True when every thread of this process but the calling one is asleep (state S in
// /proc/self/task/<tid>/stat): none can then be inside an allocator's critical section.
inline bool other_threads_asleep() {
  const std::string self = std::to_string(::gettid());
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", error)) {
    if (task.path().filename() == self) continue;
    std::ifstream stat(task.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const auto paren = line.rfind(')');  // the name may hold spaces and parentheses
    if (paren == std::string::npos || paren + 2 >= line.size()) continue;  // the thread ended
    if (line[paren + 2] != 'S') return false;
  }
  return !error;
}

// See the header comment: only the AddressSanitizer build needs it. Two samples in a row, a
// millisecond apart, and at most five seconds (after which the fork goes ahead anyway).
inline void let_other_threads_settle_before_fork() {
#if defined(__SANITIZE_ADDRESS__)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int asleep_in_a_row = 0;
  while (asleep_in_a_row < 2 && std::chrono::steady_clock::now() < deadline) {
    asleep_in_a_row = other_threads_asleep() ? asleep_in_a_row + 1 : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
#endif
}

}  // namespace detail

class ForkedChild {
 public:
  // How the child ended: what it wrote, and how it exited.
  struct End {
    std::string report;
    int status = 0;          // the raw waitpid status
    bool timed_out = false;  // still running at the bound: killed with SIGKILL

    bool exited_with(int code) const {
      return !timed_out && WIFEXITED(status) && WEXITSTATUS(status) == code;
    }
    bool killed_by(int signal) const {
      return !timed_out && WIFSIGNALED(status) && WTERMSIG(status) == signal;
    }
    // "" when the child exited with status 0 and reported nothing; else what happened, in words.
    std::string problem() const {
      if (timed_out) return "the child did not exit in time (killed); its report: '" + report + "'";
      if (WIFSIGNALED(status)) {
        return "the child was killed by signal " + std::to_string(WTERMSIG(status)) +
               "; its report: '" + report + "'";
      }
      if (!exited_with(0) || !report.empty()) {
        return "the child exited with status " + std::to_string(WEXITSTATUS(status)) + ": " +
               report;
      }
      return "";
    }
  };

  // Forks; the child runs `body` — a callable taking nothing or the pipe's write end (an int, for
  // a body that reports before it is done), returning its report (std::string) or nothing —
  // writes the report, and _exits with 0 (2 when the body threw; its report then says what).
  template <class Body>
  explicit ForkedChild(Body&& body) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    detail::let_other_threads_settle_before_fork();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::close(fds[0]);
      std::string report;
      int code = 0;
      try {
        if constexpr (std::is_invocable_v<Body&, int>) {
          report = result_of([&] { return body(fds[1]); });
        } else {
          report = result_of([&] { return body(); });
        }
      } catch (const std::exception& e) {
        report = std::string("the child threw: ") + e.what();
        code = 2;
      } catch (...) {
        report = "the child threw";
        code = 2;
      }
      write_all(fds[1], report);
      ::_exit(code);
    }
    ::close(fds[1]);
    report_ = fds[0];
  }
  ForkedChild(const ForkedChild&) = delete;
  ForkedChild& operator=(const ForkedChild&) = delete;
  ~ForkedChild() {
    if (pid_ > 0 && !reaped_) detail::sigkill_and_reap(pid_, status_);
    if (report_ >= 0) ::close(report_);
  }

  pid_t pid() const { return pid_; }
  void kill(int signal) { ::kill(pid_, signal); }

  // Waits up to `bound` for the child to write (or to close its pipe); true when it wrote.
  bool wait_for_report(std::chrono::milliseconds bound) {
    pollfd fd{report_, POLLIN, 0};
    for (;;) {
      const int ready = ::poll(&fd, 1, static_cast<int>(bound.count()));
      if (ready < 0 && errno == EINTR) continue;
      return ready == 1 && (fd.revents & POLLIN) != 0;
    }
  }

  // Reads the report until the child closes its pipe, then reaps it; a child still there after
  // `bound` is killed with SIGKILL (End::timed_out).
  End wait(std::chrono::milliseconds bound = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    End end;
    bool eof = false;
    while (!eof && detail::readable_by(report_, deadline)) {
      char buffer[1024];
      const ssize_t n = ::read(report_, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        eof = true;
      } else {
        end.report.append(buffer, static_cast<std::size_t>(n));
      }
    }
    // Reap it: it closed its end, so it is exiting; wait for that, bounded by the deadline.
    end.timed_out = !detail::reap_by(pid_, status_, deadline);
    reaped_ = true;
    end.status = status_;
    return end;
  }

 private:
  template <class Call>
  static std::string result_of(Call&& call) {
    if constexpr (std::is_void_v<decltype(call())>) {
      call();
      return {};
    } else {
      return std::string(call());
    }
  }

  static void write_all(int fd, const std::string& text) {
    for (std::size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      done += static_cast<std::size_t>(n);
    }
  }

  pid_t pid_ = -1;
  int report_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

}  // namespace idem::test
