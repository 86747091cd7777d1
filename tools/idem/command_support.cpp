#include "command_support.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>
#include <utility>

#include "exit_codes.hpp"
#include "idem/operation_idempotency.hpp"

namespace idem::cli {
namespace {

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

}  // namespace

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

bool means_absent(const Error& e) {
  if (e.code() == ErrorCode::store_read_only) return true;
  return e.code() == ErrorCode::store_error && !e.retryable() && !e.in_doubt() &&
         std::string_view(e.what()).find(" do not exist ") != std::string_view::npos;
}

namespace {

// What `open` returns, or null with the reason in `absent` when the face's tables do not exist
// (means_absent); any other error propagates.
template <class Open>
auto open_unless_absent(const Open& open, std::string& absent) -> decltype(open()) {
  try {
    return open();
  } catch (const StoreError& e) {
    if (!means_absent(e)) throw;
    absent = e.what();
    return nullptr;
  }
}

}  // namespace

Faces open_faces(const std::string& url, bool want_recorder, bool want_store,
                 OpenOptions::Schema schema) {
  Faces faces;
  OpenOptions options;
  options.schema = schema;
  if (want_recorder) {
    faces.recorder =
        open_unless_absent([&] { return open_recorder(url, options); }, faces.recorder_absent);
  }
  if (want_store) {
    faces.store = open_unless_absent([&] { return open_store(url, options); }, faces.store_absent);
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

// Counts UTF-8 lead bytes.
std::size_t columns(std::string_view text) {
  std::size_t n = 0;
  for (const char c : text)
    n += (static_cast<unsigned char>(c) & 0xc0) != 0x80 ? 1 : 0;
  return n;
}

void print_json(const nlohmann::json& value) {
  std::cout << value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

int guarded(std::string_view command, const std::string& url, const std::vector<std::string>& extra,
            const std::function<int()>& body) {
  const std::string password = url_password(url);
  const auto fail = [&](int code, const std::string& message) {
    std::cerr << "idem " << command << ": " << masked(message, password) << "\n";
    return code;
  };
  try {
    if (!extra.empty()) {
      throw UsageError("unexpected argument '" + printable(extra.front(), 64) + "' (see 'idem " +
                       std::string(command) + " --help')");
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

std::string scope_option(const std::string& operation, const std::string& scope) {
  if (!operation.empty() && !scope.empty()) {
    throw UsageError(
        "--operation and --scope exclude each other (--scope is for operations that set an "
        "idempotency_scope; its records are not under the operation's name)");
  }
  return operation.empty() ? scope : operation;
}

std::vector<std::string> scopes_holding(IdempotencyStore& store, std::string_view key) {
  std::vector<std::string> scopes;
  std::string cursor;
  std::size_t read = 0;
  do {
    RecordPage page = store.list("", kMaxListLimit, cursor);
    for (const IdempotencyRecord& record : page.records) {
      const auto split = split_scoped_idempotency_key(record.key);
      if (!split || split->key != key) continue;
      if (std::find(scopes.begin(), scopes.end(), split->scope) == scopes.end()) {
        scopes.emplace_back(split->scope);
        if (scopes.size() == 5) return scopes;
      }
    }
    read += page.records.size();
    cursor = std::move(page.next);
  } while (!cursor.empty() && read < kScopeSearchRecords);
  return scopes;
}

std::string scope_hint(std::string_view command, std::string_view url, std::string_view key,
                       const std::vector<std::string>& scopes) {
  if (scopes.empty()) return {};
  std::string hint = "; key '" + printable(key, 256) + "' is held by operation '" +
                     printable(scopes.front(), 256) + "'";
  for (std::size_t i = 1; i < scopes.size(); ++i)
    hint += (i + 1 == scopes.size() ? " and '" : ", '") + printable(scopes[i], 256) + "'";
  hint += " (see: idem " + std::string(command) + " " + redact_url(url) + " " +
          printable(key, 256) + " --operation " + printable(scopes.front(), 256) + ")";
  return hint;
}

namespace {

std::atomic<int> g_stop_signal{0};

extern "C" void note_stop_signal(int signal_number) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, signal_number);
}

struct sigaction g_previous_int {};
struct sigaction g_previous_term {};

}  // namespace

StopSignals::StopSignals() {
  g_stop_signal.store(0);
  struct sigaction action {};
  action.sa_handler = note_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking calls go on; the command polls between them
  sigaction(SIGINT, &action, &g_previous_int);
  sigaction(SIGTERM, &action, &g_previous_term);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
}

bool StopSignals::requested() noexcept {
  return g_stop_signal.load() != 0;
}

const char* StopSignals::name() noexcept {
  switch (g_stop_signal.load()) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "";
  }
}

int StopSignals::exit_code() noexcept {
  return 128 + g_stop_signal.load();
}

bool StopSignals::sleep_for(std::chrono::milliseconds duration) {
  constexpr auto kSlice = std::chrono::milliseconds(50);
  const auto until = std::chrono::steady_clock::now() + duration;
  while (!requested()) {
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) break;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(left, kSlice));
  }
  return requested();
}

OutageLog::OutageLog(std::string prefix, std::string dependency,
                     std::chrono::milliseconds summary_every)
    : prefix_(std::move(prefix)),
      dependency_(std::move(dependency)),
      summary_every_(summary_every) {}

void OutageLog::failed(const std::string& cause) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  ++attempts_;
  if (attempts_ == 1) {
    down_since_ = last_line_ = now;
    cause_ = cause;
    std::cerr << prefix_ << ": " << dependency_ << " down, retrying: " << cause << "\n";
  } else if (cause != cause_) {
    last_line_ = now;
    cause_ = cause;
    std::cerr << prefix_ << ": " << dependency_ << " still down, now: " << cause << "\n";
  } else if (now - last_line_ >= summary_every_) {
    last_line_ = now;
    std::cerr << prefix_ << ": " << dependency_ << " still " << status_locked(now) << "\n";
  }
}

void OutageLog::recovered() {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  if (attempts_ == 0) return;
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f",
                std::chrono::duration<double>(now - down_since_).count());
  std::cerr << prefix_ << ": " << dependency_ << " up again after " << seconds << " s ("
            << attempts_ << " failed attempt" << (attempts_ == 1 ? "" : "s") << ")\n";
  attempts_ = 0;
  cause_.clear();
}

bool OutageLog::down() const {
  std::lock_guard lock(mutex_);
  return attempts_ > 0;
}

std::uint64_t OutageLog::attempts() const {
  std::lock_guard lock(mutex_);
  return attempts_;
}

std::string OutageLog::status() const {
  std::lock_guard lock(mutex_);
  return status_locked(std::chrono::steady_clock::now());
}

std::string OutageLog::status_locked(std::chrono::steady_clock::time_point now) const {
  if (attempts_ == 0) return {};
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f",
                std::chrono::duration<double>(now - down_since_).count());
  return "down for " + std::string(seconds) + " s, " + std::to_string(attempts_) +
         " failed attempt" + (attempts_ == 1 ? "" : "s") + ", last: " + cause_;
}

void finish(int code) {
  std::cout.flush();
  if (code != kOk) throw CLI::RuntimeError(code);
}

CLI::App* add_url_command(CLI::App& app, const std::string& name, const std::string& description,
                          std::string& url, std::function<int()> body) {
  auto* command = app.add_subcommand(name, description);
  command->add_option("url", url, "sqlite:PATH, redis://..., postgresql://...");
  command->allow_extras();
  command->callback([name, &url, command, run = std::move(body)] {
    finish(guarded(name, url, command->remaining(), run));
  });
  return command;
}

}  // namespace idem::cli
