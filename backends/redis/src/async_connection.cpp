// The pipelined connection of the coroutine face. Everything that touches the socket, the queues
// or the parser runs on one strand (State::strand); callers only post to it and are completed by
// a post to their own executor. Handlers of a previous socket are told apart by `generation`.
#include "idem/redis/async_connection.hpp"

#include <poll.h>

#include <algorithm>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/bind_executor.hpp>
#include <asio/error.hpp>
#include <asio/execution_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/query.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/system_error.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <exception>
#include <mutex>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

#include "idem/async/detail/shutdown_registry.hpp"
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

std::exception_ptr aborted() {
  return std::make_exception_ptr(asio::system_error(asio::error::operation_aborted));
}

// A waiting call: completes once, by a post to the caller's executor.
struct Waiter {
  virtual ~Waiter() = default;
  virtual void complete(std::exception_ptr error, Replies replies) = 0;
};

template <class Handler>
struct WaiterFor final : Waiter {
  WaiterFor(Handler&& h, asio::any_io_executor fallback)
      : handler(std::move(h)), executor(asio::get_associated_executor(handler, fallback)) {}

  void complete(std::exception_ptr error, Replies replies) override {
    auto slot = asio::get_associated_cancellation_slot(handler);
    asio::post(executor, [h = std::move(handler), slot, error = std::move(error),
                          replies = std::move(replies)]() mutable {
      // On the caller's executor, where its cancellation is emitted: the slot's handler
      // (which refers to this call) goes before the caller resumes. The error is moved
      // here, not copied, so its last reference is released where it is read.
      if (slot.is_connected()) slot.clear();
      std::move(h)(std::move(error), std::move(replies));
    });
  }

  Handler handler;
  asio::associated_executor_t<Handler, asio::any_io_executor> executor;
};

struct Request {
  std::uint64_t id = 0;
  std::string bytes;
  std::size_t count = 0;  // replies expected
  CommandKind kind = CommandKind::write;
  std::string what;
  bool handshake = false;  // AUTH/SELECT of a new connection (no waiter)
  std::uint64_t end = 0;   // stream offset just past this request's bytes, once batched
  SteadyClock::time_point written_at{};
  Replies replies;
  std::unique_ptr<Waiter> waiter;  // null once the caller was completed (cancelled)
};

bool is_timeout(int error_number) {
  return error_number == ETIMEDOUT || error_number == EAGAIN || error_number == EWOULDBLOCK;
}

}  // namespace

struct AsyncConnection::State : std::enable_shared_from_this<AsyncConnection::State> {
  enum class Phase { idle, backoff, connecting, handshaking, ready };
  using Registry = async::detail::ShutdownRegistry<State>;

  State(asio::any_io_executor executor, RedisOptions opts,
        std::shared_ptr<const net::TlsContext> tls)
      : options(std::move(opts)),
        tls_context(std::move(tls)),
        endpoint(options.endpoint()),
        strand(asio::make_strand(executor)),
        descriptor(strand),
        timer(strand),
        registry(Registry::of(strand.get_inner_executor())) {
    registry.add(this);
  }

  ~State() {
    registry.remove(this);
    if (descriptor.is_open()) (void)descriptor.release();  // the Stream owns the descriptor
  }

  // ---- called from any thread ----------------------------------------------------------------

  template <class Handler>
  void start(Handler&& handler, std::string bytes, std::size_t count, CommandKind kind,
             std::string what) {
    auto request = std::make_unique<Request>();
    request->id = next_id.fetch_add(1, std::memory_order_relaxed);
    request->bytes = std::move(bytes);
    request->count = count;
    request->kind = kind;
    request->what = std::move(what);
    auto slot = asio::get_associated_cancellation_slot(handler);
    request->waiter = std::make_unique<WaiterFor<std::decay_t<Handler>>>(
        std::forward<Handler>(handler), asio::any_io_executor(strand));
    if (slot.is_connected()) {
      slot.assign([self = shared_from_this(), id = request->id](asio::cancellation_type) {
        asio::post(self->strand, [self, id] { self->cancel(id); });
      });
    }
    asio::post(strand, [self = shared_from_this(), r = std::move(request)]() mutable {
      self->submit(std::move(r));
    });
  }

  void shut_down() {
    asio::post(strand, [self = shared_from_this()] { self->close(); });
  }

  // ---- on the strand ---------------------------------------------------------------------------

  void submit(std::unique_ptr<Request> request) {
    if (closed) {
      request->waiter->complete(aborted(), {});
      return;
    }
    queue.push_back(std::move(request));
    if (phase == Phase::ready) {
      // Not at once: the calls that are already posted to the strand join this batch.
      if (!flush_scheduled) {
        flush_scheduled = true;
        asio::post(strand, [self = shared_from_this()] {
          self->flush_scheduled = false;
          self->flush();
        });
      }
      return;
    }
    pump();
  }

  void pump() {
    switch (phase) {
      case Phase::idle:
        if (!queue.empty()) begin_connect();
        break;
      case Phase::ready:
        flush();
        break;
      default:  // backoff, connecting, handshaking: the queue is written once ready
        break;
    }
  }

  void cancel(std::uint64_t id) {
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if ((*it)->id == id) {  // not written: withdrawn
        auto request = std::move(*it);
        queue.erase(it);
        ++stats_cancelled;
        request->waiter->complete(aborted(), {});
        return;
      }
    }
    for (auto& request : inflight) {
      if (request->id == id && request->waiter) {  // written: its reply is still read, unseen
        ++stats_cancelled;
        std::exchange(request->waiter, nullptr)->complete(cancelled_after_write(*request), {});
        return;
      }
    }
  }

  // What a call whose command was handed to the socket gets when it is cancelled: a read ends
  // with operation_aborted (nothing changed); a write may have run, so its outcome is in doubt,
  // as after a lost reply (retryable when repeating it is harmless), never "nothing happened".
  std::exception_ptr cancelled_after_write(const Request& request) const {
    if (request.kind == CommandKind::read) return aborted();
    return std::make_exception_ptr(RedisError(
        RedisFailure::io,
        "idem redis: " + request.what + " on " + endpoint +
            ": cancelled after the command was sent: it may or may not have been applied",
        /*retryable=*/request.kind == CommandKind::idempotent_write, /*in_doubt=*/true));
  }

  void close() {
    closed = true;
    for (auto& request : inflight)
      if (request->waiter) std::exchange(request->waiter, nullptr)->complete(aborted(), {});
    for (auto& request : queue)
      request->waiter->complete(aborted(), {});
    queue.clear();
    inflight.clear();
    close_socket();
    phase = Phase::idle;
  }

  // The strand's execution context is shutting down (nothing runs it any more): the calls still
  // queued or written are destroyed without being completed, as Asio destroys every handler
  // pending on a context that goes, and the socket is closed. Their handlers own this state (a
  // coroutine frame holds it, often with the recorder or store that holds the connection), so
  // keeping them would keep the state, its socket and everything the frames own, forever.
  void abandon() noexcept {
    closed = true;
    auto queued = std::move(queue);
    auto written = std::move(inflight);
    queue.clear();
    inflight.clear();
    close_socket();
    phase = Phase::idle;
    // `queued` and `written` go here, with the handlers (and coroutine frames) they own.
  }

  void close_socket() {
    ++generation;
    if (descriptor.is_open()) (void)descriptor.release();  // cancels its waits
    stream.close();
    tls_handshaking = false;
    socket_bytes_read = 0;
    reading = writing = false;
    timer_armed = false;
    timer.cancel();
    out.clear();
    out_offset = 0;
  }

  // ---- connect ----------------------------------------------------------------------------------

  void begin_connect() {
    const auto now = SteadyClock::now();
    if (now < next_attempt) {
      phase = Phase::backoff;
      timer.expires_at(next_attempt);
      timer.async_wait([self = shared_from_this(), gen = generation](std::error_code ec) {
        if (ec || gen != self->generation || self->phase != Phase::backoff) return;
        self->phase = Phase::idle;
        self->pump();
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
    connect_deadline = now + options.connect_timeout;
    timer.expires_at(connect_deadline);
    timer.async_wait([self = shared_from_this(), gen = generation](std::error_code ec) {
      if (ec || gen != self->generation || self->phase != Phase::connecting) return;
      const bool in_tls = self->tls_handshaking;
      self->close_socket();
      if (in_tls) {
        const std::string cause =
            detail::tls_to_plaintext_port(self->addresses, self->options.connect_timeout);
        if (!cause.empty()) {
          self->refuse_tls(cause);
          return;
        }
      }
      self->connect_failed(ETIMEDOUT, std::string(in_tls ? "TLS handshake: " : "") +
                                          "no answer within connect_timeout " +
                                          std::to_string(self->options.connect_timeout.count()) +
                                          " ms");
    });
    try_address();
  }

  void try_address() {
    for (;;) {
      try {
        stream = net::Stream::start_connect(addresses.at(address_index));
        descriptor.assign(stream.fd());
        if (!stream.connecting()) {
          connected();
          return;
        }
        descriptor.async_wait(
            asio::posix::stream_descriptor::wait_write,
            [self = shared_from_this(), gen = generation](std::error_code ec) {
              if (ec || gen != self->generation || self->phase != Phase::connecting) return;
              try {
                self->stream.finish_connect();
              } catch (const std::system_error& e) {
                self->next_address(e);
                return;
              }
              self->connected();
            });
        return;
      } catch (const std::system_error& e) {
        if (!next_address(e, /*retry_inline=*/true)) return;
      }
    }
  }

  // True when the caller should try the next address at once (inline).
  bool next_address(const std::system_error& e, bool retry_inline = false) {
    if (descriptor.is_open()) (void)descriptor.release();
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
    backoff = backoff.count() == 0 ? kFirstBackoff : std::min(backoff * 2, kMaxBackoff);
    next_attempt = SteadyClock::now() + backoff;
    fail_queue([&] { return std::make_exception_ptr(error); });
  }

  template <class MakeError>
  void fail_queue(MakeError&& make_error) {
    auto failed = std::move(queue);
    queue.clear();
    for (auto& request : failed)
      request->waiter->complete(make_error(), {});
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
    descriptor.async_wait(status == net::IoStatus::want_read
                              ? asio::posix::stream_descriptor::wait_read
                              : asio::posix::stream_descriptor::wait_write,
                          [self = shared_from_this(), gen = generation](std::error_code ec) {
                            if (ec || gen != self->generation || self->phase != Phase::connecting) {
                              return;
                            }
                            self->tls_step();
                          });
  }

  // A TLS failure (or a TLS/plaintext mismatch): every call written or waiting fails with the
  // non-retryable tls error; the next call tries again after the backoff.
  void refuse_tls(const std::string& cause) {
    auto lost = std::move(inflight);
    inflight.clear();
    close_socket();
    ++stats_connect_failures;
    phase = Phase::idle;
    backoff = backoff.count() == 0 ? kFirstBackoff : std::min(backoff * 2, kMaxBackoff);
    next_attempt = SteadyClock::now() + backoff;
    const RedisError error = detail::tls_error(endpoint, cause);
    for (auto& request : lost)
      if (request->waiter) request->waiter->complete(std::make_exception_ptr(error), {});
    fail_queue([&] { return std::make_exception_ptr(error); });
  }

  // The first bytes of this socket are not RESP: something else listens there. Everything
  // sent or queued fails with wrong_protocol.
  void not_redis() {
    auto lost = std::move(inflight);
    inflight.clear();
    close_socket();
    ++stats_connect_failures;
    phase = Phase::idle;
    backoff = backoff.count() == 0 ? kFirstBackoff : std::min(backoff * 2, kMaxBackoff);
    next_attempt = SteadyClock::now() + backoff;
    const std::string what = lost.empty() ? std::string("connect") : lost.front()->what;
    const RedisError error = detail::not_redis_error(what, endpoint, first_bytes);
    for (auto& request : lost)
      if (request->waiter) request->waiter->complete(std::make_exception_ptr(error), {});
    fail_queue([&] { return std::make_exception_ptr(error); });
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
    timer.cancel();  // the connect timeout; the command timeout is armed below
    auto add = [&](std::initializer_list<std::string_view> args, const char* what) {
      auto request = std::make_unique<Request>();
      detail::append_command(request->bytes, std::span<const std::string_view>(args));
      request->count = 1;
      request->kind = CommandKind::read;
      request->what = what;
      request->handshake = true;
      batch(std::move(request));
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
    if (inflight.empty()) {
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

  // Moves one request into the out buffer and the in-flight list.
  void batch(std::unique_ptr<Request> request) {
    out += request->bytes;
    bytes_batched += request->bytes.size();
    request->end = bytes_batched;
    request->written_at = SteadyClock::now();
    std::string().swap(request->bytes);
    if (!request->handshake) stats_commands += request->count;
    inflight.push_back(std::move(request));
  }

  // True when an idle socket shows EOF, a reset or stray bytes (the server went away while no
  // command was outstanding): replace it before writing, so nothing is put in doubt by a socket
  // that was dead before the command was sent.
  // (TLS session tickets are consumed by the stream and do not count.)
  bool idle_socket_dead() { return stream.idle_peer_gone(); }

  void flush() {
    if (phase != Phase::ready) return;
    if (out_offset == out.size() && !queue.empty()) {
      if (inflight.empty() && idle_socket_dead()) {
        ++stats_drops;
        close_socket();
        phase = Phase::idle;
        begin_connect();
        return;
      }
      out.clear();
      out_offset = 0;
      while (!queue.empty() && out.size() < kMaxBatchBytes) {
        batch(std::move(queue.front()));
        queue.pop_front();
      }
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
      if (!writing) {
        writing = true;
        descriptor.async_wait(r.status == net::IoStatus::want_read
                                  ? asio::posix::stream_descriptor::wait_read
                                  : asio::posix::stream_descriptor::wait_write,
                              [self = shared_from_this(), gen = generation](std::error_code ec) {
                                if (gen != self->generation) return;
                                self->writing = false;
                                if (ec) return;
                                if (self->phase == Phase::ready) {
                                  self->flush();
                                } else {
                                  self->write();
                                }
                              });
      }
      break;
    }
    if (out_offset == out.size() && phase == Phase::ready && !queue.empty()) {
      // Everything written: start the next batch (calls that queued during this write).
      asio::post(strand, [self = shared_from_this(), gen = generation] {
        if (gen == self->generation) self->flush();
      });
    }
    arm_read();
    arm_timer();
  }

  // ---- read -------------------------------------------------------------------------------------

  void arm_read() {
    if (reading || inflight.empty() || !descriptor.is_open()) return;
    reading = true;
    descriptor.async_wait(asio::posix::stream_descriptor::wait_read,
                          [self = shared_from_this(), gen = generation](std::error_code ec) {
                            if (gen != self->generation) return;
                            self->reading = false;
                            if (!ec) self->read();
                          });
  }

  void read() {
    const std::uint64_t gen = generation;
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
          if (gen != generation) return;  // a handshake failure dropped the connection
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
    if (inflight.empty()) {
      timer_armed = false;
      timer.cancel();  // idle: nothing may keep the caller's io_context running
    }
    arm_read();
  }

  void deliver(RedisReply reply) {
    if (inflight.empty()) throw detail::ProtocolError("a reply arrived for no command");
    Request& front = *inflight.front();
    front.replies.push_back(std::move(reply));
    if (front.replies.size() < front.count) return;
    std::unique_ptr<Request> done = std::move(inflight.front());
    inflight.pop_front();
    if (done->handshake) {
      const RedisReply& answer = done->replies.front();
      if (answer.is_error()) {
        handshake_refused(done->what, answer.str);
        return;
      }
      if (std::none_of(inflight.begin(), inflight.end(),
                       [](const auto& r) { return r->handshake; })) {
        ready();
      }
      return;
    }
    if (done->waiter) done->waiter->complete(nullptr, std::move(done->replies));
  }

  void handshake_refused(const std::string& what, const std::string& answer) {
    const std::string message = "idem redis: " + what + " on " + endpoint + " refused: " + answer;
    close_socket();
    inflight.clear();
    ++stats_connect_failures;
    phase = Phase::idle;
    backoff = backoff.count() == 0 ? kFirstBackoff : std::min(backoff * 2, kMaxBackoff);
    next_attempt = SteadyClock::now() + backoff;
    fail_queue([&] {
      return std::make_exception_ptr(RedisError(RedisFailure::auth, message, /*retryable=*/false,
                                                /*in_doubt=*/false, /*timed_out=*/false,
                                                ErrorCode::store_open_failed));
    });
  }

  // ---- command timeout --------------------------------------------------------------------------

  void arm_timer() {
    if (timer_armed || inflight.empty()) return;
    timer_armed = true;
    timer.expires_at(inflight.front()->written_at + options.command_timeout);
    timer.async_wait([self = shared_from_this(), gen = generation](std::error_code ec) {
      if (gen != self->generation) return;
      self->timer_armed = false;
      if (ec || self->inflight.empty()) return;
      const auto deadline = self->inflight.front()->written_at + self->options.command_timeout;
      if (SteadyClock::now() >= deadline) {
        self->drop(ETIMEDOUT, "no reply");
      } else {
        self->arm_timer();
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
    auto lost = std::move(inflight);
    inflight.clear();
    const std::uint64_t written = bytes_written;
    close_socket();
    phase = Phase::idle;
    const bool timed_out = is_timeout(error_number);
    for (auto& request : lost) {
      if (!request->waiter) continue;
      const bool sent = request->end <= written;
      const bool in_doubt = sent && request->kind != CommandKind::read;
      const bool retryable = !in_doubt || request->kind == CommandKind::idempotent_write;
      std::string message = "idem redis: " + request->what + " on " + endpoint + ": " + detail;
      if (timed_out) message += " (timed out: no answer within command_timeout)";
      if (eof) message += " (the server closed the connection)";
      if (in_doubt) {
        message += "; the command was sent and its reply lost: it may or may not have been applied";
      }
      request->waiter->complete(
          std::make_exception_ptr(RedisError(protocol ? RedisFailure::protocol : RedisFailure::io,
                                             message, retryable, in_doubt, timed_out)),
          {});
    }
    if (was_handshake) {
      connect_failed(error_number, detail);
      return;
    }
    if (!queue.empty()) begin_connect();
  }

  // ---- data
  // ---------------------------------------------------------------------------------------

  const RedisOptions options;
  const std::shared_ptr<const net::TlsContext> tls_context;  // null without TLS
  const std::string endpoint;
  asio::strand<asio::any_io_executor> strand;
  asio::posix::stream_descriptor descriptor;  // non-owning view of stream's descriptor
  asio::steady_timer timer;  // connect timeout, backoff, or the oldest command's timeout
  // Of strand's execution context (made after the strand's, the reactor's and the timer's
  // services, so shut down before them): calls abandon() when the context shuts down.
  Registry& registry;
  net::Stream stream;
  std::unique_ptr<detail::ReplyReader> reader;
  std::vector<net::Address> addresses;
  std::size_t address_index = 0;
  SteadyClock::time_point connect_deadline{};
  SteadyClock::time_point next_attempt{};
  std::chrono::milliseconds backoff{0};

  Phase phase = Phase::idle;
  bool closed = false;
  bool reading = false;
  bool writing = false;
  bool timer_armed = false;
  bool flush_scheduled = false;
  bool tls_handshaking = false;
  std::uint64_t socket_bytes_read = 0;  // on this socket: 0 until its first reply
  bool replied = false;                 // a whole reply arrived on this socket
  std::string first_bytes;              // the first bytes of this socket, for wrong_protocol
  std::uint64_t generation = 0;
  std::deque<std::unique_ptr<Request>> queue;     // not written yet
  std::deque<std::unique_ptr<Request>> inflight;  // batched (being) written, reply awaited
  std::string out;
  std::size_t out_offset = 0;
  std::uint64_t bytes_batched = 0;
  std::uint64_t bytes_written = 0;
  std::array<char, kReadChunk> read_buffer{};

  std::atomic<std::uint64_t> next_id{1};
  std::atomic<std::uint64_t> stats_connects{0}, stats_connect_failures{0}, stats_drops{0},
      stats_commands{0}, stats_writes{0}, stats_cancelled{0};
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
  const std::size_t count = batch.size();
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable),
                                          void(std::exception_ptr, Replies)>(
      [&](auto handler) {
        state->start(std::move(handler), batch.take_bytes(), count, kind, std::move(what));
      },
      asio::use_awaitable);
}

AsyncConnectionStats AsyncConnection::stats() const {
  AsyncConnectionStats s;
  s.connects = state_->stats_connects.load();
  s.connect_failures = state_->stats_connect_failures.load();
  s.drops = state_->stats_drops.load();
  s.commands = state_->stats_commands.load();
  s.writes = state_->stats_writes.load();
  s.cancelled = state_->stats_cancelled.load();
  return s;
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
  const auto tls = detail::make_tls_context(options_);  // one context for every connection
  for (std::size_t i = 0; i < options_.async_connections; ++i)
    connections_.push_back(std::make_unique<AsyncConnection>(executor, options_, tls));
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
