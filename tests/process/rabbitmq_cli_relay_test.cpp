// `idem relay` while the broker is down, run as a process (IDEM_CLI) against a closed port: it
// backs off without a line per attempt (one when the broker goes down, a summary at
// --status-every, one when it gives up), and SIGINT or SIGTERM from its very start end it with
// its summary. Retry timing comes from --retry-delay/--retry-max and the number of attempts from
// --connect-attempts, so the assertions count lines, never time.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <vector>

#include "../free_port.hpp"
#include "../temp_dir.hpp"
#include "demo_cli.hpp"

namespace {

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
    ++n;
  return n;
}

class RelayWhileTheBrokerIsDown : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_CLI();
    broker_ =
        "amqp://guest:secret@127.0.0.1:" + std::to_string(idem::test::unused_loopback_port()) + "/";
  }

  // The relay's command line, output merged (stdout, then the stderr lines, as they come).
  std::vector<std::string> relay(std::vector<std::string> extra) const {
    std::vector<std::string> argv = {
        "/bin/sh", "-c",      "exec \"$0\" \"$@\" 2>&1",           IDEM_CLI,
        "relay",   "--store", "sqlite://" + dir_.file("relay.db"), "--broker",
        broker_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  idem::test::TempDir dir_;
  std::string broker_;
};

TEST_F(RelayWhileTheBrokerIsDown, OneLineWhenItGoesDownNotOnePerAttempt) {
  idem::test::ChildProcess child(
      relay({"--retry-delay", "1ms", "--retry-max", "2ms", "--connect-attempts", "40"}));
  child.close_stdin();
  const std::string output = child.read_all();
  const int status = child.wait();
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 3) << output;
  EXPECT_EQ(count(output, "\n"), 4u) << "down, the summary (2 lines), gave up:\n" << output;
  EXPECT_EQ(count(output, "idem relay: broker down, retrying: connection_refused: "), 1u) << output;
  EXPECT_NE(output.find("relay: 0 published, 0 refused, 0 parked, 0 failed passes\n"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("idem relay: gave up: broker down for "), std::string::npos) << output;
  EXPECT_NE(output.find(", 40 failed attempts, last: connection_refused: "), std::string::npos)
      << output;
  EXPECT_EQ(output.find("secret"), std::string::npos) << output;
}

TEST_F(RelayWhileTheBrokerIsDown, ASummaryAtEachStatusInterval) {
  // --status-every 0ms: every attempt after the first is past the interval, so each prints the
  // summary line (in production: once a minute).
  idem::test::ChildProcess child(relay({"--retry-delay", "1ms", "--retry-max", "1ms",
                                        "--connect-attempts", "5", "--status-every", "0ms"}));
  child.close_stdin();
  const std::string output = child.read_all();
  child.wait();
  EXPECT_EQ(count(output, "idem relay: broker down, retrying: "), 1u) << output;
  EXPECT_EQ(count(output, "idem relay: broker still down for "), 4u) << output;
}

TEST_F(RelayWhileTheBrokerIsDown, SigtermOrSigintEndsItWithItsSummary) {
  for (const int signal : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(signal == SIGTERM ? "SIGTERM" : "SIGINT");
    idem::test::ChildProcess child(relay({"--retry-delay", "10ms"}));
    child.close_stdin();
    // The first line is the outage: the relay is in its retry loop when the signal comes.
    const std::string first = child.read_line();
    ASSERT_EQ(first.rfind("idem relay: broker down, retrying: ", 0), 0u) << first;
    child.kill(signal);
    const std::string rest = child.read_all();
    const int status = child.wait();
    ASSERT_TRUE(WIFEXITED(status)) << "killed by the signal instead of stopping: " << rest;
    EXPECT_EQ(WEXITSTATUS(status), 0) << rest;
    EXPECT_NE(rest.find("relay: 0 published, 0 refused, 0 parked, 0 failed passes\n"
                        "outbox: 0 waiting, 0 parked\n"),
              std::string::npos)
        << rest;
    EXPECT_NE(rest.find(std::string("idem relay: stopped by ") +
                        (signal == SIGTERM ? "SIGTERM" : "SIGINT") +
                        " while the broker was down "
                        "for "),
              std::string::npos)
        << rest;
  }
}

}  // namespace
