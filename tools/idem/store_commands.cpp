#include "store_commands.hpp"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "command_support.hpp"
#include "exit_codes.hpp"
#include "idem/error.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/open.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/recorder.hpp"
#include "outbox_commands.hpp"
#include "progress.hpp"
#include "stats_format.hpp"

namespace idem::cli {
namespace {

// Purges expected to delete at least this many rows show a progress bar on stderr; smaller ones
// finish in one chunk of every backend anyway.
constexpr std::uint64_t kProgressThreshold = 1000;

// Bytes of a stored value shown by inspect.
constexpr std::size_t kPreviewBytes = 64;

// ---- stats ----------------------------------------------------------------------------------

struct StatsArgs {
  std::string url;
  bool json = false;
  std::string format;  // text, json or prometheus (stats_format.hpp); --json is --format json
};

int run_stats(const StatsArgs& args) {
  const std::optional<StatsFormat> format =
      parse_stats_format(args.format.empty() ? (args.json ? "json" : "text") : args.format);
  if (!format || (args.json && *format != StatsFormat::json)) {
    throw UsageError(
        !format ? "--format " + printable(args.format, 64) + ": expected text, json or prometheus"
                : std::string("--json and --format ") + args.format + " exclude each other");
  }
  Faces faces = open_faces(args.url, true, true, OpenOptions::Schema::look_only);
  std::optional<std::vector<ConsumerCounts>> consumers;
  std::optional<StoreCounts> records;
  if (faces.recorder) consumers = faces.recorder->consumer_counts();
  if (faces.store) records = faces.store->counts();
  std::optional<OutboxStats> outbox;  // the recorder database's outbox, when it has one
  if (faces.recorder) {
    if (auto box = outbox_of(args.url, /*look_only=*/true)) outbox = box->stats();
  }

  std::uint64_t processed = 0;
  std::uint64_t in_progress = 0;
  if (consumers) {
    for (const auto& c : *consumers) {
      processed += c.processed;
      in_progress += c.in_progress;
    }
  }
  if (*format == StatsFormat::prometheus) {
    std::cout << stats_prometheus({consumers, records, outbox}) << std::flush;
    return kOk;
  }
  if (*format == StatsFormat::json) {
    nlohmann::json out;
    out["url"] = redact_url(args.url);
    if (consumers) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& c : *consumers) {
        list.push_back(
            {{"consumer", c.consumer}, {"processed", c.processed}, {"in_progress", c.in_progress}});
      }
      out["recorder"] = {
          {"consumers", list}, {"processed", processed}, {"in_progress", in_progress}};
    } else {
      out["recorder"] = nullptr;
    }
    if (records) {
      out["store"] = {{"in_progress", records->in_progress},
                      {"abandoned", records->abandoned},
                      {"completed", records->completed},
                      {"expired", records->expired}};
    } else {
      out["store"] = nullptr;
    }
    if (outbox) {
      out["outbox"] = {
          {"depth", outbox->depth},
          {"parked", outbox->parked},
          {"oldest_age_ms", outbox->oldest_age ? nlohmann::json(outbox->oldest_age->count())
                                               : nlohmann::json(nullptr)}};
    } else {
      out["outbox"] = nullptr;
    }
    print_json(out);
    return kOk;
  }

  std::cout << "url: " << redact_url(args.url) << "\n";
  if (consumers) {
    std::size_t width = 8;  // "consumer"
    for (const auto& c : *consumers)
      width = std::max(width, columns(printable(c.consumer, 256)));
    std::printf("recorder: %llu markers, %llu live claims, %zu consumer%s\n",
                static_cast<unsigned long long>(processed),
                static_cast<unsigned long long>(in_progress), consumers->size(),
                consumers->size() == 1 ? "" : "s");
    if (!consumers->empty()) {
      std::printf("  %-*s %12s %12s\n", static_cast<int>(width), "consumer", "processed",
                  "in_progress");
      for (const auto& c : *consumers) {
        // printf pads by bytes; a UTF-8 name is padded by the characters it shows.
        const std::string name = printable(c.consumer, 256);
        std::printf("  %s%*s %12llu %12llu\n", name.c_str(),
                    static_cast<int>(width - columns(name)), "",
                    static_cast<unsigned long long>(c.processed),
                    static_cast<unsigned long long>(c.in_progress));
      }
    }
  } else {
    std::printf("recorder: none\n");
  }
  if (records) {
    std::printf("store: %llu records\n", static_cast<unsigned long long>(records->in_progress) +
                                             records->abandoned + records->completed +
                                             records->expired);
    std::printf("  %-12s %12llu\n", "in_progress",
                static_cast<unsigned long long>(records->in_progress));
    std::printf("  %-12s %12llu   (lease ended; the next claim takes over)\n", "abandoned",
                static_cast<unsigned long long>(records->abandoned));
    std::printf("  %-12s %12llu\n", "completed",
                static_cast<unsigned long long>(records->completed));
    std::printf("  %-12s %12llu   (awaiting purge)\n", "expired",
                static_cast<unsigned long long>(records->expired));
  } else {
    std::printf("store: none\n");
  }
  if (outbox) {
    std::printf("outbox: %llu waiting, %llu parked", static_cast<unsigned long long>(outbox->depth),
                static_cast<unsigned long long>(outbox->parked));
    if (outbox->oldest_age) {
      std::printf(", oldest %.3f s", static_cast<double>(outbox->oldest_age->count()) / 1000.0);
    }
    std::printf("\n");
  } else {
    std::printf("outbox: none\n");
  }
  std::fflush(stdout);
  return kOk;
}

// ---- purge ----------------------------------------------------------------------------------

struct PurgeArgs {
  std::string url;
  std::string older_than;
  bool store_only = false;
  bool recorder_only = false;
  bool dry_run = false;
  bool json = false;
};

// Stopped by SIGINT/SIGTERM between two chunks of a purge; `done` went before it.
struct PurgeStopped {
  std::size_t done = 0;
};

// Runs `purge` with a progress bar on stderr when `expected` is large. Between chunks it stops
// (PurgeStopped) when SIGINT or SIGTERM came.
std::size_t with_progress(const std::string& label, std::uint64_t expected,
                          const std::function<std::size_t(const PurgeProgress&)>& purge) {
  std::optional<ProgressBar> bar;
  if (expected >= kProgressThreshold) bar.emplace(label, expected, stderr);
  const std::size_t done = purge([&](std::size_t so_far) {
    if (bar) bar->update(static_cast<std::uint64_t>(so_far));
    if (StopSignals::requested()) throw PurgeStopped{so_far};
  });
  if (bar) bar->finish();
  return done;
}

// The markers a purge keeps because their time cannot be read, per consumer, on stdout.
void print_unreadable(const PurgeableMarkers& markers) {
  if (markers.unreadable == 0) return;
  std::printf("recorder: kept %llu marker%s whose time cannot be read (never purged):\n",
              static_cast<unsigned long long>(markers.unreadable),
              markers.unreadable == 1 ? "" : "s");
  std::size_t width = 8;
  for (const auto& c : markers.consumers)
    width = std::max(width, columns(printable(c.consumer, 256)));
  for (const auto& c : markers.consumers) {
    if (c.unreadable == 0) continue;
    const std::string name = printable(c.consumer, 256);
    std::printf("  %s%*s %12llu\n", name.c_str(), static_cast<int>(width - columns(name)), "",
                static_cast<unsigned long long>(c.unreadable));
  }
}

nlohmann::json consumers_json(const PurgeableMarkers& markers) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& c : markers.consumers) {
    list.push_back({{"consumer", c.consumer}, {"old", c.old}, {"unreadable", c.unreadable}});
  }
  return list;
}

int run_purge(const PurgeArgs& args) {
  if (args.store_only && args.recorder_only) {
    throw UsageError("--store-only and --recorder-only exclude each other");
  }
  const bool recorder_wanted = !args.store_only;
  const bool store_wanted = !args.recorder_only;
  std::optional<std::chrono::milliseconds> older_than;
  if (recorder_wanted) {
    if (args.older_than.empty()) {
      throw UsageError(
          "--older-than DURATION is required to purge markers (e.g. 7d, 12h); "
          "use --store-only to purge only expired store records");
    }
    older_than = parse_duration(args.older_than);
  } else if (!args.older_than.empty()) {
    older_than = parse_duration(args.older_than);  // checked even when unused: a typo is an error
  }
  const StopSignals signals;  // a purge stops between chunks, with what it did so far

  // Find the faces without creating anything, then open those that exist for writing.
  const Faces found =
      open_faces(args.url, recorder_wanted, store_wanted, OpenOptions::Schema::look_only);
  Faces faces = found;
  if (!args.dry_run) {
    faces = open_faces(args.url, found.recorder != nullptr, found.store != nullptr,
                       OpenOptions::Schema::keep);
  }
  const char* const verb = args.dry_run ? "would purge" : "purged";
  nlohmann::json out = {{"dry_run", args.dry_run}};
  int code = kOk;
  const auto stopped = [&](const char* what, std::size_t done) {
    std::fprintf(stderr, "idem purge: stopped by %s after purging %zu %s\n", StopSignals::name(),
                 done, what);
    code = StopSignals::exit_code();
    return done;
  };

  if (recorder_wanted) {
    if (!faces.recorder) {
      out["recorder"] = nullptr;
      if (!args.json) std::printf("recorder: none\n");
    } else {
      const PurgeableMarkers markers = faces.recorder->purgeable_markers(*older_than);
      std::size_t purged = markers.old;
      if (!args.dry_run) {
        try {
          purged = with_progress("purging markers", markers.old, [&](const PurgeProgress& p) {
            return faces.recorder->purge(*older_than, p);
          });
        } catch (const PurgeStopped& e) {
          purged = stopped("markers", e.done);
        }
      }
      out["recorder"] = {{"older_than", args.older_than},
                         {args.dry_run ? "would_purge" : "purged", purged},
                         {"unreadable", markers.unreadable},
                         {"consumers", consumers_json(markers)}};
      if (!args.json) {
        std::printf("recorder: %s %zu markers older than %s\n", verb, purged,
                    args.older_than.c_str());
        print_unreadable(markers);
      }
    }
  }
  if (store_wanted && code == kOk) {
    if (!faces.store) {
      out["store"] = nullptr;
      if (!args.json) std::printf("store: none\n");
    } else {
      const std::uint64_t expired = faces.store->counts().expired;
      std::size_t purged = static_cast<std::size_t>(expired);
      if (!args.dry_run) {
        try {
          purged = with_progress("purging expired records", expired, [&](const PurgeProgress& p) {
            return faces.store->purge_expired(p);
          });
        } catch (const PurgeStopped& e) {
          purged = stopped("expired records", e.done);
        }
      }
      out["store"] = {{args.dry_run ? "would_purge" : "purged", purged}};
      if (!args.json) std::printf("store: %s %zu expired records\n", verb, purged);
    }
  }
  if (args.json) print_json(out);
  std::fflush(stdout);
  return code;
}

// ---- inspect --------------------------------------------------------------------------------

struct InspectArgs {
  std::string url;
  std::string key;
  std::string consumer;
  std::string operation;
  std::string scope;
  bool json = false;
};

int inspect_marker(const InspectArgs& args) {
  Faces faces = open_faces(args.url, true, false, OpenOptions::Schema::look_only);
  if (!faces.recorder) {
    std::cerr << "idem inspect: not found: there is no recorder at " << redact_url(args.url)
              << "\n";
    return kNotFound;
  }
  const MarkerInspection seen = faces.recorder->inspect(args.consumer, args.key);
  if (!seen.processed && !seen.claim) {
    std::cerr << "idem inspect: not found: consumer '" << printable(args.consumer, 256)
              << "' has no marker and no claim for event '" << printable(args.key, 256) << "'\n";
    return kNotFound;
  }
  if (args.json) {
    nlohmann::json out = {
        {"consumer", args.consumer}, {"event_id", args.key}, {"processed", seen.processed}};
    out["processed_at"] =
        seen.processed_at ? nlohmann::json(iso_time(*seen.processed_at)) : nullptr;
    if (seen.claim) {
      out["claim"] = {{"token", seen.claim->token},
                      {"lease_until", iso_time(seen.claim->lease_until)},
                      {"live", seen.claim->live}};
    } else {
      out["claim"] = nullptr;
    }
    print_json(out);
    return kOk;
  }
  std::printf("consumer      %s\n", printable(args.consumer, 256).c_str());
  std::printf("event         %s\n", printable(args.key, 256).c_str());
  if (seen.processed) {
    std::printf("processed     yes%s\n", seen.processed_at
                                             ? (", at " + iso_time(*seen.processed_at)).c_str()
                                             : " (time unreadable)");
  } else {
    std::printf("processed     no\n");
  }
  if (seen.claim) {
    std::printf("claim         token %llu, lease until %s (%s)\n",
                static_cast<unsigned long long>(seen.claim->token),
                iso_time(seen.claim->lease_until).c_str(),
                seen.claim->live ? "live" : "lapsed: the next claim takes over");
  } else {
    std::printf("claim         none\n");
  }
  std::fflush(stdout);
  return kOk;
}

int inspect_record(const InspectArgs& args) {
  const std::string scope = scope_option(args.operation, args.scope);
  Faces faces = open_faces(args.url, false, true, OpenOptions::Schema::look_only);
  if (!faces.store) {
    std::cerr << "idem inspect: not found: there is no idempotency store at "
              << redact_url(args.url) << "\n";
    return kNotFound;
  }
  const std::string stored = scoped_idempotency_key(scope, args.key);
  const std::optional<IdempotencyRecord> record = faces.store->lookup(stored);
  if (!record) {
    std::cerr << "idem inspect: not found: no live record for key '" << printable(args.key, 256)
              << "'";
    if (!scope.empty()) {
      std::cerr << " of operation '" << printable(scope, 256) << "' (stored as '"
                << printable(stored, 256) << "'; never claimed, released, or expired)\n";
    } else {
      std::cerr << " (never claimed, released, or expired)"
                << scope_hint("inspect", args.url, args.key, scopes_holding(*faces.store, args.key))
                << "\n";
    }
    return kNotFound;
  }
  // The user's key and its scope, also when the scoped key itself was given.
  const auto split = split_scoped_idempotency_key(stored);
  const std::string user_key(split ? split->key : std::string_view(stored));
  const std::string record_scope(split ? split->scope : std::string_view());
  const bool completed = record->state == IdempotencyRecord::State::completed;
  const std::string bytes = record->value.bytes.value_or("");
  const bool has_bytes = record->value.bytes.has_value();
  if (args.json) {
    nlohmann::json out = {{"key", user_key},
                          {"scope", split ? nlohmann::json(record_scope) : nullptr},
                          {"stored_key", stored},
                          {"state", std::string(to_string(record->state))},
                          {"token", record->token}};
    out["fingerprint"] = record->fingerprint ? nlohmann::json(*record->fingerprint) : nullptr;
    if (completed) {
      out["completed_at"] = iso_time(record->completed_at);
      out["expires_at"] = iso_time(record->expires_at);
      out["value_size"] = has_bytes ? nlohmann::json(bytes.size()) : nullptr;
      out["value_preview"] = has_bytes ? nlohmann::json(printable(bytes, kPreviewBytes)) : nullptr;
      out["report"] = record->report ? nlohmann::json::parse(record->report->to_json()) : nullptr;
    } else {
      out["lease_until"] = iso_time(record->lease_until);
    }
    print_json(out);
    return kOk;
  }
  std::printf("key           %s\n", printable(user_key, 256).c_str());
  if (split) {
    std::printf("scope         %s\n", printable(record_scope, 256).c_str());
    std::printf("stored as     %s\n", printable(stored, 256).c_str());
  }
  std::printf("state         %s\n", std::string(to_string(record->state)).c_str());
  std::printf("token         %llu\n", static_cast<unsigned long long>(record->token));
  std::printf("fingerprint   %s\n",
              record->fingerprint ? printable(*record->fingerprint, 256).c_str() : "(none)");
  if (!completed) {
    std::printf("lease until   %s\n", iso_time(record->lease_until).c_str());
  } else {
    std::printf("completed at  %s\n", iso_time(record->completed_at).c_str());
    std::printf("expires at    %s\n", iso_time(record->expires_at).c_str());
    if (has_bytes) {
      std::printf("value         %zu bytes: %s\n", bytes.size(),
                  printable(bytes, kPreviewBytes).c_str());
    } else {
      std::printf("value         (an in-process object, no bytes)\n");
    }
    if (record->report) {
      std::printf("report        %s\n",
                  nlohmann::json::parse(record->report->to_json()).dump(2).c_str());
    } else {
      std::printf("report        (none)\n");
    }
  }
  std::fflush(stdout);
  return kOk;
}

int run_inspect(const InspectArgs& args) {
  if (args.key.empty()) throw UsageError("KEY is required (idem inspect URL KEY)");
  if (!args.consumer.empty() && (!args.operation.empty() || !args.scope.empty())) {
    throw UsageError("--consumer (an event's marker) excludes --operation and --scope (a record)");
  }
  return args.consumer.empty() ? inspect_record(args) : inspect_marker(args);
}

}  // namespace

void add_store_commands(CLI::App& app) {
  // Shared by the callbacks: CLI11 fills them while parsing, the callback reads them after.
  auto stats = std::make_shared<StatsArgs>();
  auto* stats_cmd = add_url_command(
      app, "stats",
      "Counts in a recorder (markers and live claims per consumer) and a store (records by "
      "state) at URL",
      stats->url, [stats] { return run_stats(*stats); });
  stats_cmd->add_flag("--json", stats->json, "Print JSON (--format json)");
  stats_cmd->add_option("--format", stats->format, "text (default), json or prometheus");

  auto purge = std::make_shared<PurgeArgs>();
  auto* purge_cmd = add_url_command(
      app, "purge", "Delete markers older than a duration and expired store records at URL",
      purge->url, [purge] { return run_purge(*purge); });
  purge_cmd->add_option("--older-than", purge->older_than,
                        "Purge markers older than this (500ms, 30s, 15m, 12h, 7d)");
  purge_cmd->add_flag("--store-only", purge->store_only, "Only expired store records");
  purge_cmd->add_flag("--recorder-only", purge->recorder_only, "Only old markers");
  purge_cmd->add_flag("--dry-run", purge->dry_run, "Count what would go, delete nothing");
  purge_cmd->add_flag("--json", purge->json, "Print the totals as JSON");

  auto inspect = std::make_shared<InspectArgs>();
  auto* inspect_cmd = add_url_command(
      app, "inspect",
      "Show the store record of KEY, or with --consumer the marker and claim of event KEY",
      inspect->url, [inspect] { return run_inspect(*inspect); });
  inspect_cmd->add_option("key", inspect->key, "Idempotency key (or event id with --consumer)");
  inspect_cmd->add_option("--operation", inspect->operation,
                          "KEY is this operation's key (its name: the records' scope)");
  inspect_cmd->add_option("--scope", inspect->scope,
                          "KEY is a key of this idempotency_scope (operations that set one)");
  inspect_cmd->add_option("--consumer", inspect->consumer, "Inspect this consumer's marker");
  inspect_cmd->add_flag("--json", inspect->json, "Print JSON");
}

}  // namespace idem::cli
