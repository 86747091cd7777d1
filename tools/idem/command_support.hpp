// What the `idem` commands that take a store URL share: opening the faces at a URL without
// changing anything, text safe for a terminal, times, JSON, and the one way a command reports an
// error and its exit code.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "idem/clock.hpp"
#include "idem/error.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/open.hpp"
#include "idem/recorder.hpp"

namespace CLI {
class App;
}

namespace idem::cli {

// A usage error found by a command itself (CLI11 is told nothing is required, so that every
// usage error exits with 2 and one clear message).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The password of `url`'s user info ("scheme://user:PASSWORD@host"), if any, so that it can
// be masked in messages that a backend built from the URL (redact_url covers the URL itself).
std::string url_password(std::string_view url);
// `message` with every copy of `password` replaced by "***".
std::string masked(std::string message, const std::string& password);

// True for the errors that mean "this face has no tables here" when opened look-only: a SQLite
// file opened read-only without them (store_read_only), a PostgreSQL schema without them
// (create_schema=false; the backend reports it as a plain, non-retryable StoreError).
bool means_absent(const Error& e);

// The recorder and the store at one URL; a face whose tables do not exist is null, with why.
struct Faces {
  std::shared_ptr<IdempotencyRecorder> recorder;
  std::string recorder_absent;
  std::shared_ptr<IdempotencyStore> store;
  std::string store_absent;
};
// Opens the wanted faces at `url` with `schema` (OpenOptions::Schema: look_only to look, keep to
// change records of faces that exist; never create).
Faces open_faces(const std::string& url, bool want_recorder, bool want_store,
                 OpenOptions::Schema schema);

// "2026-11-30T08:46:53.988Z".
std::string iso_time(WallTime t);

// Bytes as text safe for a terminal: printable ASCII and well-formed UTF-8 (a name in any
// script) as they are; control characters, a backslash and bytes that are not UTF-8 as \xNN.
// Cut after `limit` bytes, never inside a character, with "...".
std::string printable(std::string_view bytes, std::size_t limit);

// The columns `text` takes in a terminal, for every script whose characters are one column wide.
std::size_t columns(std::string_view text);

// JSON on stdout. Names and keys are bytes, not always UTF-8: a byte that is not UTF-8 is
// printed as U+FFFD instead of failing the command.
void print_json(const nlohmann::json& value);

// Runs one command: checks that nothing unexpected is left on the command line and that a URL
// was given, runs `body`, and maps what it throws to the exit codes of exit_codes.hpp, printing
// "idem COMMAND: message" (the URL's password masked) on stderr.
int guarded(std::string_view command, const std::string& url, const std::vector<std::string>& extra,
            const std::function<int()>& body);

// ---- keys of the operation face ----------------------------------------------------------
// An operation's records are held under scoped keys, "<bytes of scope>:<scope>:<key>"
// (idem::scoped_idempotency_key); the scope is the operation's name unless it names an
// idempotency_scope. Commands take the user's key and --operation NAME or --scope SCOPE.

// The scope that --operation or --scope name ("" when neither; both is a UsageError).
std::string scope_option(const std::string& operation, const std::string& scope);

// The scopes under which the user's `key` is held ("14:create_payment:<key>"), read from the
// store's first kScopeSearchRecords records (the search is bounded), at most 5 of them. For a
// "did you mean --operation" hint when a plain key is not found.
inline constexpr std::size_t kScopeSearchRecords = 10'000;
std::vector<std::string> scopes_holding(IdempotencyStore& store, std::string_view key);

// "; key 'K' is held by operation 'S' (see: idem COMMAND URL K --operation S)" for the first of
// `scopes`, "" when there is none.
std::string scope_hint(std::string_view command, std::string_view url, std::string_view key,
                       const std::vector<std::string>& scopes);

// ---- SIGINT / SIGTERM -----------------------------------------------------------------------
// A long-running command (relay, purge) holds a StopSignals from its first line: its handlers
// only note the signal, which the command polls between steps (never inside a library call), so
// it ends with a summary instead of being killed. The previous handlers come back with its end.
// One at a time per process.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  static bool requested() noexcept;
  // "SIGINT" or "SIGTERM" (the first that came), "" before either.
  static const char* name() noexcept;
  // 128 + the signal's number: what a shell reports for a process the signal ended.
  static int exit_code() noexcept;
  // Sleeps `duration`, waking within 50 ms of a stop request; returns requested().
  static bool sleep_for(std::chrono::milliseconds duration);
};

// ---- a dependency that is down --------------------------------------------------------------
// Tells on stderr how a dependency (the broker) is doing at a bounded rate, never a line per
// attempt: one line when it goes down (with the cause), one when the cause changes, a summary
// every `summary_every` while it stays down, and one when it is back.
//
// Thread-safety: every member may be called from any thread.
class OutageLog {
 public:
  // Lines read "<prefix>: <dependency> down ...".
  OutageLog(std::string prefix, std::string dependency, std::chrono::milliseconds summary_every);

  // An attempt failed with `cause`.
  void failed(const std::string& cause);
  // An attempt succeeded: a line when it was down.
  void recovered();
  bool down() const;
  // Failed attempts since it went down (0 when it is up).
  std::uint64_t attempts() const;
  // "down for 12.5 s, 24 failed attempts, last: <cause>" ("" when it is up).
  std::string status() const;

 private:
  std::string status_locked(std::chrono::steady_clock::time_point now) const;

  const std::string prefix_;
  const std::string dependency_;
  const std::chrono::milliseconds summary_every_;
  mutable std::mutex mutex_;
  std::uint64_t attempts_ = 0;
  std::string cause_;
  std::chrono::steady_clock::time_point down_since_{};
  std::chrono::steady_clock::time_point last_line_{};
};

// Ends a command's CLI11 callback: CLI::RuntimeError(code) unless code is 0, so main() returns it.
void finish(int code);

// Adds to `app` the subcommand `name` whose first argument is the URL it works on (read into
// `url`) and whose callback runs `body` through guarded() and finish(); the caller adds the rest
// of its arguments and options. `url` must live as long as the command (a member of the
// arguments `body` holds).
CLI::App* add_url_command(CLI::App& app, const std::string& name, const std::string& description,
                          std::string& url, std::function<int()> body);

}  // namespace idem::cli
