// ChildProcess: runs idem_test_worker (or any program) with pipes to its stdin and stdout, for
// the multi-process tests. fork+exec, so the child is a fresh process even when the test has
// threads (ThreadSanitizer-safe). The destructor SIGKILLs and reaps a child still running.
//
// Thread-safety: use one ChildProcess from one thread.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <string>
#include <vector>

namespace idem::test {

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
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
    close_stdin();
    if (stdout_ >= 0) ::close(stdout_);
  }

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

  // Blocks until the child writes a whole line (without the '\n'); "" at EOF.
  std::string read_line() {
    std::string line;
    char c = 0;
    for (;;) {
      const ssize_t n = ::read(stdout_, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || c == '\n') return line;
      line += c;
    }
  }

  // Everything the child writes until it closes stdout.
  std::string read_all() {
    std::string all;
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::read(stdout_, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return all;
      all.append(buffer, static_cast<std::size_t>(n));
    }
  }

  void kill(int signal) { ::kill(pid_, signal); }

  // Reaps the child; returns the raw waitpid status.
  int wait() {
    if (reaped_) return status_;
    while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

}  // namespace idem::test
