// A PostgreSQL primary with a streaming standby of a test's own, for tests that kill the primary
// and promote the standby (failover): their own temp directory and free ports, so tests sharing
// the suite's server (scripts/servers.sh) are never disturbed. The same set-up as servers.sh's
// IDEM_TEST_POSTGRES_STANDBY=1: initdb, a physical replication slot, `pg_basebackup -R` from the
// primary, hot_standby=on; with `synchronous`, synchronous_standby_names = '*' once the standby
// streams, so every COMMIT the primary acknowledges is on the standby too.
//
// The binaries come from IDEM_TEST_PG_BIN (servers.sh exports it) or the newest
// /usr/lib/postgresql/<version>/bin. Run as root, the servers run as the postgres user (as in
// servers.sh). Destroying the pair stops what still runs (pg_ctl stop -m immediate, by data
// directory) and removes the directory, also when an assertion failed.
//
// Thread-safety: one PrivatePostgresPair per test; its calls from the test's thread. The URLs
// may be used from any thread.
#pragma once

#include <pwd.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "../free_port.hpp"
#include "../postgres_test_support.hpp"
#include "../process/worker/child_process.hpp"
#include "../server_env.hpp"

namespace idem::test::pg {

// The PostgreSQL server binaries' directory, or "" when they are not installed.
inline std::string find_postgres_bin() {
  std::string bin = env("IDEM_TEST_PG_BIN");
  if (!bin.empty()) return bin;
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/lib/postgresql", ec)) {
    if (std::filesystem::exists(entry.path() / "bin" / "initdb")) found.push_back(entry.path());
  }
  if (found.empty()) return {};
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return std::stoi(a.filename().string()) < std::stoi(b.filename().string());
  });
  return (found.back() / "bin").string();
}

// In a test body: skips the test (fails it when servers are required) when the PostgreSQL server
// binaries are not installed.
#define IDEM_REQUIRE_POSTGRES_BINARIES()                             \
  do {                                                               \
    if (::idem::test::pg::find_postgres_bin().empty())               \
      IDEM_SERVER_MISSING(                                           \
          "the PostgreSQL server binaries (initdb, pg_ctl) are not " \
          "installed");                                              \
  } while (false)

class PrivatePostgresPair {
 public:
  explicit PrivatePostgresPair(bool synchronous)
      : synchronous_(synchronous),
        bin_(find_postgres_bin()),
        primary_port_(unused_loopback_port()),
        standby_port_(unused_loopback_port()) {
    std::string pattern = (std::filesystem::temp_directory_path() / "idem-pg-pair-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
    if (::geteuid() == 0) {
      const passwd* postgres = ::getpwnam("postgres");
      if (postgres == nullptr) throw std::runtime_error("there is no postgres user");
      if (::chown(dir_.c_str(), postgres->pw_uid, postgres->pw_gid) != 0) {
        throw std::runtime_error("chown of " + dir_.string() + " failed");
      }
    }
  }
  PrivatePostgresPair(const PrivatePostgresPair&) = delete;
  PrivatePostgresPair& operator=(const PrivatePostgresPair&) = delete;
  ~PrivatePostgresPair() {
    for (const char* data : {"primary", "standby"}) {
      if (std::filesystem::exists(dir_ / data / "postmaster.pid")) {
        (void)run({"pg_ctl", "-D", (dir_ / data).string(), "-m", "immediate", "-w", "stop"});
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Starts the primary, makes the database idem_test, and starts the standby from a base backup
  // of it; returns once the standby streams (and, when synchronous, is the synchronous one).
  // Throws std::runtime_error with the failing command's output.
  void start() {
    const std::string primary = (dir_ / "primary").string();
    const std::string standby = (dir_ / "standby").string();
    check(run({"initdb", "-D", primary, "-U", "idem", "--auth=trust", "-E", "UTF8", "--no-sync"}));
    start_server(primary, primary_port_);
    sql(primary_port_, "postgres", "CREATE DATABASE idem_test");
    sql(primary_port_, "postgres", "SELECT pg_create_physical_replication_slot('idem_standby')");
    check(run({"pg_basebackup", "-h", "127.0.0.1", "-p", std::to_string(primary_port_), "-U",
               "idem", "-D", standby, "-R", "-S", "idem_standby", "-X", "stream",
               "--checkpoint=fast", "--no-sync"}));
    start_server(standby, standby_port_);
    wait_for(primary_port_, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
             "1");
    if (synchronous_) {
      sql(primary_port_, "postgres", "ALTER SYSTEM SET synchronous_standby_names = '*'");
      sql(primary_port_, "postgres", "SELECT pg_reload_conf()");
      wait_for(primary_port_, "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
               "1");
    }
  }

  // The primary goes the way a crashed one does: every backend ends at once, nothing is flushed
  // to the standby beyond what was already sent.
  void kill_primary() {
    check(run({"pg_ctl", "-D", (dir_ / "primary").string(), "-m", "immediate", "-w", "stop"}));
  }

  // Promotes the standby and returns once it takes writes (pg_is_in_recovery() is false).
  void promote() {
    check(run({"pg_ctl", "-D", (dir_ / "standby").string(), "-W", "promote"}));
    wait_for(standby_port_, "SELECT pg_is_in_recovery()", "f");
  }

  std::string primary_url() const { return url(primary_port_); }
  std::string standby_url() const { return url(standby_port_); }
  // Both hosts, the primary first; libpq skips one that is down or read-only.
  std::string multi_host_url() const {
    return "postgresql://idem@127.0.0.1:" + std::to_string(primary_port_) +
           ",127.0.0.1:" + std::to_string(standby_port_) +
           "/idem_test?target_session_attrs=read-write";
  }

 private:
  struct Outcome {
    int status;
    std::string output;
  };

  static std::string url(int port) {
    return "postgresql://idem@127.0.0.1:" + std::to_string(port) + "/idem_test";
  }

  Outcome run(std::vector<std::string> args) const {
    std::vector<std::string> argv;
    if (::geteuid() == 0) argv = {"/usr/sbin/runuser", "-u", "postgres", "--"};
    args.front() = bin_ + "/" + args.front();
    argv.insert(argv.end(), args.begin(), args.end());
    ChildProcess child(argv);
    child.close_stdin();
    std::string output = child.read_all();
    return {child.wait(), std::move(output)};
  }

  static void check(const Outcome& outcome) {
    if (!WIFEXITED(outcome.status) || WEXITSTATUS(outcome.status) != 0) {
      throw std::runtime_error("a PostgreSQL command failed (" + std::to_string(outcome.status) +
                               "): " + outcome.output);
    }
  }

  void start_server(const std::string& data, int port) const {
    const Outcome started =
        run({"pg_ctl", "-D", data, "-l", data + ".log", "-w", "-t", "60", "-o",
             "-c listen_addresses=127.0.0.1 -p " + std::to_string(port) + " -k " + dir_.string() +
                 " -c fsync=off -c max_connections=60 -c hot_standby=on",
             "start"});
    if (!WIFEXITED(started.status) || WEXITSTATUS(started.status) != 0) {
      std::ifstream file(data + ".log");
      const std::string log((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
      throw std::runtime_error("pg_ctl start failed: " + started.output + log);
    }
  }

  static std::string sql(int port, const std::string& db, const std::string& statement) {
    auto conn = connect("postgresql://idem@127.0.0.1:" + std::to_string(port) + "/" + db);
    std::unique_ptr<PGresult, ResultCloser> result(PQexec(conn.get(), statement.c_str()));
    const ExecStatusType status = PQresultStatus(result.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
      throw std::runtime_error(statement + ": " + PQresultErrorMessage(result.get()));
    }
    if (PQntuples(result.get()) == 0 || PQnfields(result.get()) == 0) return "";
    return PQgetvalue(result.get(), 0, 0);
  }

  // Polls `query` on the server at `port` until it answers `expected` (60 s at most).
  static void wait_for(int port, const std::string& query, const std::string& expected) {
    std::string last;
    const bool reached = eventually([&] {
      try {
        last = sql(port, "postgres", query);
      } catch (const std::exception& e) {
        last = e.what();
      }
      return last == expected;
    });
    if (!reached) {
      throw std::runtime_error(query + " did not answer " + expected + " (last: " + last + ")");
    }
  }

  bool synchronous_;
  std::string bin_;
  int primary_port_;
  int standby_port_;
  std::filesystem::path dir_;
};

}  // namespace idem::test::pg
