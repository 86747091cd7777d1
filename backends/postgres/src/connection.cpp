#include "connection.hpp"

#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "idem/detail/secret.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"

namespace idem::postgres::detail {

namespace {

// 2000-01-01T00:00:00Z in microseconds since the Unix epoch: PostgreSQL's timestamp epoch.
constexpr std::int64_t kPgEpochUs = 946'684'800'000'000;

// WallTime's range in microseconds.
constexpr std::int64_t kMinWallUs =
    std::chrono::duration_cast<std::chrono::microseconds>(WallTime::duration::min()).count();
constexpr std::int64_t kMaxWallUs =
    std::chrono::duration_cast<std::chrono::microseconds>(WallTime::duration::max()).count();

std::uint64_t fnv1a(std::string_view text) noexcept {
  std::uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

std::uint64_t get_be(std::string_view bytes) noexcept {
  std::uint64_t v = 0;
  for (unsigned char c : bytes)
    v = (v << 8) | c;
  return v;
}

[[noreturn]] void throw_bad_column(int column, std::string_view type, std::size_t size) {
  throw StoreError(ErrorCode::store_corrupt_record,
                   "PostgreSQL returned " + std::to_string(size) + " bytes for column " +
                       std::to_string(column) + ", which should be a binary " + std::string(type));
}

// One line: libpq messages span lines ("server closed the connection unexpectedly\n\tThis
// probably means ..."); LOCATION lines of verbose messages are dropped.
std::string flatten(std::string_view message) {
  std::string out;
  std::size_t start = 0;
  while (start < message.size()) {
    std::size_t end = message.find('\n', start);
    if (end == std::string_view::npos) end = message.size();
    std::string_view line = message.substr(start, end - start);
    start = end + 1;
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t'))
      line.remove_prefix(1);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r'))
      line.remove_suffix(1);
    if (line.empty() || line.rfind("LOCATION:", 0) == 0) continue;
    if (!out.empty()) out += ' ';
    out += line;
  }
  return out;
}

// The SQLSTATE of a verbose startup error ("... FATAL:  3D000: database ... does not exist").
std::string sqlstate_in(std::string_view message) {
  for (std::string_view marker : {"FATAL:  ", "ERROR:  "}) {
    const std::size_t at = message.find(marker);
    if (at == std::string_view::npos) continue;
    std::string_view rest = message.substr(at + marker.size());
    if (rest.size() < 6 || rest[5] != ':') continue;
    const bool plausible = std::all_of(rest.begin(), rest.begin() + 5, [](char c) {
      return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z');
    });
    if (plausible) return std::string(rest.substr(0, 5));
  }
  return {};
}

bool contains(std::string_view text, std::string_view part) noexcept {
  return text.find(part) != std::string_view::npos;
}

struct SslCtxFree {
  void operator()(SSL_CTX* ctx) const noexcept { SSL_CTX_free(ctx); }
};
struct SslFree {
  void operator()(SSL* ssl) const noexcept { SSL_free(ssl); }
};
struct AddrinfoFree {
  void operator()(addrinfo* info) const noexcept { freeaddrinfo(info); }
};
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Why OpenSSL did not trust the server's certificate ("certificate has expired", "unable to get
// local issuer certificate"), or "" when it cannot be found out. libpq says only "certificate
// verify failed" and frees its TLS session before returning, so this is a second handshake of
// idem's own to the same address: TCP, PostgreSQL's SSLRequest, then OpenSSL verifying the
// chain against the same sslrootcert. Bounded by `budget` (send/receive timeouts).
std::string certificate_verify_reason(const std::string& host, const std::string& port,
                                      const std::string& rootcert,
                                      std::chrono::milliseconds budget) {
  if (host.empty() || host.front() == '/' || rootcert.empty() || port.empty()) return {};
  if (budget <= std::chrono::milliseconds::zero()) return {};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return {};
  const std::unique_ptr<addrinfo, AddrinfoFree> addresses(found);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(budget.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((budget.count() % 1000) * 1000);
  for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
    Fd sock{::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol)};
    if (sock.fd < 0) continue;
    ::setsockopt(sock.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(sock.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(sock.fd, a->ai_addr, a->ai_addrlen) != 0) continue;
    // SSLRequest: length 8, code 80877103; the server answers 'S' when it speaks TLS.
    const unsigned char request[8] = {0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f};
    if (::send(sock.fd, request, sizeof request, MSG_NOSIGNAL) != sizeof request) return {};
    char answer = 0;
    if (::recv(sock.fd, &answer, 1, 0) != 1 || answer != 'S') return {};
    const std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(TLS_client_method()));
    if (!ctx || SSL_CTX_load_verify_locations(ctx.get(), rootcert.c_str(), nullptr) != 1) {
      ERR_clear_error();
      return {};
    }
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
    const std::unique_ptr<SSL, SslFree> ssl(SSL_new(ctx.get()));
    if (!ssl || SSL_set_fd(ssl.get(), sock.fd) != 1) return {};
    SSL_set_tlsext_host_name(ssl.get(), host.c_str());
    const int connected = SSL_connect(ssl.get());
    const long result = SSL_get_verify_result(ssl.get());
    ERR_clear_error();
    if (connected == 1) SSL_shutdown(ssl.get());
    ERR_clear_error();
    if (result == X509_V_OK) return {};
    return X509_verify_cert_error_string(result);
  }
  return {};
}

// A libpq connection option's value as the connect used it ("" when unset).
std::string conninfo_value(PGconn* conn, std::string_view keyword) {
  PQconninfoOption* options = PQconninfo(conn);
  if (options == nullptr) return {};
  std::string value;
  for (const PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
    if (keyword == o->keyword && o->val != nullptr) value = o->val;
  }
  PQconninfoFree(options);
  return value;
}

}  // namespace

// ---- TLS and secrets ------------------------------------------------------------------------

ConnectionSecrets connection_secrets(const PostgresOptions& options) {
  ConnectionSecrets secrets;
  secrets.password = ::idem::detail::resolve_secret("PostgresOptions::password", options.password,
                                                    options.password_file, options.password_env);
  secrets.sslpassword =
      ::idem::detail::resolve_secret("PostgresOptions::sslpassword", options.sslpassword,
                                     options.sslpassword_file, options.sslpassword_env);
  return secrets;
}

std::string tls_failure_cause(std::string_view m) {
  if (contains(m, "does not match host name")) {
    return "host name mismatch: the server's certificate does not name the host connected to";
  }
  if (contains(m, "certificate verify failed")) {
    return "the server's certificate is not trusted (sslrootcert)";
  }
  if (contains(m, "server does not support SSL")) {
    return "the server does not offer TLS, but sslmode requires it";
  }
  if (contains(m, "root certificate file") || contains(m, "could not read root certificate")) {
    return "the CA file (sslrootcert) cannot be used";
  }
  if (contains(m, "certificate file") || contains(m, "could not load SSL certificate")) {
    return "the client certificate (sslcert) cannot be used";
  }
  if (contains(m, "private key")) return "the client key (sslkey) cannot be used";
  if (contains(m, "requires a valid client certificate")) {
    return "the server requires a client certificate signed by its CA (sslcert, sslkey)";
  }
  if (contains(m, "no pg_hba.conf entry") && contains(m, "no encryption")) {
    return "the server takes this user only over TLS (set sslmode=verify-full)";
  }
  if (contains(m, "SSL error:") && contains(m, "alert")) {
    return "the server refused the TLS handshake (its CA did not sign the client certificate, "
           "or the certificate is expired)";
  }
  if (contains(m, "SSL error:")) return "the TLS handshake failed";
  return {};
}

// ---- helpers --------------------------------------------------------------------------------

void check_identifier(std::string_view what, std::string_view name) {
  const auto fail = [&](const std::string& why) {
    throw ConfigError(std::string(what) + " '" + std::string(name.substr(0, 80)) + "' " + why +
                      " (use ASCII letters, digits and '_', not starting with a digit, at most "
                      "63 bytes)");
  };
  if (name.empty()) fail("is empty");
  if (name.size() > 63) fail("is longer than 63 bytes");
  if (name.front() >= '0' && name.front() <= '9') fail("starts with a digit");
  for (char c : name) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) fail("contains a character other than letters, digits and '_'");
  }
}

std::string quote_identifier(std::string_view name) {
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

bool is_utf8(std::string_view text) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int extra = 0;
    std::uint32_t cp = 0;
    if (c >= 0xc2 && c <= 0xdf) {
      extra = 1;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      extra = 2;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (end - p <= extra) return false;
    for (int i = 1; i <= extra; ++i) {
      if ((p[i] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3f);
    }
    if ((extra == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (extra == 3 && (cp < 0x10000 || cp > 0x10ffff))) {
      return false;
    }
    p += extra + 1;
  }
  return true;
}

void require_utf8_key(std::string_view what, std::string_view value) {
  if (!is_utf8(value)) {
    throw InvalidKey(std::string(what) +
                     " is not valid UTF-8 (PostgreSQL keeps keys as UTF-8 text)");
  }
}

std::int64_t to_pg_time(WallTime t) noexcept {
  const std::int64_t us =
      std::chrono::floor<std::chrono::microseconds>(t.time_since_epoch()).count();
  return us - kPgEpochUs;  // WallTime's range is far inside int64 microseconds
}

WallTime from_pg_time(std::int64_t pg_us) noexcept {
  std::int64_t unix_us = 0;
  if (pg_us > kMaxWallUs - kPgEpochUs) {
    unix_us = kMaxWallUs;  // includes 'infinity'
  } else if (pg_us < kMinWallUs - kPgEpochUs) {
    unix_us = kMinWallUs;  // includes '-infinity'
  } else {
    unix_us = pg_us + kPgEpochUs;
  }
  return WallTime(
      std::chrono::duration_cast<WallTime::duration>(std::chrono::microseconds(unix_us)));
}

WallTime add_saturating(WallTime t, std::chrono::nanoseconds d) noexcept {
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  const std::int64_t add = d.count();
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  std::int64_t sum = 0;
  if (add > 0 && ns > kMax - add) {
    sum = kMax;
  } else if (add < 0 && ns < kMin - add) {
    sum = kMin;
  } else {
    sum = ns + add;
  }
  return WallTime(std::chrono::duration_cast<WallTime::duration>(std::chrono::nanoseconds(sum)));
}

// ---- errors ---------------------------------------------------------------------------------

PostgresError make_error(PGconn* conn, const PGresult* result, std::string_view call,
                         std::string_view target, StatementKind kind) {
  const char* state = result != nullptr ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
  std::string sqlstate = state != nullptr ? state : "";
  const bool lost = conn == nullptr || PQstatus(conn) == CONNECTION_BAD;
  std::string message;
  if (result != nullptr) {
    const char* primary = PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY);
    message = primary != nullptr ? primary : PQresultErrorMessage(result);
  }
  if (message.empty() && conn != nullptr) message = PQerrorMessage(conn);
  message = flatten(message);
  if (message.empty()) message = "unknown failure";
  const ErrorClass cls = classify_error(sqlstate, lost, kind);
  std::string text = std::string(call) + " on " + std::string(target) + ": " + message;
  if (!sqlstate.empty()) {
    text += " (SQLSTATE " + sqlstate + ")";
  } else if (lost) {
    text += " (connection lost)";
  }
  if (cls.in_doubt) {
    text += kind == StatementKind::commit ? "; whether the transaction committed is unknown"
                                          : "; whether the statement took effect is unknown";
  }
  return PostgresError(cls.code, text, std::move(sqlstate), cls.retryable, cls.in_doubt);
}

bool refuses_writes(const PGresult* result) noexcept {
  const char* state = result != nullptr ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
  return state != nullptr && std::strcmp(state, "25006") == 0;
}

PostgresError make_client_error(ErrorCode code, std::string_view call, std::string_view target,
                                std::string_view message, bool retryable) {
  return PostgresError(
      code, std::string(call) + " on " + std::string(target) + ": " + std::string(message), "",
      retryable, false);
}

// ---- Result ---------------------------------------------------------------------------------

std::int64_t Result::affected() const noexcept {
  if (!result_) return 0;
  const char* text = PQcmdTuples(result_.get());
  std::int64_t n = 0;
  if (text == nullptr || *text == '\0') return 0;
  std::from_chars(text, text + std::strlen(text), n);
  return n;
}

std::int64_t Result::changed_or_returned() const noexcept {
  if (result_ && PQresultStatus(result_.get()) == PGRES_TUPLES_OK &&
      *PQcmdTuples(result_.get()) == '\0') {
    return rows();
  }
  return affected();
}

bool Result::is_null(int row, int column) const noexcept {
  return PQgetisnull(result_.get(), row, column) != 0;
}

std::string_view Result::bytes(int row, int column) const noexcept {
  const char* data = PQgetvalue(result_.get(), row, column);
  const int length = PQgetlength(result_.get(), row, column);
  return std::string_view(data, static_cast<std::size_t>(std::max(length, 0)));
}

std::int64_t Result::int8(int row, int column) const {
  const std::string_view b = bytes(row, column);
  if (b.size() != 8) throw_bad_column(column, "bigint", b.size());
  return static_cast<std::int64_t>(get_be(b));
}

std::int32_t Result::int4(int row, int column) const {
  const std::string_view b = bytes(row, column);
  if (b.size() != 4) throw_bad_column(column, "integer", b.size());
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(get_be(b)));
}

bool Result::boolean(int row, int column) const {
  const std::string_view b = bytes(row, column);
  if (b.size() != 1) throw_bad_column(column, "boolean", b.size());
  return b[0] != 0;
}

WallTime Result::timestamptz(int row, int column) const {
  const std::string_view b = bytes(row, column);
  if (b.size() != 8) throw_bad_column(column, "timestamptz", b.size());
  return from_pg_time(static_cast<std::int64_t>(get_be(b)));
}

// ---- Params ---------------------------------------------------------------------------------

Params& Params::text(std::string_view value) {
  return push(kTextOid, Slot{value, {}, -1, false, 1});
}

Params& Params::text(std::string&& value) {
  owned_.push_back(std::move(value));
  return text(std::string_view(owned_.back()));
}

Params& Params::bytea(std::string_view value) {
  return push(kByteaOid, Slot{value, {}, -1, false, 1});
}

Params& Params::int8(std::int64_t value) {
  return push_be64(kInt8Oid, static_cast<std::uint64_t>(value));
}

Params& Params::boolean(bool value) {
  Slot slot;
  slot.inline_bytes[0] = value ? 1 : 0;
  slot.inline_size = 1;
  return push(kBoolOid, slot);
}

Params& Params::float8(double value) {
  std::uint64_t bits = 0;
  static_assert(sizeof bits == sizeof value);
  std::memcpy(&bits, &value, sizeof bits);
  return push_be64(kFloat8Oid, bits);
}

Params& Params::timestamptz(WallTime value) {
  return push_be64(kTimestamptzOid, static_cast<std::uint64_t>(to_pg_time(value)));
}

Params& Params::null(Oid type) {
  Slot slot;
  slot.is_null = true;
  return push(type, slot);
}

Params& Params::text_array(std::span<const std::string> values) {
  // PostgreSQL's binary array format (array_recv): ndim, has-nulls flag, element type, then
  // per dimension its length and lower bound, then each element as length + bytes. No quoting
  // or escaping is involved, so any valid key travels as is.
  std::string bytes;
  const auto put_be32 = [&bytes](std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8)
      bytes.push_back(static_cast<char>((v >> shift) & 0xff));
  };
  std::size_t size = 20;
  for (const std::string& value : values)
    size += 4 + value.size();
  bytes.reserve(size);
  put_be32(1);  // one dimension
  put_be32(0);  // no NULLs
  put_be32(kTextOid);
  put_be32(static_cast<std::uint32_t>(values.size()));
  put_be32(1);  // lower bound
  for (const std::string& value : values) {
    put_be32(static_cast<std::uint32_t>(value.size()));
    bytes += value;
  }
  owned_.push_back(std::move(bytes));
  return push(kTextArrayOid, Slot{owned_.back(), {}, -1, false, 1});
}

Params& Params::untyped(std::string_view text) {
  owned_.emplace_back(text);  // text format needs a NUL-terminated copy
  return push(0, Slot{owned_.back(), {}, -1, false, 0});
}

Params::Arrays Params::arrays() const {
  Arrays a;
  a.values.reserve(slots_.size());
  a.lengths.reserve(slots_.size());
  a.formats.reserve(slots_.size());
  for (const Slot& slot : slots_) {
    if (slot.is_null) {
      a.values.push_back(nullptr);
      a.lengths.push_back(0);
    } else if (slot.inline_size >= 0) {
      a.values.push_back(slot.inline_bytes.data());
      a.lengths.push_back(slot.inline_size);
    } else {
      // A zero-length value still needs a non-null pointer, or libpq sends NULL.
      a.values.push_back(slot.ref.data() != nullptr ? slot.ref.data() : "");
      a.lengths.push_back(static_cast<int>(slot.ref.size()));
    }
    a.formats.push_back(slot.format);
  }
  return a;
}

Statement::Statement(std::string sql_text, std::vector<Oid> param_types, Planning planning_mode)
    : sql(std::move(sql_text)), types(std::move(param_types)), planning(planning_mode) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "idem_%016llx", static_cast<unsigned long long>(fnv1a(sql)));
  name = buffer;
}

// ---- connection -----------------------------------------------------------------------------

PGconn* connect_start(const PostgresOptions& options, const std::string& target) {
  ConnectionSecrets secrets;
  try {
    secrets = connection_secrets(options);
  } catch (const ConfigError& e) {
    // The file or variable was readable at construction: it went away since.
    throw PostgresError(ErrorCode::store_open_failed,
                        "could not connect to " + target + ": " + e.message(), "",
                        /*retryable=*/false, false);
  }
  // Options after "dbname" override what the URL (expanded from dbname) says.
  std::vector<const char*> keys = {"dbname", "client_encoding"};
  std::vector<const char*> values = {options.url.c_str(), "UTF8"};
  if (!options.application_name.empty()) {
    keys.push_back("fallback_application_name");
    values.push_back(options.application_name.c_str());
  }
  const auto add = [&](const char* key, const std::string& value) {
    if (value.empty()) return;
    keys.push_back(key);
    values.push_back(value.c_str());
  };
  add("sslmode", options.sslmode);
  add("sslrootcert", options.sslrootcert);
  add("sslcert", options.sslcert);
  add("sslkey", options.sslkey);
  if (secrets.password) add("password", *secrets.password);
  if (secrets.sslpassword) add("sslpassword", *secrets.sslpassword);
  keys.push_back(nullptr);
  values.push_back(nullptr);
  PGconn* conn = PQconnectStartParams(keys.data(), values.data(), /*expand_dbname=*/1);
  if (conn == nullptr) throw std::bad_alloc();
  // Verbose startup errors carry the SQLSTATE ("FATAL:  3D000: ..."), which tells a server that
  // refuses us (no such database, bad password) from one that is down or starting.
  PQsetErrorVerbosity(conn, PQERRORS_VERBOSE);
  return conn;
}

PostgresError connect_error(std::string_view why, const std::string& target, PGconn* conn,
                            std::chrono::milliseconds verify_budget) {
  const std::string message = flatten(why);
  const std::string sqlstate = sqlstate_in(why);
  ErrorClass cls =
      classify_error(sqlstate, /*connection_lost=*/sqlstate.empty(), StatementKind::read);
  if (sqlstate.empty()) cls = ErrorClass{ErrorCode::store_error, true, false};
  std::string cause = tls_failure_cause(message);
  if (!cause.empty() && (sqlstate.empty() || sqlstate.rfind("28", 0) == 0)) {
    // TLS set-up failures say the same on every try: never retryable.
    if (conn != nullptr && verify_budget > std::chrono::milliseconds::zero() &&
        message.find("certificate verify failed") != std::string::npos) {
      const char* addr = PQhostaddr(conn);
      const char* host = PQhost(conn);
      const char* port = PQport(conn);
      const std::string reason = certificate_verify_reason(
          addr != nullptr && *addr != '\0' ? addr : (host != nullptr ? host : ""),
          port != nullptr ? port : "", conninfo_value(conn, "sslrootcert"),
          std::min<std::chrono::milliseconds>(verify_budget, std::chrono::seconds(2)));
      if (!reason.empty()) cause += ": " + reason;
    }
    return PostgresError(
        ErrorCode::store_open_failed,
        "could not connect to " + target + ": TLS: " + cause + " (" + message + ")", sqlstate,
        /*retryable=*/false, false);
  }
  std::string text = "could not connect to " + target + ": " + message;
  if (sqlstate.empty()) {
    // libpq's own text is the only sign of what failed before the server said anything.
    const auto says = [&](std::string_view part) {
      return message.find(part) != std::string::npos;
    };
    if (says("could not translate host name")) {
      // "Temporary failure in name resolution": the resolver may answer later.
      return PostgresError(ErrorCode::host_not_found, text, sqlstate,
                           /*retryable=*/says("Temporary failure"), false);
    }
    if (says("Connection refused")) {
      return PostgresError(ErrorCode::connection_refused, text, sqlstate, /*retryable=*/true,
                           false);
    }
    if (says("received invalid response to SSL negotiation") ||
        says("expected authentication request from server") ||
        says("received invalid response to GSSAPI negotiation")) {
      return PostgresError(ErrorCode::wrong_protocol,
                           "could not connect to " + target +
                               ": the server does not speak the PostgreSQL protocol (" + message +
                               "): is this a PostgreSQL port?",
                           sqlstate, /*retryable=*/false, false);
    }
    if (says("timeout expired")) {
      return PostgresError(ErrorCode::connect_timeout, text, sqlstate, /*retryable=*/true, false);
    }
  }
  return PostgresError(cls.code, text, sqlstate, cls.retryable, false);
}

PostgresError connect_timeout_error(const PostgresOptions& options, const std::string& target,
                                    PGconn* conn) {
  std::string text = "could not connect to " + target + " within " +
                     std::to_string(options.connect_timeout.count()) + " ms (connect_timeout)";
  // Past CONNECTION_STARTED the TCP connection was made: something listens there but did not
  // answer as PostgreSQL does.
  if (conn != nullptr && PQstatus(conn) != CONNECTION_STARTED) {
    text +=
        ": the server accepted the connection but did not answer as PostgreSQL does (is this "
        "a PostgreSQL port?)";
  }
  return PostgresError(ErrorCode::connect_timeout, text, "", /*retryable=*/true, false);
}

// ---- Connection -----------------------------------------------------------------------------

std::unique_ptr<Connection> Connection::open(const PostgresOptions& options,
                                             const std::string& target) {
  constexpr std::string_view kCall = "connect";
  PGconn* conn = connect_start(options, target);
  auto connection = std::unique_ptr<Connection>(new Connection(conn, target));
  const auto deadline = std::chrono::steady_clock::now() + options.connect_timeout;
  const auto fail = [&](std::string_view why) {
    return connect_error(why, target, conn,
                         std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - std::chrono::steady_clock::now()));
  };
  if (PQstatus(conn) == CONNECTION_BAD) throw fail(PQerrorMessage(conn));

  PostgresPollingStatusType status = PGRES_POLLING_WRITING;
  while (status != PGRES_POLLING_OK) {
    if (status == PGRES_POLLING_FAILED) throw fail(PQerrorMessage(conn));
    const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (remaining <= std::chrono::milliseconds::zero()) {
      throw connect_timeout_error(options, target, conn);
    }
    pollfd fd{PQsocket(conn),
              static_cast<short>(status == PGRES_POLLING_READING ? POLLIN : POLLOUT), 0};
    const int ready = ::poll(&fd, 1,
                             static_cast<int>(std::min<std::int64_t>(
                                 remaining.count(), std::numeric_limits<int>::max())));
    if (ready < 0 && errno != EINTR) throw fail(std::strerror(errno));
    if (ready <= 0) continue;
    status = PQconnectPoll(conn);
  }
  PQsetErrorVerbosity(conn, PQERRORS_DEFAULT);
  // Notices ("schema already exists, skipping") are not errors and stay off stderr; a FATAL
  // the server sends an idle session (it is shutting down, or terminated the session) marks
  // the connection as doomed.
  PQsetNoticeReceiver(conn, &Connection::on_notice, connection.get());
  if (options.statement_timeout > std::chrono::milliseconds::zero()) {
    connection->exec("SET statement_timeout = " + std::to_string(options.statement_timeout.count()),
                     kCall, StatementKind::read);
  }
  return connection;
}

Connection::~Connection() {
  PQfinish(conn_);
}

bool Connection::broken() const noexcept {
  return doomed_ || PQstatus(conn_) != CONNECTION_OK;
}

bool ends_session(const PGresult* notice) noexcept {
  const char* severity = PQresultErrorField(notice, PG_DIAG_SEVERITY_NONLOCALIZED);
  return severity != nullptr &&
         (std::strcmp(severity, "FATAL") == 0 || std::strcmp(severity, "PANIC") == 0);
}

bool idle_session_healthy(PGconn* conn, const bool& doomed) noexcept {
  if (doomed || PQstatus(conn) != CONNECTION_OK) return false;
  for (int round = 0; round < 4; ++round) {
    pollfd fd{PQsocket(conn), POLLIN, 0};
    const int ready = ::poll(&fd, 1, 0);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return false;
    if (ready == 0) return true;
    if (PQconsumeInput(conn) == 0) return false;
    (void)PQisBusy(conn);  // parses the input
    while (PGnotify* stray = PQnotifies(conn))
      PQfreemem(stray);
    if (doomed || PQstatus(conn) != CONNECTION_OK) return false;
  }
  return false;  // input keeps arriving on an idle session: do not trust it
}

void Connection::on_notice(void* self, const PGresult* notice) {
  if (ends_session(notice)) static_cast<Connection*>(self)->doomed_ = true;
}

bool Connection::healthy() noexcept {
  if (doomed_ || PQstatus(conn_) != CONNECTION_OK) return false;
  if (PQtransactionStatus(conn_) != PQTRANS_IDLE) return false;
  return idle_session_healthy(conn_, doomed_);
}

void Connection::check(const Result& result, std::string_view call, StatementKind kind) {
  const ExecStatusType status =
      result.get() != nullptr ? PQresultStatus(result.get()) : PGRES_FATAL_ERROR;
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return;
  if (refuses_writes(result.get())) doomed_ = true;  // the pool drops it, like a lost one
  throw make_error(conn_, result.get(), call, target_, kind);
}

Result Connection::run(const Statement& statement, const Params& params, std::string_view call,
                       StatementKind kind) {
  if (statement.planning == Planning::per_run) {
    const Params::Arrays a = params.arrays();
    Result result(PQexecParams(conn_, statement.sql.c_str(), params.size(), statement.types.data(),
                               a.values.data(), a.lengths.data(), a.formats.data(),
                               /*resultFormat=*/1));
    check(result, call, kind);
    return result;
  }
  if (prepared_.count(statement.name) == 0) {
    Result prepared(PQprepare(conn_, statement.name.c_str(), statement.sql.c_str(),
                              static_cast<int>(statement.types.size()), statement.types.data()));
    // Preparing writes nothing: a failure here is never in doubt.
    check(prepared, call, StatementKind::read);
    prepared_.insert(statement.name);
  }
  const Params::Arrays a = params.arrays();
  Result result(PQexecPrepared(conn_, statement.name.c_str(), params.size(), a.values.data(),
                               a.lengths.data(), a.formats.data(), /*resultFormat=*/1));
  check(result, call, kind);
  return result;
}

Result Connection::exec(std::string_view sql, std::string_view call, StatementKind kind) {
  const std::string text(sql);
  Result result(PQexec(conn_, text.c_str()));
  check(result, call, kind);
  return result;
}

Result Connection::exec_params(std::string_view sql, const Params& params, std::string_view call,
                               StatementKind kind) {
  const std::string text(sql);
  const Params::Arrays a = params.arrays();
  Result result(PQexecParams(conn_, text.c_str(), params.size(), params.types(), a.values.data(),
                             a.lengths.data(), a.formats.data(), /*resultFormat=*/0));
  check(result, call, kind);
  return result;
}

}  // namespace idem::postgres::detail
