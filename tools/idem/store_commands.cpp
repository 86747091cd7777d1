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

#include "exit_codes.hpp"
#include "idem/error.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/open.hpp"
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

// A usage error found by a command itself (CLI11 is told nothing is required, so that every
// usage error exits with 2 and one clear message).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The password of `url`'s user info ("scheme://user:PASSWORD@host"), if any, so that it can
// be masked in messages that a backend built from the URL (redact_url covers the URL itself).
std::string url_password(std::string_view url) {
  const std::size_t authority = url.find("://");
  if (authority == std::string_view::npos) return {};
  const std::size_t start = authority + 3;
  const std::size_t end = url.find_first_of("/?#", start);
  const std::string_view host_part =
      url.substr(start, end == std::string_view::npos ? url.npos : end - start);
  const std::size_t at = host_part.rfind('@');
  if (at == std::string_view::npos) return {};
  const std::string_view user_info = host_part.substr(0, at);
  const std::size_t colon = user_info.find(':');
  if (colon == std::string_view::npos) return {};
  return std::string(user_info.substr(colon + 1));
}

std::string masked(std::string message, const std::string& password) {
  if (password.empty()) return message;
  for (std::size_t at = message.find(password); at != std::string::npos;
       at = message.find(password, at + 3)) {
    message.replace(at, password.size(), "***");
  }
  return message;
}

std::string lower_scheme(std::string_view url) {
  std::string scheme(url.substr(0, url.find(':')));
  for (char& c : scheme) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return scheme;
}

// `url` with `name=value` added to its query, unless the user set `name` already.
std::string with_parameter(const std::string& url, std::string_view name, std::string_view value) {
  const std::size_t query = url.find('?');
  if (query != std::string::npos) {
    const std::string_view q = std::string_view(url).substr(query + 1);
    const std::string prefix = std::string(name) + "=";
    if (q.substr(0, prefix.size()) == prefix || q.find("&" + prefix) != std::string_view::npos) {
      return url;
    }
  }
  return url + (query == std::string::npos ? "?" : "&") + std::string(name) + "=" +
         std::string(value);
}

// The URL to look at a database without changing it: SQLite read-only (no tables created),
// PostgreSQL without creating the schema. Other backends create nothing when opened.
std::string look_only_url(const std::string& url) {
  const std::string scheme = lower_scheme(url);
  if (scheme == "sqlite") return with_parameter(url, "read_only", "true");
  if (scheme == "postgresql" || scheme == "postgres") {
    return with_parameter(url, "create_schema", "false");
  }
  return url;
}

// The URL to write to a database as it is: SQLite without creating tables or switching the
// journal mode (a file only infinity_bus has used keeps its rollback journal and gets no idem
// tables). Other backends: `url` (purge opens only the faces whose tables exist).
std::string as_is_url(const std::string& url) {
  if (lower_scheme(url) == "sqlite") return with_parameter(url, "create_schema", "false");
  return url;
}

// True for the errors that mean "this face has no tables here" when opened look-only: a SQLite
// file opened read-only without them (store_read_only), a PostgreSQL schema without them
// (create_schema=false; the backend reports it as a plain, non-retryable StoreError).
bool means_absent(const Error& e) {
  if (e.code() == ErrorCode::store_read_only) return true;
  return e.code() == ErrorCode::store_error && !e.retryable() && !e.in_doubt() &&
         std::string_view(e.what()).find(" do not exist ") != std::string_view::npos;
}

// The recorder and the store at one URL; a face whose tables do not exist is null, with why.
struct Faces {
  std::shared_ptr<IdempotencyRecorder> recorder;
  std::string recorder_absent;
  std::shared_ptr<IdempotencyStore> store;
  std::string store_absent;
};

Faces open_faces(const std::string& url, bool want_recorder, bool want_store, bool look_only) {
  Faces faces;
  const std::string target = look_only ? look_only_url(url) : as_is_url(url);
  if (want_recorder) {
    try {
      faces.recorder = open_recorder(target);
    } catch (const StoreError& e) {
      if (!means_absent(e)) throw;
      faces.recorder_absent = e.what();
    }
  }
  if (want_store) {
    try {
      faces.store = open_store(target);
    } catch (const StoreError& e) {
      if (!means_absent(e)) throw;
      faces.store_absent = e.what();
    }
  }
  return faces;
}

std::string iso_time(WallTime t) {
  using namespace std::chrono;
  const auto ms = floor<milliseconds>(t.time_since_epoch());
  const auto day = floor<days>(ms);
  const year_month_day ymd{sys_days(day)};
  const hh_mm_ss<milliseconds> time{ms - day};
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, "%04d-%02u-%02uT%02d:%02d:%02d.%03lldZ",
                static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()), static_cast<int>(time.hours().count()),
                static_cast<int>(time.minutes().count()), static_cast<int>(time.seconds().count()),
                static_cast<long long>(time.subseconds().count()));
  return buffer;
}

// The length of the well-formed UTF-8 sequence at the start of `bytes` (RFC 3629: no overlong
// forms, no surrogates, nothing past U+10FFFF), or 0 when it is not one.
std::size_t utf8_sequence_length(std::string_view bytes) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const unsigned char lead = byte(0);
  std::size_t length = 0;
  unsigned char low = 0x80;   // the range of the second byte, narrowed for the lead bytes
  unsigned char high = 0xbf;  // that would otherwise allow overlong forms or surrogates
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (bytes.size() < length) return 0;
  if (byte(1) < low || byte(1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xbf) return 0;
  }
  // C1 control characters (U+0080..U+009F) move a terminal's cursor as C0 ones do.
  if (length == 2 && lead == 0xc2 && byte(1) < 0xa0) return 0;
  return length;
}

// Bytes as text safe for a terminal: printable ASCII and well-formed UTF-8 (a consumer name in
// any script) as they are; control characters, a backslash and bytes that are not UTF-8 as
// \xNN. Cut after `limit` bytes, never inside a character, with "...".
std::string printable(std::string_view bytes, std::size_t limit) {
  std::string out;
  std::size_t i = 0;
  while (i < bytes.size() && i < limit) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    const std::size_t length = c >= 0x80 ? utf8_sequence_length(bytes.substr(i)) : 0;
    if (length > 0) {
      if (i + length > limit) break;
      out.append(bytes.substr(i, length));
      i += length;
      continue;
    }
    char escaped[8];
    std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
    out += escaped;
    ++i;
  }
  if (i < bytes.size()) out += "...";
  return out;
}

// The characters `text` shows (its UTF-8 lead bytes): the columns it takes in a terminal, for
// every script whose characters are one column wide.
std::size_t columns(std::string_view text) {
  std::size_t n = 0;
  for (const char c : text)
    n += (static_cast<unsigned char>(c) & 0xc0) != 0x80 ? 1 : 0;
  return n;
}

// JSON on stdout. Names and keys are bytes, not always UTF-8: a byte that is not UTF-8 is
// printed as U+FFFD instead of failing the command.
void print_json(const nlohmann::json& value) {
  std::cout << value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

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
  Faces faces = open_faces(args.url, true, true, /*look_only=*/true);
  std::optional<std::vector<ConsumerCounts>> consumers;
  std::optional<StoreCounts> records;
  if (faces.recorder) consumers = faces.recorder->consumer_counts();
  if (faces.store) records = faces.store->counts();
  std::optional<OutboxStats> outbox;  // the recorder database's outbox, when it has one
  if (faces.recorder) {
    if (auto box = outbox_of(faces.recorder, /*look_only=*/true)) outbox = box->stats();
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
    std::printf("store: %llu records\n",
                static_cast<unsigned long long>(records->in_progress + records->abandoned +
                                                records->completed + records->expired));
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
};

// Runs `purge` with a progress bar on stderr when `expected` is large.
std::size_t with_progress(const std::string& label, std::uint64_t expected,
                          const std::function<std::size_t(const PurgeProgress&)>& purge) {
  if (expected < kProgressThreshold) return purge(PurgeProgress{});
  ProgressBar bar(label, expected, stderr);
  const std::size_t done =
      purge([&](std::size_t so_far) { bar.update(static_cast<std::uint64_t>(so_far)); });
  bar.finish();
  return done;
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

  // Find the faces without creating anything, then open those that exist for writing.
  const Faces found = open_faces(args.url, recorder_wanted, store_wanted, /*look_only=*/true);
  Faces faces = found;
  if (!args.dry_run) {
    faces = open_faces(args.url, found.recorder != nullptr, found.store != nullptr,
                       /*look_only=*/false);
  }

  if (recorder_wanted) {
    if (!faces.recorder) {
      std::printf("recorder: none\n");
    } else {
      const std::size_t old = faces.recorder->count_purgeable(*older_than);
      if (args.dry_run) {
        std::printf("recorder: would purge %zu markers older than %s\n", old,
                    args.older_than.c_str());
      } else {
        const std::size_t purged =
            with_progress("purging markers", old, [&](const PurgeProgress& progress) {
              return faces.recorder->purge(*older_than, progress);
            });
        std::printf("recorder: purged %zu markers older than %s\n", purged,
                    args.older_than.c_str());
      }
    }
  }
  if (store_wanted) {
    if (!faces.store) {
      std::printf("store: none\n");
    } else {
      const std::uint64_t expired = faces.store->counts().expired;
      if (args.dry_run) {
        std::printf("store: would purge %llu expired records\n",
                    static_cast<unsigned long long>(expired));
      } else {
        const std::size_t purged = with_progress(
            "purging expired records", expired,
            [&](const PurgeProgress& progress) { return faces.store->purge_expired(progress); });
        std::printf("store: purged %zu expired records\n", purged);
      }
    }
  }
  std::fflush(stdout);
  return kOk;
}

// ---- inspect --------------------------------------------------------------------------------

struct InspectArgs {
  std::string url;
  std::string key;
  std::string consumer;
  bool json = false;
};

int inspect_marker(const InspectArgs& args) {
  Faces faces = open_faces(args.url, true, false, /*look_only=*/true);
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
  Faces faces = open_faces(args.url, false, true, /*look_only=*/true);
  if (!faces.store) {
    std::cerr << "idem inspect: not found: there is no idempotency store at "
              << redact_url(args.url) << "\n";
    return kNotFound;
  }
  const std::optional<IdempotencyRecord> record = faces.store->lookup(args.key);
  if (!record) {
    std::cerr << "idem inspect: not found: no live record for key '" << printable(args.key, 256)
              << "' (never claimed, released, or expired)\n";
    return kNotFound;
  }
  const bool completed = record->state == IdempotencyRecord::State::completed;
  const std::string bytes = record->value.bytes.value_or("");
  const bool has_bytes = record->value.bytes.has_value();
  if (args.json) {
    nlohmann::json out = {{"key", record->key.empty() ? args.key : record->key},
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
  std::printf("key           %s\n", printable(args.key, 256).c_str());
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
  return args.consumer.empty() ? inspect_record(args) : inspect_marker(args);
}

// Runs one command and maps what it throws to the exit codes of exit_codes.hpp.
int guarded(std::string_view command, const std::string& url, const std::vector<std::string>& extra,
            const std::function<int()>& body) {
  const std::string password = url_password(url);
  const auto fail = [&](int code, const std::string& message) {
    std::cerr << "idem " << command << ": " << masked(message, password) << "\n";
    return code;
  };
  try {
    if (!extra.empty()) {
      throw UsageError("unexpected argument '" + printable(extra.front(), 64) + "' (see idem " +
                       std::string(command) + " --help)");
    }
    if (url.empty()) {
      throw UsageError(
          "URL is required, e.g. sqlite:///var/lib/app/idem.db, "
          "redis://127.0.0.1:6379/0 or postgresql://user@host/db");
    }
    return body();
  } catch (const UsageError& e) {
    return fail(kUsage, e.what());
  } catch (const std::exception& e) {
    return fail(exit_code_of(e), describe(e));
  }
}

void finish(int code) {
  std::cout.flush();
  if (code != kOk) throw CLI::RuntimeError(code);
}

}  // namespace

void add_store_commands(CLI::App& app) {
  // Shared by the callbacks: CLI11 fills them while parsing, the callback reads them after.
  auto stats = std::make_shared<StatsArgs>();
  auto* stats_cmd =
      app.add_subcommand("stats",
                         "Counts in a recorder (markers and live claims per consumer) and a store "
                         "(records by state) at URL");
  stats_cmd->add_option("url", stats->url, "sqlite:PATH, redis://..., postgresql://...");
  stats_cmd->add_flag("--json", stats->json, "Print JSON (--format json)");
  stats_cmd->add_option("--format", stats->format, "text (default), json or prometheus");
  stats_cmd->allow_extras();
  stats_cmd->callback([stats, stats_cmd] {
    finish(guarded("stats", stats->url, stats_cmd->remaining(), [&] { return run_stats(*stats); }));
  });

  auto purge = std::make_shared<PurgeArgs>();
  auto* purge_cmd = app.add_subcommand(
      "purge", "Delete markers older than a duration and expired store records at URL");
  purge_cmd->add_option("url", purge->url, "sqlite:PATH, redis://..., postgresql://...");
  purge_cmd->add_option("--older-than", purge->older_than,
                        "Purge markers older than this (500ms, 30s, 15m, 12h, 7d)");
  purge_cmd->add_flag("--store-only", purge->store_only, "Only expired store records");
  purge_cmd->add_flag("--recorder-only", purge->recorder_only, "Only old markers");
  purge_cmd->add_flag("--dry-run", purge->dry_run, "Count what would go, delete nothing");
  purge_cmd->allow_extras();
  purge_cmd->callback([purge, purge_cmd] {
    finish(guarded("purge", purge->url, purge_cmd->remaining(), [&] { return run_purge(*purge); }));
  });

  auto inspect = std::make_shared<InspectArgs>();
  auto* inspect_cmd = app.add_subcommand(
      "inspect",
      "Show the store record of KEY, or with --consumer the marker and claim of event "
      "KEY");
  inspect_cmd->add_option("url", inspect->url, "sqlite:PATH, redis://..., postgresql://...");
  inspect_cmd->add_option("key", inspect->key, "Idempotency key (or event id with --consumer)");
  inspect_cmd->add_option("--consumer", inspect->consumer, "Inspect this consumer's marker");
  inspect_cmd->add_flag("--json", inspect->json, "Print JSON");
  inspect_cmd->allow_extras();
  inspect_cmd->callback([inspect, inspect_cmd] {
    finish(guarded("inspect", inspect->url, inspect_cmd->remaining(),
                   [&] { return run_inspect(*inspect); }));
  });
}

}  // namespace idem::cli
