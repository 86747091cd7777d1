// A redis-server of a test's own, for tests that stop, crash or reconfigure the server: on a free
// port of its own and a temp directory, so tests sharing the suite's server (scripts/servers.sh)
// are never disturbed. It runs in the foreground with its log on a pipe; "Ready to accept
// connections" is the signal it is up. Destroying it SIGKILLs a server still running and removes
// the directory, also when an assertion failed.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "../free_port.hpp"
#include "../server_env.hpp"
#include "worker/child_process.hpp"

namespace idem::test {

// The redis-server binary, or "" when it is not installed.
inline std::string find_redis_server() {
  for (const char* path : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return {};
}

// In a test body or SetUp: skips the test (fails it when servers are required) when redis-server
// is not installed, else starts `server` (a PrivateRedis) and asserts that it came up.
#define IDEM_START_PRIVATE_REDIS(server)                                       \
  do {                                                                         \
    if (::idem::test::find_redis_server().empty())                             \
      IDEM_SERVER_MISSING("redis-server is not installed");                    \
    ASSERT_TRUE((server).start()) << "the private redis-server did not start"; \
  } while (false)

class PrivateRedis {
 public:
  // `flags`: redis-server options besides bind, port, dir, daemonize and logfile (persistence,
  // memory policy, ...), used by every start().
  explicit PrivateRedis(std::vector<std::string> flags)
      : port_(unused_loopback_port()), flags_(std::move(flags)) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "idem-private-redis-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
  }
  PrivateRedis(const PrivateRedis&) = delete;
  PrivateRedis& operator=(const PrivateRedis&) = delete;
  ~PrivateRedis() {
    server_.reset();  // SIGKILLs a server still running
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Starts the server and returns once it accepts connections (false: it did not come up).
  bool start() {
    std::vector<std::string> argv{find_redis_server(),
                                  "--bind",
                                  "127.0.0.1",
                                  "--port",
                                  std::to_string(port_),
                                  "--dir",
                                  dir_.string(),
                                  "--daemonize",
                                  "no",
                                  "--logfile",
                                  ""};
    argv.insert(argv.end(), flags_.begin(), flags_.end());
    server_ = std::make_unique<ChildProcess>(std::move(argv));
    for (std::string line = server_->read_line(); !line.empty(); line = server_->read_line()) {
      if (line.find("Ready to accept connections") != std::string::npos) return true;
    }
    return false;  // EOF: it exited (port taken, bad flags)
  }

  // Crash: SIGKILL, then reap.
  void kill() {
    server_->kill(SIGKILL);
    server_->wait();
    server_.reset();
  }

  // Waits for a server told to stop (SHUTDOWN) to exit; returns its wait status.
  int wait_exit() {
    const int status = server_->wait();
    server_.reset();
    return status;
  }

  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }

 private:
  int port_;
  std::vector<std::string> flags_;
  std::filesystem::path dir_;
  std::unique_ptr<ChildProcess> server_;
};

}  // namespace idem::test
