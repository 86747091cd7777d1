#include "idem/postgres/connection_pool.hpp"

#include <libpq-fe.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <iterator>
#include <mutex>
#include <utility>
#include <vector>

#include "connection.hpp"
#include "idem/detail/fork.hpp"
#include "idem/error.hpp"

namespace idem::postgres {

namespace {

using detail::Connection;

struct ConninfoFree {
  void operator()(PQconninfoOption* options) const noexcept { PQconninfoFree(options); }
};

bool all_digits(std::string_view s) noexcept {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Checks what libpq would only notice at connect time, and returns the credential-free
// description of the target used in every message: "user@host:port/dbname".
std::string check_url(const std::string& url) {
  if (url.empty()) {
    throw ConfigError(
        "PostgresOptions::url is empty: give a URL like postgresql://user@host:5432/dbname or "
        "a libpq string like \"host=... dbname=...\"");
  }
  if (url.find('\0') != std::string::npos) {
    throw ConfigError("PostgresOptions::url contains a NUL byte");
  }
  const std::size_t scheme_end = url.find("://");
  if (scheme_end != std::string::npos) {
    const std::string scheme = url.substr(0, scheme_end);
    if (scheme != "postgresql" && scheme != "postgres") {
      throw ConfigError("PostgresOptions::url has the scheme '" + scheme.substr(0, 32) +
                        "://'; PostgreSQL URLs start with postgresql:// (or postgres://)");
    }
  }
  char* error = nullptr;
  std::unique_ptr<PQconninfoOption, ConninfoFree> parsed(PQconninfoParse(url.c_str(), &error));
  if (!parsed) {
    std::string why = error != nullptr ? error : "libpq could not parse it";
    if (error != nullptr) PQfreemem(error);
    while (!why.empty() && (why.back() == '\n' || why.back() == ' '))
      why.pop_back();
    throw ConfigError("PostgresOptions::url is not a valid PostgreSQL URL or connection string: " +
                      why);
  }
  std::string user;
  std::string host;
  std::string port;
  std::string dbname;
  for (const PQconninfoOption* option = parsed.get(); option->keyword != nullptr; ++option) {
    if (option->val == nullptr) continue;
    const std::string_view keyword = option->keyword;
    if (keyword == "user") user = option->val;
    if (keyword == "host") host = option->val;
    if (keyword == "hostaddr" && host.empty()) host = option->val;
    if (keyword == "port") port = option->val;
    if (keyword == "dbname") dbname = option->val;
  }
  // Several hosts may come with several ports, comma-separated.
  std::size_t start = 0;
  while (!port.empty() && start <= port.size()) {
    std::size_t end = port.find(',', start);
    if (end == std::string::npos) end = port.size();
    const std::string one = port.substr(start, end - start);
    if (!one.empty() &&
        (!all_digits(one) || one.size() > 5 || std::stoi(one) == 0 || std::stoi(one) > 65535)) {
      throw ConfigError("PostgresOptions::url has the port '" + one.substr(0, 16) +
                        "'; a port is a number from 1 to 65535");
    }
    start = end + 1;
  }
  std::string target;
  if (!user.empty()) target += user + "@";
  // An IPv6 address in brackets, as in the URL, so that the port stays apart.
  if (host.find(':') != std::string::npos && host.front() != '/') {
    target += "[" + host + "]";
  } else {
    target += host.empty() ? std::string("localhost") : host;
  }
  target += ":" + (port.empty() ? std::string("5432") : port);
  target += "/" + (dbname.empty() ? (user.empty() ? std::string("(default)") : user) : dbname);
  return target;
}

void check_options(const PostgresOptions& options) {
  if (options.pool_size == 0) throw ConfigError("PostgresOptions::pool_size must be at least 1");
  if (options.connect_timeout <= std::chrono::milliseconds::zero()) {
    throw ConfigError("PostgresOptions::connect_timeout must be positive, got " +
                      std::to_string(options.connect_timeout.count()) + " ms");
  }
  if (options.acquire_timeout < std::chrono::milliseconds::zero()) {
    throw ConfigError("PostgresOptions::acquire_timeout must be >= 0, got " +
                      std::to_string(options.acquire_timeout.count()) + " ms");
  }
  if (options.statement_timeout < std::chrono::milliseconds::zero()) {
    throw ConfigError("PostgresOptions::statement_timeout must be >= 0 (0: no limit), got " +
                      std::to_string(options.statement_timeout.count()) + " ms");
  }
  if (options.wait_recheck_interval <= std::chrono::milliseconds::zero()) {
    throw ConfigError("PostgresOptions::wait_recheck_interval must be positive, got " +
                      std::to_string(options.wait_recheck_interval.count()) + " ms");
  }
  detail::check_identifier("PostgresOptions::schema", options.schema);
  detail::check_identifier("PostgresOptions::processed_log_table", options.processed_log_table);
  detail::check_identifier("PostgresOptions::claims_table", options.claims_table);
  detail::check_identifier("PostgresOptions::records_table", options.records_table);
  detail::check_identifier("PostgresOptions::notify_channel",
                           options.notify_channel.empty()
                               ? options.schema + "_" + options.records_table
                               : options.notify_channel);
  if (options.application_name.find('\0') != std::string::npos) {
    throw ConfigError("PostgresOptions::application_name contains a NUL byte");
  }
  if (!options.sslmode.empty()) {
    constexpr std::string_view kModes[] = {"disable", "allow",     "prefer",
                                           "require", "verify-ca", "verify-full"};
    if (std::find(std::begin(kModes), std::end(kModes), options.sslmode) == std::end(kModes)) {
      throw ConfigError("PostgresOptions::sslmode '" + options.sslmode.substr(0, 32) +
                        "' is not one of disable, allow, prefer, require, verify-ca, verify-full");
    }
  }
  for (const auto& [name, path] :
       {std::pair<const char*, const std::string&>{"sslrootcert", options.sslrootcert},
        {"sslcert", options.sslcert},
        {"sslkey", options.sslkey}}) {
    if (path.empty()) continue;
    if (path.find('\0') != std::string::npos)
      throw ConfigError(std::string("PostgresOptions::") + name + " contains a NUL byte");
    if (::access(path.c_str(), R_OK) != 0) {
      throw ConfigError(std::string("PostgresOptions::") + name + ": cannot read '" + path +
                        "': " + std::strerror(errno));
    }
  }
  // Read once here so a missing file or variable is reported at construction.
  (void)detail::connection_secrets(options);
}

}  // namespace

class ConnectionPool::Impl {
 public:
  explicit Impl(PostgresOptions opts) : options(std::move(opts)) {
    check_options(options);
    target = check_url(options.url);
  }

  PostgresOptions options;
  std::string target;
  const ::idem::detail::ForkOwner process;  // a child of fork() gets no connection

  void check_process() const {
    process.use("this PostgreSQL connection pool (of a recorder or store)");
  }

  mutable std::mutex mutex;
  std::condition_variable available;
  std::vector<std::unique_ptr<Connection>> idle;
  std::size_t open = 0;  // idle + leased + being opened
  PoolStats counters;    // open/idle filled in by stats()

  // Takes every idle connection out (to be closed by the caller, outside the lock).
  std::vector<std::unique_ptr<Connection>> take_idle_locked() {
    std::vector<std::unique_ptr<Connection>> taken = std::move(idle);
    idle.clear();
    open -= taken.size();
    counters.dropped += taken.size();
    return taken;
  }
};

ConnectionPool::ConnectionPool(PostgresOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

ConnectionPool::~ConnectionPool() = default;

ConnectionPool::Lease::Lease(ConnectionPool& pool,
                             std::unique_ptr<detail::Connection> connection) noexcept
    : pool_(&pool), connection_(std::move(connection)) {}

ConnectionPool::Lease::Lease(Lease&& other) noexcept
    : pool_(other.pool_), connection_(std::move(other.connection_)), broken_(other.broken_) {}

ConnectionPool::Lease::~Lease() {
  if (connection_) pool_->give_back(std::move(connection_), broken_);
}

PGconn* ConnectionPool::Lease::get() const noexcept {
  return connection_->raw();
}

ConnectionPool::Lease ConnectionPool::acquire() {
  Impl& impl = *impl_;
  impl.check_process();
  const auto deadline = std::chrono::steady_clock::now() + impl.options.acquire_timeout;
  std::unique_lock lock(impl.mutex);
  for (;;) {
    while (!impl.idle.empty()) {
      std::unique_ptr<Connection> candidate = std::move(impl.idle.back());
      impl.idle.pop_back();
      lock.unlock();
      if (candidate->healthy()) return Lease(*this, std::move(candidate));
      candidate.reset();
      // The server closed this one: it restarted or ended our sessions, so the other idle
      // connections are almost certainly dead too. Reopen on demand instead.
      lock.lock();
      --impl.open;
      ++impl.counters.dropped;
      std::vector<std::unique_ptr<Connection>> stale = impl.take_idle_locked();
      lock.unlock();
      stale.clear();
      impl.available.notify_all();
      lock.lock();
    }
    if (impl.open < impl.options.pool_size) {
      ++impl.open;
      lock.unlock();
      try {
        std::unique_ptr<Connection> fresh = Connection::open(impl.options, impl.target);
        {
          std::lock_guard relock(impl.mutex);
          ++impl.counters.connects;
        }
        return Lease(*this, std::move(fresh));
      } catch (...) {
        {
          std::lock_guard relock(impl.mutex);
          --impl.open;
          ++impl.counters.connect_failures;
        }
        impl.available.notify_one();
        throw;
      }
    }
    if (impl.available.wait_until(lock, deadline) == std::cv_status::timeout && impl.idle.empty() &&
        impl.open >= impl.options.pool_size) {
      throw detail::make_client_error(
          ErrorCode::store_busy, "acquire a connection", impl.target,
          "all " + std::to_string(impl.options.pool_size) +
              " pooled connections stayed in use for " +
              std::to_string(impl.options.acquire_timeout.count()) +
              " ms (raise PostgresOptions::pool_size or acquire_timeout)",
          /*retryable=*/true);
    }
  }
}

void ConnectionPool::give_back(std::unique_ptr<detail::Connection> connection,
                               bool broken) noexcept {
  Impl& impl = *impl_;
  const bool lost = connection->broken();
  // A connection left inside a transaction (or with a failed one) is not reused: idem never
  // leaves one there, so whoever did cannot be trusted to have finished with it.
  const bool reusable = !broken && !lost && PQtransactionStatus(connection->raw()) == PQTRANS_IDLE;
  std::vector<std::unique_ptr<Connection>> stale;
  {
    std::lock_guard lock(impl.mutex);
    if (reusable) {
      impl.idle.push_back(std::move(connection));
    } else {
      --impl.open;
      ++impl.counters.dropped;
      if (lost) stale = impl.take_idle_locked();
    }
  }
  connection.reset();  // closed outside the lock
  stale.clear();
  impl.available.notify_all();
}

std::unique_ptr<detail::Connection> ConnectionPool::open_dedicated() {
  impl_->check_process();
  std::unique_ptr<Connection> connection = Connection::open(impl_->options, impl_->target);
  std::lock_guard lock(impl_->mutex);
  ++impl_->counters.connects;
  return connection;
}

void ConnectionPool::drop_idle() noexcept {
  std::vector<std::unique_ptr<Connection>> stale;
  {
    std::lock_guard lock(impl_->mutex);
    stale = impl_->take_idle_locked();
  }
  stale.clear();
  impl_->available.notify_all();
}

PoolStats ConnectionPool::stats() const {
  std::lock_guard lock(impl_->mutex);
  PoolStats stats = impl_->counters;
  stats.open = impl_->open;
  stats.idle = impl_->idle.size();
  return stats;
}

const PostgresOptions& ConnectionPool::options() const noexcept {
  return impl_->options;
}

const std::string& ConnectionPool::target() const noexcept {
  return impl_->target;
}

}  // namespace idem::postgres
