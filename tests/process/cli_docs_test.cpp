// docs/cli.md shows what `idem` prints; this test keeps it true. Every sample in a ```console
// block whose command ends with `; echo "exit $?"` (the messages and exit codes, which need no
// data) is run through bash with this build's idem first on PATH, and its output must be the
// sample's lines exactly. A sample for a backend this build lacks is skipped.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../temp_dir.hpp"
#include "demo_cli.hpp"

namespace {

namespace fs = std::filesystem;

struct Sample {
  std::string command;  // after "$ "
  std::string output;   // the lines after it, each with its '\n'
  int line = 0;         // of the command in docs/cli.md
};

// The samples of every ```console block: a "$ " line and the lines up to the next one or the
// block's end.
std::vector<Sample> console_samples(std::istream& markdown) {
  std::vector<Sample> samples;
  bool in_console = false;
  std::string text;
  for (int number = 1; std::getline(markdown, text); ++number) {
    if (text.rfind("```", 0) == 0) {
      in_console = !in_console && text == "```console";
      continue;
    }
    if (!in_console) continue;
    if (text.rfind("$ ", 0) == 0) {
      samples.push_back({text.substr(2), "", number});
    } else if (!samples.empty()) {
      samples.back().output += text + "\n";
    }
  }
  return samples;
}

std::string trim_blank_lines(std::string text) {
  while (text.size() >= 2 && text.compare(text.size() - 2, 2, "\n\n") == 0)
    text.pop_back();
  return text;
}

TEST(CliDocs, EveryMessageSampleIsWhatTheBinaryPrints) {
  IDEM_REQUIRE_CLI();
  const fs::path docs = IDEM_DOCS_DIR;
  std::ifstream markdown(docs / "cli.md");
  ASSERT_TRUE(markdown) << "cannot read " << (docs / "cli.md");
  const std::string version_line = idem::test::run_cli({"--version"}).output;
  const idem::test::TempDir dir;
  int checked = 0;
  for (const Sample& sample : console_samples(markdown)) {
    if (!sample.command.ends_with("; echo \"exit $?\"")) continue;
    // A sample of a backend this build lacks cannot print what the docs show.
    bool available = true;
    for (const auto& [scheme, part] : {std::pair{"sqlite:", "sqlite"},
                                       {"redis", "redis"},
                                       {"postgres", "postgres"},
                                       {"amqp", "rabbitmq"}}) {
      if (sample.command.find(scheme) != std::string::npos &&
          version_line.find(part) == std::string::npos) {
        available = false;
      }
    }
    if (!available) continue;
    const std::string script = "PATH='" + fs::path(IDEM_CLI).parent_path().string() +
                               "':\"$PATH\"; cd '" + dir.path().string() + "'; { " +
                               sample.command + " ; } 2>&1";
    idem::test::ChildProcess child({"/bin/bash", "-c", script});
    child.close_stdin();
    const std::string printed = child.read_all();
    child.wait();
    EXPECT_EQ(printed, trim_blank_lines(sample.output))
        << "docs/cli.md:" << sample.line << ": $ " << sample.command;
    ++checked;
  }
  EXPECT_GE(checked, 5) << "docs/cli.md lost its message samples";
}

}  // namespace
