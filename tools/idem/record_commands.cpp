#include "record_commands.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
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

namespace idem::cli {
namespace {

// Records one `idem list` shows unless --limit says otherwise, and the most it shows in a run.
constexpr std::size_t kDefaultListLimit = 100;
constexpr std::size_t kMaxListRun = 100'000;

// The lease the takeover of an abandoned claim holds until it is released a moment later.
constexpr Millis kTakeoverLease{5'000};

// A store's list() cursor is opaque bytes (on Redis, a key); the command line gets it as hex.
std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    out += kDigits[byte >> 4];
    out += kDigits[byte & 0x0f];
  }
  return out;
}

std::string from_hex(std::string_view hex) {
  const auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  bool valid = hex.size() % 2 == 0;
  for (std::size_t i = 0; valid && i < hex.size(); i += 2) {
    const int high = digit(hex[i]);
    const int low = digit(hex[i + 1]);
    valid = high >= 0 && low >= 0;
    out += static_cast<char>(high * 16 + low);
  }
  if (!valid) {
    throw UsageError("--cursor '" + printable(hex, 32) +
                     "' is not a cursor idem list printed (pass it as it was printed)");
  }
  return out;
}

// The four states of idem stats: a claim is in_progress while its lease lasts, then abandoned; a
// result is completed until it expires, then expired (until purge).
std::string_view state_at(const IdempotencyRecord& record, WallTime now) {
  if (record.state == IdempotencyRecord::State::in_progress) {
    return record.lease_until > now ? "in_progress" : "abandoned";
  }
  return record.expires_at > now ? "completed" : "expired";
}

// "lease until T" or "expires T".
std::string deadline_text(const IdempotencyRecord& record) {
  if (record.state == IdempotencyRecord::State::in_progress) {
    return "lease until " + iso_time(record.lease_until);
  }
  return "expires " + iso_time(record.expires_at);
}

// ---- list -----------------------------------------------------------------------------------

struct ListArgs {
  std::string url;
  std::string operation;
  std::string scope;
  std::string prefix;
  std::size_t limit = kDefaultListLimit;
  std::string cursor;
  bool json = false;
};

int run_list(const ListArgs& args) {
  const std::string scope = scope_option(args.operation, args.scope);
  const std::string store_prefix = scoped_idempotency_key(scope, "") + args.prefix;
  std::string cursor = from_hex(args.cursor);
  Faces faces = open_faces(args.url, false, true, OpenOptions::Schema::look_only);
  if (!faces.store) {
    std::cerr << "idem list: not found: there is no idempotency store at " << redact_url(args.url)
              << "\n";
    return kNotFound;
  }
  std::vector<IdempotencyRecord> records;
  do {
    const std::size_t want = std::min(args.limit - records.size(), kMaxListLimit);
    RecordPage page = faces.store->list(store_prefix, want, cursor);
    for (IdempotencyRecord& record : page.records)
      records.push_back(std::move(record));
    cursor = std::move(page.next);
  } while (!cursor.empty() && records.size() < args.limit);
  const WallTime now = system_clock()->wall_now();

  if (args.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const IdempotencyRecord& record : records) {
      const auto split = split_scoped_idempotency_key(record.key);
      nlohmann::json out = {
          {"key", std::string(split ? split->key : std::string_view(record.key))},
          {"scope", split ? nlohmann::json(std::string(split->scope)) : nullptr},
          {"stored_key", record.key},
          {"state", std::string(state_at(record, now))},
          {"token", record.token},
          {"fingerprint", record.fingerprint ? nlohmann::json(*record.fingerprint) : nullptr}};
      if (record.state == IdempotencyRecord::State::in_progress) {
        out["lease_until"] = iso_time(record.lease_until);
      } else {
        out["completed_at"] = iso_time(record.completed_at);
        out["expires_at"] = iso_time(record.expires_at);
      }
      list.push_back(std::move(out));
    }
    print_json(
        {{"records", list}, {"next", cursor.empty() ? nullptr : nlohmann::json(to_hex(cursor))}});
    return kOk;
  }

  struct Row {
    std::string key;
    std::string scope;
    std::string state;
    std::string token;
    std::string deadline;
  };
  std::vector<Row> rows;
  rows.push_back({"KEY", "SCOPE", "STATE", "TOKEN", "UNTIL"});
  for (const IdempotencyRecord& record : records) {
    const auto split = split_scoped_idempotency_key(record.key);
    rows.push_back({printable(split ? split->key : std::string_view(record.key), 256),
                    split ? printable(split->scope, 256) : "-", std::string(state_at(record, now)),
                    std::to_string(record.token), deadline_text(record)});
  }
  std::size_t key_width = 0;
  std::size_t scope_width = 0;
  std::size_t token_width = 0;
  for (const Row& row : rows) {
    key_width = std::max(key_width, columns(row.key));
    scope_width = std::max(scope_width, columns(row.scope));
    token_width = std::max(token_width, row.token.size());
  }
  if (!records.empty()) {
    for (const Row& row : rows) {
      // printf pads by bytes; a UTF-8 key is padded by the characters it shows.
      std::printf("%s%*s  %s%*s  %-11s  %*s  %s\n", row.key.c_str(),
                  static_cast<int>(key_width - columns(row.key)), "", row.scope.c_str(),
                  static_cast<int>(scope_width - columns(row.scope)), "", row.state.c_str(),
                  static_cast<int>(token_width), row.token.c_str(), row.deadline.c_str());
    }
  }
  std::printf("%zu record%s", records.size(), records.size() == 1 ? "" : "s");
  if (!cursor.empty()) {
    std::printf("; more follow: add --cursor %s", to_hex(cursor).c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
  return kOk;
}

// ---- release --------------------------------------------------------------------------------

struct ReleaseArgs {
  std::string url;
  std::string key;
  std::string operation;
  std::string scope;
  bool force = false;
  bool delete_completed = false;
};

// "key 'K'" or "key 'K' of operation 'S'".
std::string key_text(const ReleaseArgs& args, const std::string& scope) {
  std::string text = "key '" + printable(args.key, 256) + "'";
  if (!scope.empty()) text += " of operation '" + printable(scope, 256) + "'";
  return text;
}

int refuse(const std::string& message) {
  std::cerr << "idem release: refused: " << message << "; nothing changed\n";
  return kRefused;
}

int release_completed(IdempotencyStore& store, const ReleaseArgs& args, const std::string& scope,
                      const std::string& stored, const IdempotencyRecord& record) {
  if (!args.delete_completed) {
    return refuse(key_text(args, scope) + " holds a completed result (token " +
                  std::to_string(record.token) + ", " + deadline_text(record) +
                  "); --delete-completed deletes it, and the next call with the key runs the "
                  "operation again");
  }
  if (!store.remove(stored, record.token)) {
    return refuse("the record of " + key_text(args, scope) + " changed while it was read");
  }
  std::printf(
      "deleted the completed result of %s (token %llu); the next call with the key runs "
      "the operation again\n",
      key_text(args, scope).c_str(), static_cast<unsigned long long>(record.token));
  return kOk;
}

int release_live(IdempotencyStore& store, const ReleaseArgs& args, const std::string& scope,
                 const std::string& stored, const IdempotencyRecord& record) {
  if (!args.force) {
    return refuse("the claim of " + key_text(args, scope) + " is live (token " +
                  std::to_string(record.token) + ", " + deadline_text(record) +
                  "): its holder may still be running; wait for the lease to end, or --force "
                  "clears it and fences the holder off");
  }
  if (!store.remove(stored, record.token)) {
    return refuse("the record of " + key_text(args, scope) + " changed while it was read");
  }
  std::printf(
      "cleared the live claim of %s (token %llu, %s); its holder is fenced off: its "
      "complete and release now fail\n",
      key_text(args, scope).c_str(), static_cast<unsigned long long>(record.token),
      deadline_text(record).c_str());
  return kOk;
}

int run_release(const ReleaseArgs& args) {
  if (args.key.empty()) throw UsageError("KEY is required (idem release URL KEY --operation NAME)");
  const std::string scope = scope_option(args.operation, args.scope);
  const std::string stored = scoped_idempotency_key(scope, args.key);
  const Faces found = open_faces(args.url, false, true, OpenOptions::Schema::look_only);
  if (!found.store) {
    std::cerr << "idem release: not found: there is no idempotency store at "
              << redact_url(args.url) << "\n";
    return kNotFound;
  }
  Faces faces = open_faces(args.url, false, true, OpenOptions::Schema::keep);
  IdempotencyStore& store = *faces.store;
  std::optional<IdempotencyRecord> record = store.lookup(stored);
  if (!record) {
    std::cerr << "idem release: not found: no live record for " << key_text(args, scope);
    if (scope.empty()) {
      std::cerr << scope_hint("release", args.url, args.key, scopes_holding(store, args.key));
    }
    std::cerr << "\n";
    return kNotFound;
  }
  if (record->state == IdempotencyRecord::State::completed) {
    return release_completed(store, args, scope, stored, *record);
  }
  if (record->lease_until > system_clock()->wall_now()) {
    return release_live(store, args, scope, stored, *record);
  }
  // The lease looks over. The store confirms it by its own clock: a claim takes an abandoned
  // claim over (fencing its holder off) and never a live one.
  const ClaimOutcome outcome = store.claim(stored, std::nullopt, kTakeoverLease);
  switch (outcome.status) {
    case ClaimOutcome::Status::acquired: {
      const bool released = store.release(stored, outcome.token);
      if (!outcome.took_over) {
        std::cerr << "idem release: not found: the claim of " << key_text(args, scope)
                  << " went while it was read\n";
        return kNotFound;
      }
      if (!released) {
        throw StoreError("the claim of " + key_text(args, scope) +
                         " was taken over but could not be released (token " +
                         std::to_string(outcome.token) + "); it ends with its " +
                         std::to_string(kTakeoverLease.count()) + " ms lease");
      }
      std::printf(
          "cleared the abandoned claim of %s (token %llu, lease ended %s); the next call "
          "with the key runs the operation\n",
          key_text(args, scope).c_str(), static_cast<unsigned long long>(record->token),
          iso_time(record->lease_until).c_str());
      return kOk;
    }
    case ClaimOutcome::Status::completed:
      return release_completed(store, args, scope, stored, *outcome.record);
    case ClaimOutcome::Status::in_progress:
    case ClaimOutcome::Status::mismatch:
      // Renewed meanwhile (or the store's clock is behind this machine's).
      return release_live(store, args, scope, stored, *outcome.record);
  }
  return kStoreFailure;
}

}  // namespace

void add_record_commands(CLI::App& app) {
  auto list = std::make_shared<ListArgs>();
  auto* list_cmd = add_url_command(
      app, "list",
      "List the records of idempotent operations at URL by the key their function returned "
      "(--operation NAME), with their state, token and lease end or expiry",
      list->url, [list] { return run_list(*list); });
  list_cmd->add_option("--operation", list->operation,
                       "Only this operation's records (its name: the records' scope)");
  list_cmd->add_option("--scope", list->scope,
                       "Only records of this idempotency_scope (operations that set one)");
  list_cmd->add_option("--prefix", list->prefix, "Only keys that start with this");
  list_cmd->add_option("--limit", list->limit, "Most records to show (1 to 100000; default 100)")
      ->check(CLI::Range(std::size_t{1}, kMaxListRun));
  list_cmd->add_option("--cursor", list->cursor, "Continue where a previous list stopped");
  list_cmd->add_flag("--json", list->json, "Print JSON");

  auto release = std::make_shared<ReleaseArgs>();
  auto* release_cmd = add_url_command(
      app, "release",
      "Clear the abandoned claim of KEY (its lease ended); --force clears a live one, fencing "
      "its holder off",
      release->url, [release] { return run_release(*release); });
  release_cmd->add_option("key", release->key, "The key the operation's function returned");
  release_cmd->add_option("--operation", release->operation,
                          "The operation whose key it is (its name: the records' scope)");
  release_cmd->add_option("--scope", release->scope,
                          "The idempotency_scope, for operations that set one");
  release_cmd->add_flag("--force", release->force,
                        "Clear a live claim too; its holder's complete and release then fail");
  release_cmd->add_flag("--delete-completed", release->delete_completed,
                        "Delete a completed result too; the next call with the key runs again");
}

}  // namespace idem::cli
