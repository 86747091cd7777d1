// The pipelined connection of the coroutine face: the Redis protocol over idem's pipelined-
// connection engine (idem/async/detail/pipeline.hpp), which owns the calls, the strand, the
// socket's waits and the ends. Callers only post to the strand and are completed by a post to
// their own executor.
#include "idem/redis/async_connection.hpp"

#include <algorithm>
#include <array>
#include <asio/async_result.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <exception>
#include <system_error>
#include <utility>
#include <vector>

#include "idem/async/detail/pipeline.hpp"
#include "idem/detail/fork.hpp"
#include "idem/error.hpp"
#include "idem/net/stream.hpp"
#include "idem/net/tls.hpp"
#include "idem/redis/redis_error.hpp"
#include "internal.hpp"
#include "resp.hpp"
#include "tls_support.hpp"

namespace idem::redis {

void CommandBatch::add(std::span<const std::string_view> args) {
  detail::append_command(bytes_, args);
  ++count_;
}

namespace {

using SteadyClock = std::chrono::steady_clock;
using Replies = std::vector<RedisReply>;

constexpr std::chrono::milliseconds kFirstBackoff{50};
constexpr std::chrono::milliseconds kMaxBackoff{1000};
constexpr std::size_t kMaxBatchBytes = 1 << 20;  // one write takes at most this much new work
constexpr std::size_t kReadChunk = 64 * 1024;

// One call of the connection: its commands and, once written, what reading its replies needs.
struct Call {
  std::string bytes;      // emptied once batched
  std::size_t count = 0;  // replies expected
  CommandKind kind = CommandKind::write;
  std::string what;
  bool handshake = false;  // AUTH/SELECT of a new connection (the engine's "own" call)
  std::uint64_t end = 0;   // stream offset just past this call's bytes, once batched
  SteadyClock::time_point written_at{};
  Replies replies;
};

bool is_timeout(int error_number) {
  return error_number == ETIMEDOUT || error_number == EAGAIN || error_number == EWOULDBLOCK;
}

}  // namespace

// The calls (queue, in flight, cancellation, the ends) are the engine's
// (idem/async/detail/pipeline.hpp); this is the Redis protocol over it: connecting (TCP, TLS,
// AUTH/SELECT), batching commands into writes, reading RESP replies, the command timeout, and
// what a failure means for each call.
struct AsyncConnection::State : async::detail::Pipeline<AsyncConnection::State, Call, Replies> {
  enum class Phase { idle, backoff, connecting, handshaking, ready };

  State(asio::any_io_executor executor, RedisOptions opts,
        std::shared_ptr<const net::TlsContext> tls)
      : Pipeline(executor),
        options(std::move(opts)),
        tls_context(std::move(tls)),
        endpoint(options.endpoint()) {}

  // The engine's view of the descriptor goes before the stream closes it.
  ~State() { unwatch(); }

  // ---- the engine's hooks (on the strand) ------------------------------------------------------

  void pump() {
    switch (phase) {
      case Phase::idle:
        if (has_queued()) begin_connect();
        break;
      case Phase::ready:
        flush();
        break;
      default:  // backoff, connecting, handshaking: the queue is written once ready
        break;
    }
  }

  // A call whose command was handed to the socket and is cancelled: a read ends with
  // operation_aborted (nothing changed); a write may have run, so it ends early only when the
  // cancellation accepts side effects (terminal, partial), in doubt as after a lost reply
  // (retryable when repeating it is harmless), never "nothing happened".
  std::exception_ptr cancel_sent(const Call& call, asio::cancellation_type type) const {
    if (call.kind == CommandKind::read) return async::detail::operation_aborted();
    if (!async::detail::allows_side_effects(type)) return nullptr;
    return std::make_exception_ptr(RedisError(
        RedisFailure::io,
        "idem redis: " + call.what + " on " + endpoint +
            ": cancelled after the command was sent: it may or may not have been applied",
        /*retryable=*/call.kind == CommandKind::idempotent_write, /*in_doubt=*/true));
  }

  void close_transport() noexcept {
    stream.close();
    phase = Phase::idle;
    tls_handshaking = false;
    socket_bytes_read = 0;
    timer_armed = false;
    handshakes = 0;
    out.clear();
    out_offset = 0;
  }

  void close_socket() noexcept {
    end_transport();
    close_transport();
  }

  // ---- connect ----------------------------------------------------------------------------------

  void begin_connect() {
    const auto now = SteadyClock::now();
    if (now < next_attempt) {
      phase = Phase::backoff;
      timer().expires_at(next_attempt);
      when_timer([](State& self, std::error_code ec) {
        if (ec || self.phase != Phase::backoff) return;
        self.phase = Phase::idle;
        self.pump();
      });
      return;
    }
    phase = Phase::connecting;
    try {
      addresses = net::resolve(options.host, options.port);
    } catch (const net::ResolveError& e) {
      fail_connect(detail::resolve_error(endpoint, e.what(), e.temporary()));
      return;
    }
    address_index = 0;
    timer().expires_at(now + options.connect_timeout);
    when_timer([](State& self, std::error_code ec) {
      if (ec || self.phase != Phase::connecting) return;
      const bool in_tls = self.tls_handshaking;
      self.close_socket();
      if (in_tls) {
        const std::string cause =
            detail::tls_to_plaintext_port(self.addresses, self.options.connect_timeout);
        if (!cause.empty()) {
          self.refuse_tls(cause);
          return;
        }
      }
      self.connect_failed(ETIMEDOUT, std::string(in_tls ? "TLS handshake: " : "") +
                                         "no answer within connect_timeout " +
                                         std::to_string(self.options.connect_timeout.count()) +
                                         " ms");
    });
    try_address();
  }

  void try_address() {
    for (;;) {
      try {
        stream = net::Stream::start_connect(addresses.at(address_index));
        watch(stream.fd());
        if (!stream.connecting()) {
          connected();
          return;
        }
        when_ready(WaitType::wait_write, [](State& self, std::error_code ec) {
          if (ec || self.phase != Phase::connecting) return;
          try {
            self.stream.finish_connect();
          } catch (const std::system_error& e) {
            self.next_address(e);
            return;
          }
          self.connected();
        });
        return;
      } catch (const std::system_error& e) {
        if (!next_address(e, /*retry_inline=*/true)) return;
      }
    }
  }

  // True when the caller should try the next address at once (inline).
  bool next_address(const std::system_error& e, bool retry_inline = false) {
    unwatch();
    stream.close();
    if (++address_index < addresses.size()) {
      if (retry_inline) return true;
      try_address();
      return false;
    }
    const int error_number = e.code().value();
    const std::string message = e.code().message();
    close_socket();
    connect_failed(error_number, message);
    return false;
  }

  void connect_failed(int error_number, const std::string& detail) {
    fail_connect(detail::connect_error(endpoint, error_number, detail));
  }

  // Every queued request fails with `error`; the next connect waits out the backoff.
  void fail_connect(const RedisError& error) {
    ++stats_connect_failures;
    phase = Phase::idle;
    back_off();
    fail_queued([&](const Pending&) { return std::make_exception_ptr(error); });
  }

  // The next attempt waits: 50 ms doubling up to 1 s, reset by a success.
  void back_off() {
    backoff = backoff.count() == 0 ? kFirstBackoff : std::min(backoff * 2, kMaxBackoff);
    next_attempt = SteadyClock::now() + backoff;
  }

  // TCP is up: the TLS handshake (within the same connect timeout), then the Redis handshake.
  void connected() {
    if (!tls_context) {
      established();
      return;
    }
    try {
      stream.start_tls(tls_context, options.host);
    } catch (const net::TlsError& e) {
      refuse_tls(e.what());
      return;
    }
    tls_handshaking = true;
    tls_step();
  }

  void tls_step() {
    net::IoStatus status;
    try {
      status = stream.handshake();
    } catch (const net::TlsError& e) {
      refuse_tls(e.what());
      return;
    } catch (const std::system_error& e) {
      close_socket();
      connect_failed(e.code().value(), "TLS handshake: " + e.code().message());
      return;
    }
    if (status == net::IoStatus::done) {
      tls_handshaking = false;
      established();
      return;
    }
    when_ready(status == net::IoStatus::want_read ? WaitType::wait_read : WaitType::wait_write,
               [](State& self, std::error_code ec) {
                 if (ec || self.phase != Phase::connecting) return;
                 self.tls_step();
               });
  }

  // A TLS failure (or a TLS/plaintext mismatch): every call written or waiting fails with the
  // non-retryable tls error; the next call tries again after the backoff.
  void refuse_tls(const std::string& cause) {
    close_socket();
    ++stats_connect_failures;
    back_off();
    const RedisError error = detail::tls_error(endpoint, cause);
    fail_in_flight([&](const Pending&) { return std::make_exception_ptr(error); });
    fail_queued([&](const Pending&) { return std::make_exception_ptr(error); });
  }

  // The first bytes of this socket are not RESP: something else listens there. Everything
  // sent or queued fails with wrong_protocol.
  void not_redis() {
    close_socket();
    ++stats_connect_failures;
    back_off();
    const auto error_for = [&](const Pending& pending) {
      return std::make_exception_ptr(
          detail::not_redis_error(pending.call.what.empty() ? std::string_view("connect")
                                                            : std::string_view(pending.call.what),
                                  endpoint, first_bytes));
    };
    fail_in_flight(error_for);
    fail_queued(error_for);
  }

  // A fresh socket failed before its first reply: the TLS cause when the port speaks TLS to a
  // plaintext client, or the server refused the TLS session (a blocking probe of at most 1 s,
  // on this failure path only).
  std::string tls_mismatch(int error_number, bool eof) {
    if (socket_bytes_read != 0 || !(eof || error_number == ECONNRESET || error_number == EPIPE)) {
      return {};
    }
    if (tls_context) {
      return detail::tls_session_refused(addresses, tls_context, options.host,
                                         options.connect_timeout);
    }
    return detail::plaintext_to_tls_port(addresses, options.connect_timeout);
  }

  void established() {
    reader = std::make_unique<detail::ReplyReader>();
    phase = Phase::handshaking;
    timer_armed = false;
    timer().cancel();  // the connect timeout; the command timeout is armed below
    auto add = [&](std::initializer_list<std::string_view> args, const char* what) {
      Call call;
      detail::append_command(call.bytes, std::span<const std::string_view>(args));
      call.count = 1;
      call.kind = CommandKind::read;
      call.what = what;
      call.handshake = true;
      ++handshakes;
      batch(send_own(std::move(call)).call);
    };
    const std::string db = std::to_string(options.db);
    if (options.password) {
      if (options.username) {
        add({"AUTH", *options.username, *options.password}, "AUTH");
      } else {
        add({"AUTH", *options.password}, "AUTH");
      }
    }
    if (options.db != 0) add({"SELECT", db}, "SELECT");
    if (handshakes == 0) {
      ready();
    } else {
      write();
    }
  }

  void ready() {
    phase = Phase::ready;
    backoff = std::chrono::milliseconds(0);
    next_attempt = {};
    ++stats_connects;
    flush();
  }

  // ---- write ------------------------------------------------------------------------------------

  // Appends a call just put in flight to the out buffer.
  void batch(Call& call) {
    out += call.bytes;
    bytes_batched += call.bytes.size();
    call.end = bytes_batched;
    call.written_at = SteadyClock::now();
    std::string().swap(call.bytes);
    if (!call.handshake) stats_commands += call.count;
  }

  // True when an idle socket shows EOF, a reset or stray bytes (the server went away while no
  // command was outstanding): replace it before writing, so nothing is put in doubt by a socket
  // that was dead before the command was sent.
  // (TLS session tickets are consumed by the stream and do not count.)
  bool idle_socket_dead() { return stream.idle_peer_gone(); }

  void flush() {
    if (phase != Phase::ready) return;
    if (out_offset == out.size() && has_queued()) {
      if (!has_in_flight() && idle_socket_dead()) {
        ++stats_drops;
        close_socket();
        begin_connect();
        return;
      }
      out.clear();
      out_offset = 0;
      while (has_queued() && out.size() < kMaxBatchBytes)
        batch(send_next().call);
      ++stats_writes;
    }
    write();
  }

  void write() {
    while (out_offset < out.size()) {
      net::IoResult r;
      try {
        r = stream.write_some(std::span<const char>(out).subspan(out_offset));
      } catch (const net::TlsError& e) {
        if (e.setup()) {
          refuse_tls(e.what());
        } else {
          drop(EPROTO, e.what());
        }
        return;
      } catch (const std::system_error& e) {
        drop(e.code().value(), e.code().message());
        return;
      }
      if (r.status == net::IoStatus::done) {
        out_offset += r.bytes;
        bytes_written += r.bytes;
        continue;
      }
      when_writable(
          r.status == net::IoStatus::want_read ? WaitType::wait_read : WaitType::wait_write,
          [](State& self, std::error_code ec) {
            if (ec) return;
            if (self.phase == Phase::ready) {
              self.flush();
            } else {
              self.write();
            }
          });
      break;
    }
    if (out_offset == out.size() && phase == Phase::ready && has_queued()) {
      // Everything written: start the next batch (calls that queued during this write).
      schedule_pump();
    }
    arm_read();
    arm_timer();
  }

  // ---- read -------------------------------------------------------------------------------------

  void arm_read() {
    if (!has_in_flight()) return;
    when_readable([](State& self, std::error_code ec) {
      if (!ec) self.read();
    });
  }

  void read() {
    const std::uint64_t gen = generation();
    for (;;) {
      net::IoResult r;
      try {
        r = stream.read_some(read_buffer);
      } catch (const net::TlsError& e) {
        // Under TLS 1.3 the server's verdict on the client certificate arrives with the first
        // read.
        if (e.setup()) {
          refuse_tls(e.what());
        } else {
          drop(EPROTO, e.what());
        }
        return;
      } catch (const std::system_error& e) {
        drop(e.code().value(), e.code().message());
        return;
      }
      if (r.status == net::IoStatus::closed) {
        drop(0, "Server closed the connection", /*protocol=*/false, /*eof=*/true);
        return;
      }
      if (r.status != net::IoStatus::done) break;
      if (socket_bytes_read == 0 && !tls_context &&
          net::looks_like_tls_record(std::span<const char>(read_buffer.data(), r.bytes))) {
        refuse_tls(detail::tls_record_on_plaintext());
        return;
      }
      if (socket_bytes_read == 0) {
        first_bytes.assign(read_buffer.data(), std::min<std::size_t>(r.bytes, 16));
        replied = false;
      }
      socket_bytes_read += r.bytes;
      try {
        reader->feed(read_buffer.data(), r.bytes);
        while (auto reply = reader->next()) {
          replied = true;
          deliver(std::move(*reply));
          if (gen != generation()) return;  // a handshake failure dropped the connection
        }
      } catch (const detail::ProtocolError& e) {
        if (!replied) {
          not_redis();
          return;
        }
        drop(0, std::string("protocol error: ") + e.what(), /*protocol=*/true);
        return;
      }
      if (r.bytes < read_buffer.size() && stream.buffered() == 0) break;  // drained
    }
    if (!has_in_flight()) {
      timer_armed = false;
      timer().cancel();  // idle: nothing may keep the caller's io_context running
    }
    arm_read();
  }

  void deliver(RedisReply reply) {
    if (!has_in_flight()) throw detail::ProtocolError("a reply arrived for no command");
    Call& front = oldest().call;
    front.replies.push_back(std::move(reply));
    if (front.replies.size() < front.count) return;
    Entry done = pop_oldest();
    if (done->call.handshake) {
      --handshakes;
      const RedisReply& answer = done->call.replies.front();
      if (answer.is_error()) {
        handshake_refused(done->call.what, answer.str);
        return;
      }
      if (handshakes == 0) ready();
      return;
    }
    complete(*done, nullptr, std::move(done->call.replies));
  }

  void handshake_refused(const std::string& what, const std::string& answer) {
    const std::string message = "idem redis: " + what + " on " + endpoint + " refused: " + answer;
    close_socket();
    ++stats_connect_failures;
    back_off();
    const auto refused = [&](const Pending&) {
      return std::make_exception_ptr(RedisError(RedisFailure::auth, message, /*retryable=*/false,
                                                /*in_doubt=*/false, /*timed_out=*/false,
                                                ErrorCode::store_open_failed));
    };
    fail_in_flight(refused);  // only the handshake's own calls are in flight
    fail_queued(refused);
  }

  // ---- command timeout --------------------------------------------------------------------------

  void arm_timer() {
    if (timer_armed || !has_in_flight()) return;
    timer_armed = true;
    timer().expires_at(oldest().call.written_at + options.command_timeout);
    when_timer([](State& self, std::error_code ec) {
      self.timer_armed = false;
      if (ec || !self.has_in_flight()) return;
      const auto deadline = self.oldest().call.written_at + self.options.command_timeout;
      if (SteadyClock::now() >= deadline) {
        self.drop(ETIMEDOUT, "no reply");
      } else {
        self.arm_timer();
      }
    });
  }

  // ---- failure ----------------------------------------------------------------------------------

  // The socket failed: every written call gets its classified error; the queue waits for the
  // next connection.
  void drop(int error_number, const std::string& detail, bool protocol = false, bool eof = false) {
    if (const std::string cause = tls_mismatch(error_number, eof); !cause.empty()) {
      refuse_tls(cause);
      return;
    }
    const bool was_handshake = phase == Phase::handshaking;
    ++stats_drops;
    const std::uint64_t written = bytes_written;
    close_socket();
    const bool timed_out = is_timeout(error_number);
    fail_in_flight([&](const Pending& pending) {
      const Call& call = pending.call;
      const bool sent = call.end <= written;
      const bool in_doubt = sent && call.kind != CommandKind::read;
      const bool retryable = !in_doubt || call.kind == CommandKind::idempotent_write;
      std::string message = "idem redis: " + call.what + " on " + endpoint + ": " + detail;
      if (timed_out) message += " (timed out: no answer within command_timeout)";
      if (eof) message += " (the server closed the connection)";
      if (in_doubt) {
        message += "; the command was sent and its reply lost: it may or may not have been applied";
      }
      return std::make_exception_ptr(
          RedisError(protocol ? RedisFailure::protocol : RedisFailure::io, message, retryable,
                     in_doubt, timed_out));
    });
    if (was_handshake) {
      connect_failed(error_number, detail);
      return;
    }
    if (has_queued()) begin_connect();
  }

  // ---- data -------------------------------------------------------------------------------------

  const RedisOptions options;
  const std::shared_ptr<const net::TlsContext> tls_context;  // null without TLS
  const std::string endpoint;
  net::Stream stream;  // the engine watches its descriptor
  std::unique_ptr<detail::ReplyReader> reader;
  std::vector<net::Address> addresses;
  std::size_t address_index = 0;
  SteadyClock::time_point next_attempt{};
  std::chrono::milliseconds backoff{0};

  Phase phase = Phase::idle;
  bool timer_armed = false;  // the timer is the command timeout's
  bool tls_handshaking = false;
  std::size_t handshakes = 0;           // AUTH/SELECT replies still awaited
  std::uint64_t socket_bytes_read = 0;  // on this socket: 0 until its first reply
  bool replied = false;                 // a whole reply arrived on this socket
  std::string first_bytes;              // the first bytes of this socket, for wrong_protocol
  std::string out;
  std::size_t out_offset = 0;
  std::uint64_t bytes_batched = 0;
  std::uint64_t bytes_written = 0;
  std::array<char, kReadChunk> read_buffer{};

  std::atomic<std::uint64_t> stats_connects{0}, stats_connect_failures{0}, stats_drops{0},
      stats_commands{0}, stats_writes{0};
  const ::idem::detail::ForkOwner process;
};

namespace {

RedisOptions validated(RedisOptions options) {
  options.validate();
  return options;
}
}  // namespace

AsyncConnection::AsyncConnection(asio::any_io_executor executor, RedisOptions options)
    : AsyncConnection(executor, validated(std::move(options)), nullptr) {}

AsyncConnection::AsyncConnection(asio::any_io_executor executor, RedisOptions options,
                                 std::shared_ptr<const net::TlsContext> tls) {
  options.validate();
  if (!tls) tls = detail::make_tls_context(options);
  state_ = std::make_shared<State>(std::move(executor), std::move(options), std::move(tls));
}

AsyncConnection::~AsyncConnection() {
  state_->shut_down();
}

// command() and pipeline() are plain functions: they encode the arguments and copy `what` at
// once, then return the coroutine that owns them (an awaitable starts only when awaited).
async::Task<RedisReply> AsyncConnection::command(std::span<const std::string_view> args,
                                                 CommandKind kind, std::string_view what) {
  CommandBatch batch;
  batch.add(args);
  return one(state_, std::move(batch), kind, std::string(what));
}

async::Task<RedisReply> AsyncConnection::command(std::initializer_list<std::string_view> args,
                                                 CommandKind kind, std::string_view what) {
  return command(std::span<const std::string_view>(args.begin(), args.size()), kind, what);
}

async::Task<Replies> AsyncConnection::pipeline(CommandBatch batch, CommandKind kind,
                                               std::string_view what) {
  return many(state_, std::move(batch), kind, std::string(what));
}

async::Task<RedisReply> AsyncConnection::one(std::shared_ptr<State> state, CommandBatch batch,
                                             CommandKind kind, std::string what) {
  Replies replies = co_await many(state, std::move(batch), kind, what);
  if (replies.size() != 1) {
    throw RedisError(RedisFailure::protocol,
                     "idem redis: " + what + " on " + state->endpoint + ": expected one reply",
                     /*retryable=*/false, /*in_doubt=*/false);
  }
  co_return std::move(replies.front());
}

async::Task<Replies> AsyncConnection::many(std::shared_ptr<State> state, CommandBatch batch,
                                           CommandKind kind, std::string what) {
  state->process.use("this Redis async connection (of a recorder or store)");
  if (batch.empty()) co_return Replies{};
  // Durability (min_replicas): the replicas must confirm the call's writes before they count as
  // done; the WAIT rides in the same call, so it follows them on the connection.
  const std::size_t min_replicas = state->options.min_replicas;
  const bool wait = min_replicas > 0 && kind != CommandKind::read;
  if (wait) {
    batch.add({"WAIT", std::to_string(min_replicas),
               std::to_string(state->options.replica_timeout.count())});
  }
  const std::size_t count = batch.size();
  Replies replies = co_await asio::async_initiate<decltype(asio::use_awaitable),
                                                  void(std::exception_ptr, Replies)>(
      [&](auto handler) {
        Call call;
        call.bytes = batch.take_bytes();
        call.count = count;
        call.kind = kind;
        call.what = wait ? what : std::move(what);
        state->start(std::move(handler), std::move(call));
      },
      asio::use_awaitable);
  if (wait) {
    const RedisReply confirmed = std::move(replies.back());
    replies.pop_back();
    const bool no_write = std::all_of(replies.begin(), replies.end(),
                                      [](const RedisReply& r) { return r.is_error(); });
    detail::check_wait(confirmed, min_replicas, state->options.replica_timeout, no_write, kind,
                       what, state->endpoint);
  }
  co_return replies;
}

AsyncConnectionStats AsyncConnection::stats() const {
  AsyncConnectionStats s;
  s.connects = state_->stats_connects.load();
  s.connect_failures = state_->stats_connect_failures.load();
  s.drops = state_->stats_drops.load();
  s.commands = state_->stats_commands.load();
  s.writes = state_->stats_writes.load();
  s.cancelled = state_->cancelled();
  return s;
}

asio::any_io_executor AsyncConnection::get_executor() const noexcept {
  return state_->get_executor().get_inner_executor();
}

const RedisOptions& AsyncConnection::options() const noexcept {
  return state_->options;
}

const std::string& AsyncConnection::endpoint() const noexcept {
  return state_->endpoint;
}

// ---- AsyncConnectionPool ----------------------------------------------------------------------

AsyncConnectionPool::AsyncConnectionPool(asio::any_io_executor executor, RedisOptions options)
    : options_(validated(std::move(options))) {
  if (options_.is_cluster()) {
    throw NotSupported(
        "idem redis: the coroutine face does not reach a Redis Cluster yet (" +
        options_.endpoint() +
        "): use the blocking RedisIdempotencyRecorder / RedisIdempotencyStore, or one primary");
  }
  if (options_.is_sentinel()) {
    throw NotSupported(
        "idem redis: the coroutine face does not ask Redis Sentinel for the primary yet (" +
        options_.endpoint() +
        "): use the blocking RedisIdempotencyRecorder / RedisIdempotencyStore, or the primary's "
        "own redis:// URL");
  }
  const auto tls = detail::make_tls_context(options_);  // one context for every connection
  for (std::size_t i = 0; i < options_.async_connections; ++i)
    connections_.push_back(std::make_unique<AsyncConnection>(executor, options_, tls));
}

AsyncConnectionPool::executor_type AsyncConnectionPool::get_executor() const noexcept {
  return connections_.front()->get_executor();
}

AsyncConnection& AsyncConnectionPool::next() noexcept {
  const std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
  return *connections_[i % connections_.size()];
}

AsyncConnectionStats AsyncConnectionPool::stats() const {
  AsyncConnectionStats total;
  for (const auto& connection : connections_) {
    const AsyncConnectionStats s = connection->stats();
    total.connects += s.connects;
    total.connect_failures += s.connect_failures;
    total.drops += s.drops;
    total.commands += s.commands;
    total.writes += s.writes;
    total.cancelled += s.cancelled;
  }
  return total;
}

}  // namespace idem::redis
