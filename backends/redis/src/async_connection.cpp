// The pipelined connection of the coroutine face: the Redis protocol over idem's pipelined-
// connection engine (idem/async/detail/pipeline.hpp), which owns the calls, the strand, the
// socket's waits and the ends. Callers enter the strand (at once when they may) and are completed
// on their own executor (at once, after a reply's readiness step, when it runs on this thread).
#include "idem/redis/async_connection.hpp"

#include <algorithm>
#include <array>
#include <asio/async_result.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <deque>
#include <exception>
#include <system_error>
#include <utility>
#include <vector>

#include "async_cluster.hpp"
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
// A subscriber keeps at most this many messages that arrived while nobody listened (the oldest go
// first: a listener only needs to hear that something changed).
constexpr std::size_t kMaxKeptMessages = 64;
// The handshake calls of a connection found through Sentinel (told apart by their `what`).
constexpr const char* kSentinelAsk = "SENTINEL get-master-addr-by-name";
constexpr const char* kRoleCheck = "ROLE";

// One call of the connection: its commands and, once written, what reading its replies needs.
struct Call {
  std::string bytes;      // emptied once batched
  std::size_t count = 0;  // replies expected
  CommandKind kind = CommandKind::write;
  std::string what;
  bool handshake = false;   // AUTH/SELECT of a new connection (the engine's "own" call)
  bool subscribes = false;  // SUBSCRIBE/SSUBSCRIBE: its success makes the connection a subscriber
  bool listens = false;     // next_message(): nothing written; ends with a message or at `deadline`
  SteadyClock::time_point deadline{};
  std::uint64_t end = 0;  // stream offset just past this call's bytes, once batched
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
        endpoint(options.endpoint()),
        target_host(options.host),
        target_port(options.port) {}

  // The engine's view of the descriptor goes before the stream closes it.
  ~State() { unwatch(); }

  // ---- the engine's hooks (on the strand) ------------------------------------------------------

  void pump() {
    if (subscription_lost) {
      // A subscriber's connection dropped: nothing reconnects it (a new connection would not be
      // subscribed), so whatever is asked of it now fails.
      fail_queued([&](const Pending&) { return subscription_gone(); });
      return;
    }
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

  // A readiness step ran, and so did the callers it resumed on this thread, with the calls they
  // started written (the engine's done()). The command timeout stays armed from one call to the
  // next as long as calls follow each other (a timer set for an earlier call only fires early and
  // is set again for the oldest call in flight); once nothing is in flight it stops: an idle
  // connection keeps nothing pending, so an idle io_context returns from run().
  void settle() {
    just_drained = false;
    if (phase != Phase::ready || has_in_flight()) return;
    timer_armed = false;
    timer().cancel();
  }

  void close_transport() noexcept {
    if (subscribed) {
      subscribed = false;
      subscription_lost = true;
      pubsub.store(PubSub::lost, std::memory_order_relaxed);
      kept_messages.clear();
    }
    stream.close();
    if (!discovering) primary_named = false;  // a new connection asks the sentinels again
    phase = Phase::idle;
    tls_handshaking = false;
    just_drained = false;
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
    if (options.is_sentinel() && !discovering && !primary_named) {
      // Sentinel: every new connection starts by asking a sentinel where the primary is.
      discovering = true;
      sentinels_asked = 0;
      sentinel_problems.clear();
      sentinels_unaware = 0;
    }
    if (discovering) {
      const RedisNode& sentinel =
          options
              .sentinel_nodes[(sentinel_first + sentinels_asked) % options.sentinel_nodes.size()];
      target_host = sentinel.host;
      target_port = sentinel.port;
    }
    try {
      addresses = net::resolve(target_host, target_port);
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

  // Every queued request fails with `error`; the next connect waits out the backoff. While asking
  // the sentinels, the next sentinel is asked first.
  void fail_connect(const RedisError& error) {
    if (discovering) {
      sentinel_failed(error.what(), /*unaware=*/false);
      return;
    }
    primary_named = false;  // the next connection asks the sentinels again
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
      stream.start_tls(tls_context, target_host);
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
    discovering = false;
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
    discovering = false;
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
      return detail::tls_session_refused(addresses, tls_context, target_host,
                                         options.connect_timeout);
    }
    return detail::plaintext_to_tls_port(addresses, options.connect_timeout);
  }

  // ---- Sentinel ---------------------------------------------------------------------------------

  // The sentinel asked last did not name the primary: ask the next one, or fail the queued calls
  // once every sentinel was asked (retryable, unless every one said it monitors no such name).
  void sentinel_failed(const std::string& problem, bool unaware) {
    close_socket();
    sentinel_problems += (sentinel_problems.empty() ? "" : "; ") + problem;
    if (unaware) ++sentinels_unaware;
    if (++sentinels_asked < options.sentinel_nodes.size()) {
      phase = Phase::idle;
      begin_connect();
      return;
    }
    discovering = false;
    const bool config = sentinels_unaware == options.sentinel_nodes.size();
    fail_connect(RedisError(RedisFailure::connect,
                            config ? "idem redis: no sentinel of " + endpoint +
                                         " monitors a primary named '" + options.sentinel_master +
                                         "' (check the name after the hosts in the URL)"
                                   : "idem redis: connect to " + endpoint +
                                         ": no sentinel named the primary: " + sentinel_problems,
                            /*retryable=*/!config, /*in_doubt=*/false, /*timed_out=*/false,
                            config ? ErrorCode::config_error : ErrorCode::store_error));
  }

  // The answer to SENTINEL get-master-addr-by-name: connect to the primary it names.
  void sentinel_answered(const RedisReply& answer) {
    const std::string sentinel = target_host + ":" + std::to_string(target_port);
    if (answer.is_nil()) {
      sentinel_failed(
          "sentinel " + sentinel + " monitors no primary named '" + options.sentinel_master + "'",
          /*unaware=*/true);
      return;
    }
    int port = 0;
    if (answer.type == RedisReply::Type::array && answer.elements.size() == 2) {
      const std::string& text = answer.elements[1].str;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
      if (ec != std::errc() || end != text.data() + text.size() || port > 65535) port = 0;
    }
    if (port <= 0 || answer.elements[0].str.empty()) {
      sentinel_failed("sentinel " + sentinel + " answered " +
                          (answer.is_error() ? answer.str : std::string("no address")),
                      /*unaware=*/false);
      return;
    }
    sentinel_first = (sentinel_first + sentinels_asked) % options.sentinel_nodes.size();
    close_socket();
    discovering = false;
    primary_named = true;
    target_host = answer.elements[0].str;
    target_port = port;
    phase = Phase::idle;
    begin_connect();
  }

  // The answer to ROLE on the server the sentinels named: a primary, or (a failover in progress)
  // not yet or no longer one.
  void role_answered(const RedisReply& answer) {
    if (answer.type == RedisReply::Type::array && !answer.elements.empty() &&
        answer.elements[0].str == "master") {
      return;
    }
    const std::string role = answer.is_error()         ? answer.str
                             : answer.elements.empty() ? std::string("(empty)")
                                                       : answer.elements[0].str;
    close_socket();
    fail_connect(RedisError(RedisFailure::connect,
                            "idem redis: connect to " + endpoint + ": the sentinels name " +
                                target_host + ":" + std::to_string(target_port) +
                                " as primary, but it answers ROLE " + role +
                                " (a failover in progress?)",
                            /*retryable=*/true, /*in_doubt=*/false));
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
    const auto& username = discovering ? options.sentinel_username : options.username;
    const auto& password = discovering ? options.sentinel_password : options.password;
    if (password) {
      if (username) {
        add({"AUTH", *username, *password}, "AUTH");
      } else {
        add({"AUTH", *password}, "AUTH");
      }
    }
    if (discovering) {
      add({"SENTINEL", "get-master-addr-by-name", options.sentinel_master}, kSentinelAsk);
    } else {
      if (options.db != 0) add({"SELECT", db}, "SELECT");
      if (options.is_sentinel()) add({"ROLE"}, kRoleCheck);
    }
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
    if (!call.handshake && !call.listens) stats_commands += call.count;
  }

  // True when an idle socket shows EOF, a reset or stray bytes (the server went away while no
  // command was outstanding): replace it before writing, so nothing is put in doubt by a socket
  // that was dead before the command was sent.
  // (TLS session tickets are consumed by the stream and do not count.)
  bool idle_socket_dead() { return stream.idle_peer_gone(); }

  void flush() {
    if (phase != Phase::ready) return;
    if (out_offset == out.size() && has_queued()) {
      // (Not when the socket was read to its end a moment ago, in the step that resumed the
      // caller of this call: that read saw what the check would.)
      if (!has_in_flight() && !subscribed &&
          (primary_demoted || (!just_drained && idle_socket_dead()))) {
        primary_demoted = false;
        primary_named = false;
        ++stats_drops;
        close_socket();
        begin_connect();
        return;
      }
      out.clear();
      out_offset = 0;
      while (has_queued() && out.size() < kMaxBatchBytes)
        batch(send_next().call);
      if (!out.empty()) ++stats_writes;  // (a listener writes nothing)
    }
    write();
    if (subscribed) hand_out_messages();
  }

  // One read or write of the stream (`step`), into `r`. A failure ends the connection: a refused
  // TLS handshake refuses it (refuse_tls), anything else drops it; then false.
  template <class Io>
  bool stream_io(Io step, net::IoResult& r) {
    try {
      r = step();
      return true;
    } catch (const net::TlsError& e) {
      if (e.setup()) {
        refuse_tls(e.what());
      } else {
        drop(EPROTO, e.what());
      }
    } catch (const std::system_error& e) {
      drop(e.code().value(), e.code().message());
    }
    return false;
  }

  void write() {
    while (out_offset < out.size()) {
      net::IoResult r;
      if (!stream_io(
              [&] { return stream.write_some(std::span<const char>(out).subspan(out_offset)); },
              r)) {
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
    if (!has_in_flight() && !subscribed) return;  // a subscriber reads whenever a message comes
    when_readable([](State& self, std::error_code ec) {
      if (!ec) self.read();
    });
  }

  void read() {
    const std::uint64_t gen = generation();
    for (;;) {
      net::IoResult r;
      // Under TLS 1.3 the server's verdict on the client certificate arrives with the first read.
      if (!stream_io([&] { return stream.read_some(read_buffer); }, r)) return;
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
    just_drained = true;
    arm_read();
  }

  void deliver(RedisReply reply) {
    if (subscribed) {
      // Everything a subscriber reads is a message ([s]message, or [s]unsubscribe when the
      // server ends the subscription): it goes to the oldest listener, or is kept for the next.
      kept_messages.push_back(std::move(reply));
      if (kept_messages.size() > kMaxKeptMessages) kept_messages.pop_front();
      hand_out_messages();
      return;
    }
    if (!has_in_flight()) throw detail::ProtocolError("a reply arrived for no command");
    Call& front = oldest().call;
    front.replies.push_back(std::move(reply));
    if (front.replies.size() < front.count) return;
    Entry done = pop_oldest();
    if (done->call.handshake) {
      --handshakes;
      const RedisReply& answer = done->call.replies.front();
      if (done->call.what == kSentinelAsk) {
        sentinel_answered(answer);
        return;
      }
      if (done->call.what == kRoleCheck) {
        role_answered(answer);
        if (phase != Phase::handshaking) return;
      } else if (answer.is_error()) {
        handshake_refused(done->call.what, answer.str);
        return;
      }
      if (handshakes == 0) ready();
      return;
    }
    // A demoted primary refuses writes: with Sentinel, the next connection asks again.
    if (options.is_sentinel()) {
      for (const RedisReply& got : done->call.replies) {
        if (got.is_error() && got.str.rfind("READONLY", 0) == 0) primary_demoted = true;
      }
    }
    if (done->call.subscribes && !done->call.replies.front().is_error()) {
      subscribed = true;
      pubsub.store(PubSub::listening, std::memory_order_relaxed);
    }
    complete(*done, nullptr, std::move(done->call.replies));
  }

  // ---- pub/sub ----------------------------------------------------------------------------------

  // A subscriber's listeners (next_message() calls, in flight with nothing written) take the
  // messages kept, oldest first; a listener whose caller went (cancelled) is skipped. Then the
  // timer is set for the oldest listener's deadline.
  void hand_out_messages() {
    while (has_in_flight() && (!oldest().completion || !kept_messages.empty())) {
      Entry listener = pop_oldest();
      if (!listener->completion) continue;
      Replies message;
      message.push_back(std::move(kept_messages.front()));
      kept_messages.pop_front();
      complete(*listener, nullptr, std::move(message));
    }
    arm_listen_timer();
  }

  // Listeners whose deadline passed end with no message; the timer is set for the next one.
  void arm_listen_timer() {
    if (!has_in_flight()) return;
    timer().expires_at(oldest().call.deadline);  // replaces a wait set for another listener
    when_timer([](State& self, std::error_code ec) {
      if (ec) return;
      const auto now = SteadyClock::now();
      while (self.has_in_flight() &&
             (!self.oldest().completion || self.oldest().call.deadline <= now)) {
        Entry listener = self.pop_oldest();
        self.complete(*listener, nullptr, Replies{});
      }
      self.arm_listen_timer();
    });
  }

  std::exception_ptr subscription_gone() const {
    return std::make_exception_ptr(
        RedisError(RedisFailure::io,
                   "idem redis: wait on " + endpoint +
                       ": the subscription ended with its connection (nothing reconnects it)",
                   /*retryable=*/true, /*in_doubt=*/false));
  }

  void handshake_refused(const std::string& what, const std::string& answer) {
    const std::string message = "idem redis: " + what + " on " + endpoint + " refused: " + answer;
    discovering = false;
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
    if (subscribed || timer_armed || !has_in_flight()) return;  // a subscriber's is the listeners'
    timer_armed = true;
    timer().expires_at(oldest().call.written_at + options.command_timeout);
    when_timer([](State& self, std::error_code ec) {
      self.timer_armed = false;
      if (ec || !self.has_in_flight() || self.subscribed) return;
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
  // The socket was read to its end in the readiness step whose callers are being resumed (until
  // settle()): a call they start meets a socket just seen empty and alive, as a poll would.
  bool just_drained = false;
  std::string first_bytes;  // the first bytes of this socket, for wrong_protocol
  std::string out;
  std::size_t out_offset = 0;
  std::uint64_t bytes_batched = 0;
  std::uint64_t bytes_written = 0;
  std::array<char, kReadChunk> read_buffer{};

  // Sentinel: where the next connection goes (the server itself without Sentinel), and the state
  // of asking the sentinels for it.
  std::string target_host;
  int target_port = 0;
  bool discovering = false;         // this socket is to a sentinel, asking for the primary
  bool primary_named = false;       // target_host:target_port is the primary a sentinel named
  bool primary_demoted = false;     // a reply said READONLY: reconnect before the next write
  std::size_t sentinel_first = 0;   // the sentinel that answered last
  std::size_t sentinels_asked = 0;  // in this round
  std::size_t sentinels_unaware = 0;
  std::string sentinel_problems;

  // Pub/sub (subscribe(), next_message()): a connection whose SUBSCRIBE succeeded only listens.
  bool subscribed = false;
  bool subscription_lost = false;  // it was subscribed and dropped: it stays unusable
  // For callers on other threads: subscribe() sent (or done), listening, lost since.
  enum class PubSub { none, subscribing, listening, lost };
  std::atomic<PubSub> pubsub{PubSub::none};
  std::deque<RedisReply> kept_messages;

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
  if (options.is_cluster()) {
    cluster_ = std::make_shared<detail::AsyncCluster>(std::move(executor), std::move(options),
                                                      std::move(tls));
    return;
  }
  state_ = std::make_shared<State>(std::move(executor), std::move(options), std::move(tls));
}

AsyncConnection::~AsyncConnection() {
  if (cluster_) {
    cluster_->shut_down();
  } else {
    state_->shut_down();
  }
}

namespace {
async::Task<RedisReply> cluster_one(std::shared_ptr<detail::AsyncCluster> cluster,
                                    CommandBatch batch, CommandKind kind, std::string what) {
  std::vector<RedisReply> replies = co_await detail::AsyncCluster::run(
      std::move(cluster), batch.take_bytes(), batch.size(), kind, std::move(what));
  co_return std::move(replies.front());
}
}  // namespace

// command() and pipeline() are plain functions: they encode the arguments and copy `what` at
// once, then return the coroutine that owns them (an awaitable starts only when awaited).
async::Task<RedisReply> AsyncConnection::command(std::span<const std::string_view> args,
                                                 CommandKind kind, std::string_view what) {
  CommandBatch batch;
  batch.add(args);
  if (cluster_) return cluster_one(cluster_, std::move(batch), kind, std::string(what));
  return one(state_, std::move(batch), kind, std::string(what));
}

async::Task<RedisReply> AsyncConnection::command(std::initializer_list<std::string_view> args,
                                                 CommandKind kind, std::string_view what) {
  return command(std::span<const std::string_view>(args.begin(), args.size()), kind, what);
}

async::Task<Replies> AsyncConnection::pipeline(CommandBatch batch, CommandKind kind,
                                               std::string_view what) {
  if (cluster_) {
    if (batch.empty()) return many(nullptr, std::move(batch), kind, std::string(what));
    const std::size_t count = batch.size();
    return detail::AsyncCluster::run(cluster_, batch.take_bytes(), count, kind, std::string(what));
  }
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
  if (batch.empty()) co_return Replies{};
  state->process.use("this Redis async connection (of a recorder or store)");
  if (state->pubsub.load(std::memory_order_relaxed) != State::PubSub::none) {
    // Its replies would be read as messages.
    throw InvalidArgument("idem redis: " + what + " on " + state->endpoint +
                          ": the connection is a subscriber (it only listens)");
  }
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

namespace {
// Starts `call` on `state` and waits for its replies.
async::Task<Replies> run_call(std::shared_ptr<AsyncConnection::State> state, Call call) {
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable),
                                          void(std::exception_ptr, Replies)>(
      [&](auto handler) { state->start(std::move(handler), std::move(call)); },
      asio::use_awaitable);
}
}  // namespace

async::Task<RedisReply> AsyncConnection::subscribe(std::string_view channel) {
  if (cluster_) {
    auto [reply, node] = co_await detail::AsyncCluster::subscribe(cluster_, std::string(channel));
    if (!reply.is_error()) subscribed_node_ = std::move(node);
    co_return reply;
  }
  co_return co_await send_subscribe("SUBSCRIBE", channel);
}

async::Task<RedisReply> AsyncConnection::send_subscribe(std::string_view command,
                                                        std::string_view channel) {
  state_->process.use("this Redis async connection");
  auto none = State::PubSub::none;
  if (!state_->pubsub.compare_exchange_strong(none, State::PubSub::subscribing)) {
    throw InvalidArgument("idem redis: subscribe() on " + endpoint() +
                          ": the connection has subscribed already (one subscribe per connection)");
  }
  Call call;
  const std::array<std::string_view, 2> args{command, channel};
  detail::append_command(call.bytes, args);
  call.count = 1;
  call.kind = CommandKind::read;
  call.what = "subscribe";
  call.subscribes = true;
  // Refused (an ACL without pub/sub) or failed: the connection stays an ordinary one.
  const auto not_subscribed = [&] {
    auto subscribing = State::PubSub::subscribing;
    state_->pubsub.compare_exchange_strong(subscribing, State::PubSub::none);
  };
  Replies replies;
  try {
    replies = co_await run_call(state_, std::move(call));
  } catch (...) {
    not_subscribed();
    throw;
  }
  if (replies.front().is_error()) not_subscribed();
  co_return std::move(replies.front());
}

async::Task<std::optional<RedisReply>> AsyncConnection::next_message(
    std::chrono::steady_clock::time_point deadline) {
  if (cluster_) {
    if (!subscribed_node_) {
      throw InvalidArgument("idem redis: next_message() on " + endpoint() +
                            " before a successful subscribe()");
    }
    co_return co_await subscribed_node_->next_message(deadline);
  }
  switch (state_->pubsub.load(std::memory_order_relaxed)) {
    case State::PubSub::listening:
      break;
    case State::PubSub::lost:
      std::rethrow_exception(state_->subscription_gone());
    default:
      throw InvalidArgument("idem redis: next_message() on " + endpoint() +
                            " before a successful subscribe()");
  }
  Call call;
  call.count = 1;
  call.kind = CommandKind::read;
  call.what = "wait";
  call.listens = true;
  call.deadline = deadline;
  Replies message = co_await run_call(state_, std::move(call));
  if (message.empty()) co_return std::nullopt;
  co_return std::move(message.front());
}

AsyncConnectionStats AsyncConnection::stats() const {
  if (cluster_) return cluster_->stats();
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
  if (cluster_) return cluster_->executor();
  return state_->get_executor().get_inner_executor();
}

const RedisOptions& AsyncConnection::options() const noexcept {
  return cluster_ ? cluster_->options() : state_->options;
}

const std::string& AsyncConnection::endpoint() const noexcept {
  return cluster_ ? cluster_->endpoint() : state_->endpoint;
}

// ---- AsyncConnectionPool ----------------------------------------------------------------------

AsyncConnectionPool::AsyncConnectionPool(asio::any_io_executor executor, RedisOptions options)
    : options_(validated(std::move(options))),
      tls_(detail::make_tls_context(options_)) {  // one context for every connection
  // On a cluster one router holds a pipelined connection per primary.
  const std::size_t count = options_.is_cluster() ? 1 : options_.async_connections;
  for (std::size_t i = 0; i < count; ++i)
    connections_.push_back(std::make_unique<AsyncConnection>(executor, options_, tls_));
}

std::unique_ptr<AsyncConnection> AsyncConnectionPool::open_dedicated() const {
  return std::make_unique<AsyncConnection>(get_executor(), options_, tls_);
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
  for (const auto& connection : connections_)
    detail::add_stats(total, connection->stats());
  return total;
}

}  // namespace idem::redis
