// The `idem` command line itself, run as a process (IDEM_CLI): every usage error exits with 2 and
// one line that names the command and where its help is (CLI11's own exit codes, 104-114, never
// leak), --version, and error lines that carry their prefix once.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "demo_cli.hpp"

namespace {

using idem::test::CliRun;
using idem::test::has;
using idem::test::run_cli;

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
    ++n;
  return n;
}

// A usage error: exit code 2, exactly one line, starting with `prefix`, pointing at --help.
void expect_usage_error(const std::vector<std::string>& arguments, const std::string& prefix,
                        const std::string& mentions) {
  const CliRun run = run_cli(arguments);
  std::string shown;
  for (const auto& a : arguments)
    shown += " " + a;
  EXPECT_EQ(run.exit_code, 2) << "idem" << shown << ":\n" << run.output;
  EXPECT_EQ(count(run.output, "\n"), 1u) << "idem" << shown << ": one line, got:\n" << run.output;
  EXPECT_EQ(run.output.rfind(prefix, 0), 0u) << "idem" << shown << ":\n" << run.output;
  EXPECT_NE(run.output.find("--help"), std::string::npos) << "idem" << shown << ":\n" << run.output;
  EXPECT_NE(run.output.find(mentions), std::string::npos) << "idem" << shown << ":\n" << run.output;
}

TEST(Cli, NoCommandIsAUsageError) {
  IDEM_REQUIRE_CLI();
  expect_usage_error({}, "idem: ", "a command is required");
}

TEST(Cli, AnUnknownCommandIsAUsageError) {
  IDEM_REQUIRE_CLI();
  expect_usage_error({"frobnicate"}, "idem: unknown command 'frobnicate'", "frobnicate");
}

TEST(Cli, AnUnknownOptionIsAUsageError) {
  IDEM_REQUIRE_CLI();
  expect_usage_error({"--bogus"}, "idem: ", "--bogus");
  expect_usage_error({"demo", "--bogus"}, "idem demo: ", "--bogus");
}

TEST(Cli, AMissingOptionValueIsAUsageError) {
  IDEM_REQUIRE_CLI();
  expect_usage_error({"demo", "--events"}, "idem demo: ", "--events");
  expect_usage_error({"demo", "--mode"}, "idem demo: ", "--mode");
}

TEST(Cli, AMalformedValueIsAUsageError) {
  IDEM_REQUIRE_CLI();
  expect_usage_error({"demo", "--events", "many"}, "idem demo: ", "many");
  expect_usage_error({"demo", "--events", "0"}, "idem demo: ", "--events");
  expect_usage_error({"demo", "--mode", "sometimes"}, "idem demo: ", "sometimes");
  expect_usage_error({"demo", "--kill-at", "2"}, "idem demo: ", "--kill-at");
  for (const char* hops : {"0", "3", "x", "-1"})
    expect_usage_error({"demo", "--hops", hops}, "idem demo: ", "--hops");
  expect_usage_error({"demo", "--hops"}, "idem demo: ", "--hops");
}

// CLI11's own texts are put in idem's words: the value quoted, ranges as the user writes them,
// no type strings.
TEST(Cli, ParseErrorsSpeakIdem) {
  IDEM_REQUIRE_CLI();
  expect_usage_error({"demo", "--events", "many"},
                     "idem demo: ", "--events: 'many' is not a number (expected 1 to 10000000)");
  expect_usage_error({"demo", "--kill-at", "1"},
                     "idem demo: ", "--kill-at: 1 is out of range (expected 0.01 to 0.99)");
  expect_usage_error({"demo", "--mode", "sometimes"}, "idem demo: ",
                     "--mode: 'sometimes' is not transactional, exclusive or check_then_mark");
  expect_usage_error({"demo", "--events"}, "idem demo: ", "--events: a value is required");
  expect_usage_error({"demo", "--seed", "abc"}, "idem demo: ", "--seed: 'abc' is not a number");
  expect_usage_error({"demo", "extra"}, "idem demo: ", "unexpected argument 'extra'");
  expect_usage_error({"demo", "--bogus"}, "idem demo: ", "unknown option '--bogus'");
  for (const char* noise : {"Value ", "UINT", "INT in", "not expected", "Could not convert"}) {
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"demo", "--events", "many"},
          std::vector<std::string>{"demo", "--events"}, std::vector<std::string>{"demo", "x"},
          std::vector<std::string>{"demo", "--seed", "abc"}}) {
      EXPECT_FALSE(has(run_cli(args), noise)) << noise;
    }
  }
}

// --hops 2 needs transactional mode (the follow-ups are outbox rows of the marker's
// transaction): refused with exit 2 and one line before anything starts.
TEST(Cli, TwoHopsNeedTransactionalMode) {
  IDEM_REQUIRE_CLI();
  for (const char* mode : {"exclusive", "check_then_mark"}) {
    const CliRun run = run_cli({"demo", "--hops", "2", "--mode", mode});
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_EQ(count(run.output, "\n"), 1u) << run.output;
    EXPECT_EQ(
        run.output.rfind("idem demo: invalid_argument: --hops 2 needs --mode transactional", 0), 0u)
        << run.output;
  }
}

TEST(Cli, DemoHelpDocumentsHops) {
  IDEM_REQUIRE_CLI();
  const CliRun run = run_cli({"demo", "--help"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("--hops"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("outbox"), std::string::npos) << run.output;
}

TEST(Cli, VersionPrintsTheVersionAndExitsZero) {
  IDEM_REQUIRE_CLI();
  const CliRun run = run_cli({"--version"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.rfind(std::string("idem ") + IDEM_TEST_VERSION + "\nfaces: blocking", 0), 0u)
      << run.output;
  EXPECT_NE(run.output.find("\nbackends: memory"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("\ntransports: "), std::string::npos) << run.output;
  EXPECT_EQ(run_cli({"-v"}).output, run.output) << "-v is --version";
}

// The help names `idem`, shows a required URL as required and no CLI11 type strings; an unknown
// command is an error even with --help after it; `idem help` and `idem help COMMAND` work.
TEST(Cli, HelpSpeaksIdem) {
  IDEM_REQUIRE_CLI();
  const CliRun stats = run_cli({"stats", "--help"});
  EXPECT_EQ(stats.exit_code, 0) << stats.output;
  EXPECT_NE(stats.output.find("Usage: idem stats [OPTIONS] URL\n"), std::string::npos)
      << stats.output;
  EXPECT_EQ(run_cli({"help", "stats"}).output, stats.output);
  const CliRun demo = run_cli({"help", "demo"});
  EXPECT_EQ(demo.exit_code, 0) << demo.output;
  for (const char* noise : {"UINT", "INT:", "FLOAT", "in [", "TEXT:"})
    EXPECT_EQ(demo.output.find(noise), std::string::npos) << noise << " in:\n" << demo.output;
  EXPECT_NE(demo.output.find("(0.01 to 0.99)"), std::string::npos) << demo.output;
  const CliRun main_help = run_cli({"help"});
  EXPECT_EQ(main_help.exit_code, 0) << main_help.output;
  EXPECT_EQ(main_help.output, run_cli({"--help"}).output);
  expect_usage_error({"frobnicate", "--help"}, "idem: unknown command 'frobnicate'", "frobnicate");
  expect_usage_error({"help", "frobnicate"}, "idem: unknown command 'frobnicate'", "frobnicate");
}

TEST(Cli, HelpExitsZero) {
  IDEM_REQUIRE_CLI();
  const CliRun run = run_cli({"--help"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("demo"), std::string::npos) << run.output;
  EXPECT_EQ(run_cli({"purge", "--help"}).exit_code, 0);
}

TEST(Cli, AStoreErrorCarriesItsPrefixOnce) {
  IDEM_REQUIRE_CLI();
  // The directory does not exist: SQLite cannot open the file, and idem adds which part is wrong.
  const CliRun run = run_cli({"stats", "sqlite:///nonexistent-dir/sub/x.db"});
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_EQ(count(run.output, "\n"), 1u) << run.output;
  EXPECT_EQ(run.output.rfind("idem stats: store_open_failed: ", 0), 0u) << run.output;
  EXPECT_EQ(count(run.output, "store_open_failed"), 1u) << run.output;
  EXPECT_EQ(count(run.output, "idem"), 1u) << run.output;
  EXPECT_NE(run.output.find("does not exist"), std::string::npos) << run.output;
}

TEST(Cli, AConfigurationErrorCarriesItsPrefixOnce) {
  IDEM_REQUIRE_CLI();
  const CliRun run = run_cli({"stats", "nosuch://x"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_EQ(run.output.rfind("idem stats: config_error: ", 0), 0u) << run.output;
  EXPECT_EQ(count(run.output, "config_error"), 1u) << run.output;
}

}  // namespace
