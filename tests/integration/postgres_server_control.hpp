// The test PostgreSQL server stopped and started again by a test (the fault tests), the way
// scripts/servers.sh started it: pg_ctl (IDEM_TEST_PG_CTL_CMD, as the postgres user when run as
// root) on the data directory under IDEM_TEST_SERVERS_DIR, on IDEM_TEST_POSTGRES_PORT.
//
// Thread-safety: one ServerControl per test; stop() and start() from the test's thread.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sstream>
#include <string>
#include <vector>

#include "../process/worker/child_process.hpp"
#include "../server_env.hpp"

namespace idem::test::pg {

// Starts the server again on destruction if a test left it stopped, so later tests find it
// running.
class ServerControl {
 public:
  static bool available() {
    return !env("IDEM_TEST_PG_CTL_CMD").empty() && !env("IDEM_TEST_SERVERS_DIR").empty() &&
           !env("IDEM_TEST_POSTGRES_PORT").empty();
  }
  ServerControl(const ServerControl&) = delete;
  ServerControl& operator=(const ServerControl&) = delete;
  ServerControl() = default;
  ~ServerControl() {
    if (stopped_) start();
  }

  void stop() {
    run({"stop", "-m", "fast", "-w"});
    stopped_ = true;
  }
  void start() {
    const std::string dir = env("IDEM_TEST_SERVERS_DIR");
    run({"start", "-w", "-t", "60", "-l", dir + "/pg/postgres.log", "-o",
         "-c listen_addresses=127.0.0.1 -p " + env("IDEM_TEST_POSTGRES_PORT") + " -k " + dir +
             "/pg -c fsync=off -c max_connections=200"});
    stopped_ = false;
  }

 private:
  void run(const std::vector<std::string>& args) {
    std::vector<std::string> argv;
    if (::geteuid() == 0) argv = {"/usr/sbin/runuser", "-u", "postgres", "--"};
    std::istringstream command(env("IDEM_TEST_PG_CTL_CMD"));  // "<bin>/pg_ctl -D <data>"
    for (std::string word; command >> word;)
      argv.push_back(word);
    argv.insert(argv.end(), args.begin(), args.end());
    idem::test::ChildProcess child(argv);
    child.close_stdin();
    const std::string output = child.read_all();
    const int status = child.wait();
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "pg_ctl " << args.front() << " failed (" << status << "): " << output;
  }

  bool stopped_ = false;
};

}  // namespace idem::test::pg

// In a test body or SetUp: skips (or fails) the test when the server cannot be controlled.
#define IDEM_REQUIRE_POSTGRES_CONTROL()                                                   \
  do {                                                                                    \
    if (!::idem::test::pg::ServerControl::available())                                    \
      IDEM_SERVER_MISSING(                                                                \
          "no PostgreSQL server control: IDEM_TEST_PG_CTL_CMD, IDEM_TEST_SERVERS_DIR or " \
          "IDEM_TEST_POSTGRES_PORT is not set");                                          \
  } while (false)
