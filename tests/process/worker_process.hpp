// What the process tests do with the worker processes they start (worker/child_process.hpp runs
// them): run one to its end and take its summary line, start several that race each other, kill
// one with SIGKILL, count the side effects the workers left in their effects files, and the
// delivery plan of the multi-process tests (many items, a share of them delivered to several
// workers at the same place in every list, so the copies race for the claim).
//
// Summary line: the first line a worker prints to stdout (its counts, e.g.
// "processed=N duplicate=M redelivered=K").
//
// Thread-safety: for a test's main thread.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../temp_dir.hpp"
#include "idem/event.hpp"
#include "worker/child_process.hpp"

namespace idem::test {

inline bool killed_by_sigkill(int status) {
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

// Kills `child` with SIGKILL and expects that to be how it ended.
inline void kill_and_reap(ChildProcess& child) {
  child.kill(SIGKILL);
  const int status = child.wait();
  EXPECT_TRUE(killed_by_sigkill(status)) << "status " << status;
}

// The first line of `output`.
inline std::string first_line(const std::string& output) {
  return output.substr(0, output.find('\n'));
}

// Reads what `child` prints until it exits, expects exit status 0, returns its summary line.
inline std::string summary_at_exit(ChildProcess& child) {
  const std::string output = child.read_all();
  const int status = child.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "worker " << child.pid() << " ended with status " << status;
  return first_line(output);
}

// Runs a worker to its end, its stdin closed; returns its summary line.
inline std::string run_to_end(std::vector<std::string> argv) {
  ChildProcess child(std::move(argv));
  child.close_stdin();
  return summary_at_exit(child);
}

// Starts one worker per command line (each given --wait-go), then releases them all at once so
// they race each other; returns their summary lines in the same order.
inline std::vector<std::string> run_together(const std::vector<std::vector<std::string>>& argvs) {
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (const auto& argv : argvs)
    workers.push_back(std::make_unique<ChildProcess>(argv));
  for (auto& worker : workers)
    worker->write_stdin("g");
  std::vector<std::string> summaries;
  for (auto& worker : workers)
    summaries.push_back(summary_at_exit(*worker));
  return summaries;
}

// Counts by name, from summary lines "name=N name=N ...".
using Counts = std::map<std::string, long>;

// The sum over `lines` of each count. A line that does not hold exactly `names`, in that order,
// each with a number, is a test failure.
inline Counts sum_counts(const std::vector<std::string>& lines,
                         const std::vector<std::string>& names) {
  Counts total;
  for (const auto& name : names)
    total[name] = 0;
  for (const auto& line : lines) {
    std::istringstream in(line);
    std::size_t matched = 0;
    for (std::string field; matched < names.size() && in >> field; ++matched) {
      const std::string prefix = names[matched] + "=";
      if (field.rfind(prefix, 0) != 0 || field.size() == prefix.size() ||
          field.find_first_not_of("0123456789", prefix.size()) != std::string::npos) {
        break;
      }
      total[names[matched]] += std::stol(field.substr(prefix.size()));
    }
    std::string rest;
    if (matched != names.size() || in >> rest) {
      ADD_FAILURE() << "unexpected worker output: '" << line << "'";
    }
  }
  return total;
}

// Writes `lines` to `path`, one a line (a worker's list of events or keys); returns `path`.
inline std::string write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path);
  for (const auto& line : lines)
    out << line << "\n";
  return path;
}

// One file per worker in `dir`: "<stem>-<w>.txt" for w = 0 .. workers-1.
inline std::vector<std::string> per_worker_files(const TempDir& dir, const std::string& stem,
                                                 int workers) {
  std::vector<std::string> files;
  for (int w = 0; w < workers; ++w)
    files.push_back(dir.file(stem + "-" + std::to_string(w) + ".txt"));
  return files;
}

// How many lines of `path` are exactly `wanted`.
inline int count_lines(const std::string& path, const std::string& wanted) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);)
    n += line == wanted ? 1 : 0;
  return n;
}

// How often each line stands in `paths` (effects files: one line per side effect run).
inline std::map<std::string, int> count_runs(const std::vector<std::string>& paths) {
  std::map<std::string, int> runs;
  for (const auto& path : paths) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);)
      ++runs[line];
  }
  return runs;
}

// Every item ran exactly once, and nothing else ran (the first five failures are named).
inline void expect_each_once(const std::map<std::string, int>& runs,
                             const std::vector<std::string>& items) {
  EXPECT_EQ(runs.size(), items.size());
  int wrong = 0;
  for (const auto& item : items) {
    const auto it = runs.find(item);
    const int n = it == runs.end() ? 0 : it->second;
    if (n != 1 && ++wrong <= 5) ADD_FAILURE() << item << " ran " << n << " times";
  }
  EXPECT_EQ(wrong, 0);
}

// What each worker of a multi-process test is delivered. Every item goes to one worker; a
// `duplicated_share` of them also to 1 to workers-1 others, at the same global position in each
// list that gets it, so the copies of one item arrive at about the same time in different
// processes (real races for the claim, not just late duplicates).
struct DeliveryPlan {
  std::vector<std::string> items;               // every item (event id or key), once
  std::vector<std::vector<std::string>> lists;  // what each worker gets, in order
  std::size_t deliveries = 0;                   // the lists' total length
  std::size_t duplicated = 0;                   // items delivered more than once
};

// The multi-process tests' plan: 4 workers, 10,000 items, 35% of them delivered more than once.
inline constexpr int kPlanWorkers = 4;
inline constexpr int kPlanItems = 10'000;
inline constexpr double kPlanDuplicatedShare = 0.35;

// Deterministic (fixed `seed`) apart from the ids, so a failure can be replayed. Items are
// `prefix` + a fresh event id.
inline DeliveryPlan make_delivery_plan(std::uint32_t seed, const std::string& prefix = "",
                                       int workers = kPlanWorkers, int items = kPlanItems,
                                       double duplicated_share = kPlanDuplicatedShare) {
  DeliveryPlan plan;
  std::mt19937 random(seed);
  std::uniform_real_distribution<double> share(0.0, 1.0);
  std::uniform_int_distribution<int> extra_copies(1, workers - 1);
  plan.lists.resize(static_cast<std::size_t>(workers));
  std::vector<std::size_t> order(static_cast<std::size_t>(workers));
  for (int i = 0; i < items; ++i) {
    const std::string item = prefix + idem::new_event_id();
    plan.items.push_back(item);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin(), order.end(), random);
    int copies = 1;
    if (share(random) < duplicated_share) {
      copies += extra_copies(random);
      ++plan.duplicated;
    }
    for (int c = 0; c < copies; ++c) {
      plan.lists[order[static_cast<std::size_t>(c)]].push_back(item);
      ++plan.deliveries;
    }
  }
  return plan;
}

// The consumers' summaries ("processed=N duplicate=M redelivered=K") add up: every item was
// processed once, and every delivery ended processed or duplicate. Prints how often a copy met
// another process mid-run (AlreadyInProgress, redelivered): proof that the copies raced, not
// just arrived late.
inline void expect_consumer_totals(const std::vector<std::string>& summaries,
                                   const DeliveryPlan& plan) {
  const Counts total = sum_counts(summaries, {"processed", "duplicate", "redelivered"});
  EXPECT_EQ(total.at("processed"), static_cast<long>(plan.items.size()))
      << "handlers that reported running";
  EXPECT_EQ(total.at("processed") + total.at("duplicate"), static_cast<long>(plan.deliveries))
      << "every delivery ends processed or duplicate";
  std::printf("deliveries=%zu processed=%ld duplicate=%ld redelivered=%ld\n", plan.deliveries,
              total.at("processed"), total.at("duplicate"), total.at("redelivered"));
}

}  // namespace idem::test
