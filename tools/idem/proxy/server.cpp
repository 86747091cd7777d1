#include "server.hpp"

#include <malloc.h>
#include <openssl/bio.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <array>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/signal_set.hpp>
#include <asio/ssl.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../exit_codes.hpp"
#include "idem/error.hpp"
#include "idem/http/guard.hpp"
#include "idem/open.hpp"
#include "metrics.hpp"
#include "store.hpp"
#include "upstream.hpp"
#include "wire.hpp"

namespace idem::cli::proxy {

namespace {

using SteadyClock = std::chrono::steady_clock;
using tcp = asio::ip::tcp;
using idem::async::Task;
using TlsStream = asio::ssl::stream<tcp::socket>;

constexpr std::size_t kReadChunk = 16384;

// What a connection needs of the server.
struct Shared {
  ProxyOptions options;
  std::shared_ptr<idem::async::AsyncStore> store;
  std::unique_ptr<idem::http::Guard> guard;
  std::shared_ptr<UpstreamPool> upstream;
  std::unique_ptr<Metrics> metrics;
  std::atomic<bool> draining{false};
  std::mutex log_mutex;
};

class ConnectionBase {
 public:
  virtual ~ConnectionBase() = default;
  virtual void drain() = 0;   // closes the connection if it waits for a request
  virtual void cancel() = 0;  // cancels what it does and closes it
};

// The request fields the response needs after the reader moved on.
struct RequestMeta {
  bool keep_alive = false;
  int version = 11;
  bool head = false;
};

// One exchange with the upstream.
struct Exchange {
  std::shared_ptr<UpstreamConnection> connection;
  ResponseReader* reader = nullptr;  // the connection's, reset for this exchange
  std::string body;                  // body bytes read and not yet passed on
  std::optional<UpstreamFailure> failure;
  bool sent = false;  // the request was written: a failure after it is in doubt
  bool complete = false;
};

std::optional<std::string> verified_subject(SSL* ssl) {
  X509* certificate = SSL_get1_peer_certificate(ssl);
  if (certificate == nullptr) return std::nullopt;
  std::optional<std::string> subject;
  if (SSL_get_verify_result(ssl) == X509_V_OK) {
    BIO* bio = BIO_new(BIO_s_mem());
    if (bio != nullptr) {
      if (X509_NAME_print_ex(bio, X509_get_subject_name(certificate), 0, XN_FLAG_RFC2253) >= 0) {
        char* data = nullptr;
        const long size = BIO_get_mem_data(bio, &data);
        if (size > 0) subject = std::string(data, static_cast<std::size_t>(size));
      }
      BIO_free(bio);
    }
  }
  X509_free(certificate);
  return subject;
}

template <class Stream>
class Connection final : public ConnectionBase,
                         public std::enable_shared_from_this<Connection<Stream>> {
 public:
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

  Connection(Shared& shared, Stream stream, std::string remote)
      : shared_(shared),
        stream_(std::move(stream)),
        forwarded_{{"X-Forwarded-For", std::move(remote)},
                   {"X-Forwarded-Proto", kTls ? "https" : "http"}},
        reader_(shared.options.max_header, shared.options.max_request_body),
        deadline_(stream_.get_executor()),
        upstream_deadline_(stream_.get_executor()) {}

  asio::any_io_executor executor() { return stream_.get_executor(); }
  asio::cancellation_slot cancel_slot() { return cancel_.slot(); }

  void drain() override {
    asio::post(executor(), [self = this->shared_from_this()] {
      if (self->idle_ && self->buffer_.empty()) self->close_socket();
    });
  }
  void cancel() override {
    asio::post(executor(), [self = this->shared_from_this()] {
      self->cancel_.emit(asio::cancellation_type::terminal);
      self->close_socket();
    });
  }

  Task<void> run() {
    auto self = this->shared_from_this();
    if constexpr (kTls) {
      arm(SteadyClock::now() + shared_.options.header_timeout);
      asio::error_code ec;
      co_await stream_.async_handshake(asio::ssl::stream_base::server,
                                       asio::redirect_error(asio::use_awaitable, ec));
      disarm();
      if (ec) {
        close_socket();
        co_return;
      }
      client_subject_ = verified_subject(stream_.native_handle());
    }
    bool first = true;
    while (co_await serve_one(first))
      first = false;
    close_socket();
  }

 private:
  tcp::socket& socket() {
    if constexpr (kTls) {
      return stream_.next_layer();
    } else {
      return stream_;
    }
  }

  void close_socket() {
    if (closed_) return;
    closed_ = true;
    asio::error_code ignored;
    socket().shutdown(tcp::socket::shutdown_both, ignored);
    socket().close(ignored);
    deadline_.cancel();
  }

  // The connection is closed when `at` passes (a timeout of the phase it is in). A request moves
  // its deadline several times (idle, header, body, write, none while the upstream works), so the
  // timer is moved only when the deadline comes earlier than its pending wait: a later deadline,
  // or none, is found by that wait when it fires, which then waits again for what is left. Most
  // moves are then a store to armed_until_, not a timer cancel, a new wait and a timerfd update.
  void arm(SteadyClock::time_point at) {
    armed_until_ = at;
    if (waiting_ && deadline_.expiry() <= at) return;
    wait_until(at);
  }
  void disarm() { armed_until_ = SteadyClock::time_point::max(); }

  // Every new wait first cancels the pending one (expires_at), so at most one wait is live.
  void wait_until(SteadyClock::time_point at) {
    deadline_.expires_at(at);
    waiting_ = true;
    deadline_.async_wait([weak = this->weak_from_this()](const asio::error_code& ec) {
      if (ec) return;  // replaced by a newer wait, or the connection closed
      auto self = weak.lock();
      if (!self) return;
      self->waiting_ = false;
      if (self->closed_) return;
      if (SteadyClock::now() >= self->armed_until_) {
        self->timed_out_ = true;
        self->close_socket();
      } else if (self->armed_until_ != SteadyClock::time_point::max()) {
        self->wait_until(self->armed_until_);  // the deadline moved later meanwhile
      }
    });
  }

  Task<bool> read_more() {
    asio::error_code ec;
    const std::size_t n = co_await stream_.async_read_some(
        asio::buffer(scratch_), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return false;
    buffer_.append(scratch_.data(), n);
    co_return true;
  }

  Task<bool> write_all(std::string_view bytes) {
    if (closed_) co_return false;
    const auto previous = armed_until_;
    arm(SteadyClock::now() + shared_.options.write_timeout);
    asio::error_code ec;
    co_await asio::async_write(stream_, asio::buffer(bytes.data(), bytes.size()),
                               asio::redirect_error(asio::use_awaitable, ec));
    if (previous != SteadyClock::time_point::max()) {
      arm(previous);
    } else {
      disarm();
    }
    co_return !ec;
  }

  // Reads and answers one request; false when the connection ends after it.
  Task<bool> serve_one(bool first) {
    idle_ = true;
    if (shared_.draining && buffer_.empty()) co_return false;
    const auto& options = shared_.options;
    arm(SteadyClock::now() + (first ? options.header_timeout : options.idle_timeout));
    bool started = false;
    for (;;) {
      if (!buffer_.empty() && !started) {
        started = true;
        idle_ = false;
        arm(SteadyClock::now() + options.header_timeout);
      }
      std::size_t used = 0;
      RequestReader::Step step = reader_.feed(buffer_, used);
      buffer_.erase(0, used);
      if (step == RequestReader::Step::header) {
        arm(SteadyClock::now() + options.body_timeout);
        const auto length = reader_.content_length();
        if (reader_.expects_continue() && reader_.version() == 11 && buffer_.empty() &&
            (!length || *length > 0)) {
          if (!co_await write_all("HTTP/1.1 100 Continue\r\n\r\n")) co_return false;
        }
        used = 0;
        step = reader_.feed(buffer_, used);
        buffer_.erase(0, used);
      }
      if (step == RequestReader::Step::complete) break;
      if (step == RequestReader::Step::error) {
        co_await refuse(reader_.error());
        co_return false;
      }
      if (!co_await read_more()) {
        if (timed_out_ && started) shared_.metrics->on_rejection(ProxyRejection::timeout);
        if (!timed_out_ && reader_.eof() == RequestReader::Step::error) {
          shared_.metrics->on_rejection(ProxyRejection::bad_request);
        }
        co_return false;
      }
    }
    RequestMeta meta;
    meta.keep_alive = reader_.keep_alive();
    meta.version = reader_.version();
    meta.head = reader_.head();
    idem::http::Request request = reader_.take();
    idle_ = false;
    disarm();
    co_return co_await handle(std::move(request), meta);
  }

  Task<void> refuse(const WireError& error) {
    switch (error.status) {
      case 413:
        shared_.metrics->on_rejection(ProxyRejection::body_too_large);
        break;
      case 431:
        shared_.metrics->on_rejection(ProxyRejection::header_too_large);
        break;
      case 501:
      case 505:
        shared_.metrics->on_rejection(ProxyRejection::not_supported);
        break;
      default:
        shared_.metrics->on_rejection(ProxyRejection::bad_request);
        break;
    }
    const std::string bytes =
        serialize_response(proxy_problem(error.status, error.code, error.detail), false);
    (void)co_await write_all(bytes);
  }

  Task<bool> handle(idem::http::Request request, RequestMeta meta) {
    const auto started = SteadyClock::now();
    Shared& shared = shared_;
    shared.metrics->in_flight.fetch_add(1, std::memory_order_relaxed);
    struct InFlight {
      Metrics& metrics;
      ~InFlight() { metrics.in_flight.fetch_sub(1, std::memory_order_relaxed); }
    } in_flight{*shared.metrics};
    // Read again before each response: a drain that started meanwhile closes the connection.
    const auto keep_alive = [&] { return meta.keep_alive && !shared.draining; };
    request.client_subject = client_subject_;
    idem::http::Decision decision = co_await shared.guard->begin(request);
    if (decision.action() == idem::http::Decision::Action::respond) {
      const bool replayed =
          idem::http::find_header(decision.response().headers, idem::http::kReplayedField)
              .has_value();
      const std::string bytes = serialize_response(decision.response(), keep_alive(), meta.head);
      const bool written = co_await write_all(bytes);
      finish_log(request, decision, replayed ? "replayed" : "refused", decision.response().status,
                 started, std::nullopt);
      co_return written&& keep_alive();
    }
    const std::string_view decision_name = decision.holds_claim() ? "forwarded" : "passed";
    const std::string wire = serialize_request(request, forwarded_);
    const std::size_t cap = decision.holds_claim() && decision.route() != nullptr
                                ? decision.route()->max_stored_body
                                : shared.options.max_buffered_response;
    const std::string_view route =
        decision.route() != nullptr ? std::string_view(decision.route()->name) : std::string_view();
    const auto upstream_started = SteadyClock::now();
    Exchange exchange;
    if (!response_reader_) {
      response_reader_ = std::make_unique<ResponseReader>(meta.head, shared.options.max_header);
    } else {
      response_reader_->reset(meta.head);
    }
    exchange.reader = response_reader_.get();
    co_await forward(exchange, wire, cap);
    const auto upstream_time = SteadyClock::now() - upstream_started;

    if (exchange.failure) {
      const UpstreamFailure failure = *exchange.failure;
      shared.metrics->on_upstream_error(static_cast<UpstreamError>(failure));
      shared.metrics->on_rejection(ProxyRejection::upstream);
      close_upstream(exchange);
      const int status = failure == UpstreamFailure::timeout ? 504 : 502;
      const std::string detail =
          failure == UpstreamFailure::connect   ? "the upstream could not be reached"
          : failure == UpstreamFailure::timeout ? "the upstream did not answer in time"
          : failure == UpstreamFailure::reset   ? "the upstream closed the connection early"
                                                : "the upstream's response was malformed";
      idem::http::Response problem = proxy_problem(
          status, failure == UpstreamFailure::timeout ? "upstream-timeout" : "upstream-failed",
          detail);
      idem::http::Response out;
      if (!exchange.sent) {
        co_await decision.release();  // it never reached the upstream: nothing happened
        out = std::move(problem);
      } else {
        // It may have been acted on: kept only under keep_transient, released otherwise.
        out = co_await decision.finish(std::move(problem));
      }
      const std::string bytes = serialize_response(out, keep_alive(), meta.head);
      const bool written = co_await write_all(bytes);
      finish_log(request, decision, decision_name, status, started, upstream_time);
      co_return written&& keep_alive();
    }
    shared.metrics->on_upstream_duration(route, upstream_time);
    ResponseReader& reader = *exchange.reader;
    idem::http::Response response;
    response.status = reader.status();
    for (auto& header : reader.take_headers()) {
      if (!idem::http::is_connection_field(header.name)) {
        response.headers.push_back(std::move(header));
      }
    }
    if (exchange.complete) {
      give_back(exchange);
      response.body = std::move(exchange.body);
      idem::http::Response out = co_await decision.finish(std::move(response));
      std::string bytes;
      if (meta.head) {
        bytes = serialize_response_head(out.status, out.headers, Framing::length,
                                        reader.content_length(), keep_alive());
      } else {
        bytes = serialize_response(out, keep_alive());
      }
      const bool written = co_await write_all(bytes);
      finish_log(request, decision, decision_name, out.status, started, upstream_time);
      co_return written&& keep_alive();
    }
    // Too large to keep or to buffer: the key is released and the body streamed.
    co_await decision.release();
    const Framing framing = reader.content_length() ? Framing::length
                            : meta.version == 11    ? Framing::chunked
                                                    : Framing::close;
    bool alive = keep_alive() && framing != Framing::close;
    std::string bytes = serialize_response_head(response.status, response.headers, framing,
                                                reader.content_length(), alive);
    for (;;) {
      bytes += framing == Framing::chunked ? chunk(exchange.body) : exchange.body;
      exchange.body.clear();
      if (exchange.complete) {
        if (framing == Framing::chunked) bytes += last_chunk();
        if (!co_await write_all(bytes)) alive = false;
        break;
      }
      if (!co_await write_all(bytes)) {
        alive = false;
        break;
      }
      bytes.clear();
      const ResponseReader::Step step = co_await next(exchange);
      if (step == ResponseReader::Step::error) {
        // The client got part of a response: it can only learn of the failure by the close.
        shared.metrics->on_upstream_error(
            static_cast<UpstreamError>(exchange.failure.value_or(UpstreamFailure::malformed)));
        alive = false;
        break;
      }
      if (step == ResponseReader::Step::complete) exchange.complete = true;
    }
    if (exchange.complete) {
      give_back(exchange);
    } else {
      close_upstream(exchange);
    }
    finish_log(request, decision, decision_name, response.status, started, upstream_time);
    co_return alive;
  }

  // Sends the request and reads the response's header and as much body as `cap` allows.
  Task<void> forward(Exchange& exchange, const std::string& wire, std::size_t cap) {
    exchange.connection = co_await shared_.upstream->acquire();
    if (!exchange.connection) {
      exchange.failure = UpstreamFailure::connect;
      co_return;
    }
    upstream_timed_out_ = false;
    asio::error_code ec;
    arm_upstream(exchange.connection);
    co_await asio::async_write(exchange.connection->socket, asio::buffer(wire),
                               asio::redirect_error(asio::use_awaitable, ec));
    disarm_upstream();
    if (ec) {
      exchange.failure = upstream_timed_out_ ? UpstreamFailure::timeout : UpstreamFailure::reset;
      // Bytes may have reached a connection the upstream was closing: in doubt.
      exchange.sent = true;
      co_return;
    }
    exchange.sent = true;
    for (;;) {
      const ResponseReader::Step step = co_await next(exchange);
      if (step == ResponseReader::Step::error) co_return;
      if (step == ResponseReader::Step::complete) {
        exchange.complete = true;
        co_return;
      }
      const ResponseReader& reader = *exchange.reader;
      if (reader.header_done() && ((reader.content_length() && *reader.content_length() > cap) ||
                                   exchange.body.size() > cap)) {
        co_return;  // streamed by the caller
      }
    }
  }

  // Each write to and read from the upstream must end within upstream_timeout, or the upstream
  // connection is closed (the exchange then fails with a timeout). As for deadline_, one timer
  // per connection, moved only when the deadline comes earlier than its pending wait: a request's
  // two or three upstream operations are then stores to upstream_until_, not a timer each (a heap
  // entry, a cancel and often a timerfd update).
  void arm_upstream(const std::shared_ptr<UpstreamConnection>& connection) {
    upstream_watched_ = connection;
    upstream_until_ = SteadyClock::now() + shared_.options.upstream_timeout;
    if (upstream_waiting_ && upstream_deadline_.expiry() <= upstream_until_) return;
    wait_upstream_until(upstream_until_);
  }
  void disarm_upstream() {
    upstream_until_ = SteadyClock::time_point::max();
    upstream_watched_.reset();
  }

  void wait_upstream_until(SteadyClock::time_point at) {
    upstream_deadline_.expires_at(at);
    upstream_waiting_ = true;
    upstream_deadline_.async_wait([weak = this->weak_from_this()](const asio::error_code& ec) {
      if (ec) return;  // replaced by a newer wait, or the connection is gone
      auto self = weak.lock();
      if (!self) return;
      self->upstream_waiting_ = false;
      if (SteadyClock::now() >= self->upstream_until_) {
        if (auto connection = self->upstream_watched_.lock()) {
          self->upstream_timed_out_ = true;
          asio::error_code ignored;
          connection->socket.close(ignored);
        }
      } else if (self->upstream_until_ != SteadyClock::time_point::max()) {
        self->wait_upstream_until(self->upstream_until_);  // the deadline moved later meanwhile
      }
    });
  }

  // Feeds buffered upstream bytes to the reader, reading more when it needs them. Returns
  // need_more after progress (body bytes appended), header, complete or error (failure set).
  Task<ResponseReader::Step> next(Exchange& exchange) {
    std::string& buffer = exchange.connection->buffer;
    for (;;) {
      if (!buffer.empty()) {
        std::size_t used = 0;
        const ResponseReader::Step step = exchange.reader->feed(buffer, used, exchange.body);
        buffer.erase(0, used);
        if (step == ResponseReader::Step::error) {
          exchange.failure = UpstreamFailure::malformed;
          co_return step;
        }
        if (step != ResponseReader::Step::need_more || used > 0) co_return step;
      }
      asio::error_code ec;
      std::size_t n = 0;
      arm_upstream(exchange.connection);
      n = co_await exchange.connection->socket.async_read_some(
          asio::buffer(scratch_), asio::redirect_error(asio::use_awaitable, ec));
      disarm_upstream();
      if (ec == asio::error::eof) {
        const ResponseReader::Step step = exchange.reader->eof();
        if (step == ResponseReader::Step::error) exchange.failure = UpstreamFailure::reset;
        exchange.connection->broken = true;
        co_return step;
      }
      if (ec) {
        exchange.failure = upstream_timed_out_ ? UpstreamFailure::timeout : UpstreamFailure::reset;
        co_return ResponseReader::Step::error;
      }
      buffer.append(scratch_.data(), n);
    }
  }

  void give_back(Exchange& exchange) {
    if (exchange.connection && exchange.reader->keep_alive() && !shared_.draining) {
      shared_.upstream->give_back(std::move(exchange.connection));
    } else {
      close_upstream(exchange);
    }
  }
  static void close_upstream(Exchange& exchange) {
    if (!exchange.connection) return;
    asio::error_code ignored;
    exchange.connection->socket.close(ignored);
    exchange.connection.reset();
  }

  void finish_log(const idem::http::Request& request, const idem::http::Decision& decision,
                  std::string_view decision_name, int status, SteadyClock::time_point started,
                  std::optional<SteadyClock::duration> upstream) {
    const auto elapsed = SteadyClock::now() - started;
    shared_.metrics->on_request_duration(decision_name, elapsed);
    if (!shared_.options.log_requests) return;
    nlohmann::json line;
    line["method"] = request.method;
    line["target"] = request.target.substr(0, 256);
    line["status"] = status;
    line["decision"] = std::string(decision_name);
    if (decision.route() != nullptr) line["route"] = decision.route()->name;
    const auto& guarded = decision.inspection().guarded;
    if (!guarded.key_digest.empty()) line["key"] = guarded.key_digest;
    line["ms"] = std::chrono::duration<double, std::milli>(elapsed).count();
    if (upstream)
      line["upstream_ms"] = std::chrono::duration<double, std::milli>(*upstream).count();
    const std::string text =
        line.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) + "\n";
    std::lock_guard lock(shared_.log_mutex);
    std::fwrite(text.data(), 1, text.size(), stderr);
  }

  Shared& shared_;
  Stream stream_;
  // X-Forwarded-For (the client's address) and X-Forwarded-Proto, added to every request sent
  // upstream: the same for each request of the connection.
  const idem::http::Headers forwarded_;
  RequestReader reader_;
  std::string buffer_;
  // Where every read of this connection lands, from the client or the upstream (one at a time:
  // the connection's coroutine is sequential). A member, not a local: a coroutine's locals live
  // in its frame, and a 16 KiB frame per read was a heap allocation (and heap growth and trim)
  // per request.
  std::array<char, kReadChunk> scratch_;
  asio::steady_timer deadline_;
  SteadyClock::time_point armed_until_ = SteadyClock::time_point::max();
  bool waiting_ = false;  // deadline_ has a wait pending
  // The upstream's deadline (arm_upstream()), for the exchange's connection.
  asio::steady_timer upstream_deadline_;
  SteadyClock::time_point upstream_until_ = SteadyClock::time_point::max();
  std::weak_ptr<UpstreamConnection> upstream_watched_;
  bool upstream_waiting_ = false;    // upstream_deadline_ has a wait pending
  bool upstream_timed_out_ = false;  // the exchange's upstream connection was closed for it
  // The upstream response's reader, reset for each exchange.
  std::unique_ptr<ResponseReader> response_reader_;
  asio::cancellation_signal cancel_;
  std::optional<std::string> client_subject_;
  bool idle_ = true;
  bool timed_out_ = false;
  bool closed_ = false;
};

class Server {
 public:
  Server(asio::io_context& io, Shared& shared)
      : io_(io),
        shared_(shared),
        accept_strand_(asio::make_strand(io)),
        control_(asio::make_strand(io)),
        acceptor_(accept_strand_),
        metrics_acceptor_(control_),
        slot_timer_(accept_strand_),
        drain_timer_(control_),
        signals_(control_, SIGTERM, SIGINT) {}

  // Binds the listeners and prints their addresses. Throws ConfigError when it cannot listen.
  void start() {
    const ProxyOptions& options = shared_.options;
    if (!options.tls_cert.empty()) make_tls_context();
    const tcp::endpoint bound = listen(acceptor_, options.listen, "--listen");
    const char* scheme = tls_ ? "https" : "http";
    std::printf("idem proxy: listening on %s://%s, upstream http://%s:%s, store %s\n", scheme,
                format(bound).c_str(), shared_.upstream->target().host.c_str(),
                shared_.upstream->target().port.c_str(), redact_url(options.store).c_str());
    if (!options.metrics_listen.empty()) {
      const tcp::endpoint metrics =
          listen(metrics_acceptor_, options.metrics_listen, "--metrics-listen");
      std::printf("idem proxy: metrics on http://%s/metrics\n", format(metrics).c_str());
      asio::co_spawn(control_, metrics_loop(), asio::detached);
    }
    std::fflush(stdout);
    asio::co_spawn(accept_strand_, accept_loop(), asio::detached);
    signals_.async_wait([this](const asio::error_code& ec, int) {
      if (!ec) start_drain();
    });
  }

 private:
  static std::string format(const tcp::endpoint& endpoint) {
    const std::string address = endpoint.address().to_string();
    return (endpoint.address().is_v6() ? "[" + address + "]" : address) + ":" +
           std::to_string(endpoint.port());
  }

  tcp::endpoint listen(tcp::acceptor& acceptor, const std::string& where, std::string_view what) {
    const HostPort host_port = parse_host_port(where, what);
    asio::error_code ec;
    tcp::resolver resolver(io_);
    const auto results =
        resolver.resolve(host_port.host, host_port.port,
                         tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) {
      throw ConfigError(std::string(what) + ": cannot resolve '" + host_port.host + "'");
    }
    const tcp::endpoint endpoint = results.begin()->endpoint();
    acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      throw ConfigError(std::string(what) + ": cannot listen on " + where + ": " + ec.message());
    return acceptor.local_endpoint();
  }

  void make_tls_context() {
    const ProxyOptions& options = shared_.options;
    tls_.emplace(asio::ssl::context::tls_server);
    tls_->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                      asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                      asio::ssl::context::no_tlsv1_1 | asio::ssl::context::single_dh_use);
    asio::error_code ec;
    tls_->use_certificate_chain_file(options.tls_cert, ec);
    if (ec) throw ConfigError("--tls-cert " + options.tls_cert + ": " + ec.message());
    tls_->use_private_key_file(options.tls_key, asio::ssl::context::pem, ec);
    if (ec) throw ConfigError("--tls-key " + options.tls_key + ": " + ec.message());
    if (!options.tls_client_ca.empty()) {
      tls_->load_verify_file(options.tls_client_ca, ec);
      if (ec) throw ConfigError("--tls-client-ca " + options.tls_client_ca + ": " + ec.message());
      tls_->set_verify_mode(
          asio::ssl::verify_peer |
          (options.tls_require_client_cert ? asio::ssl::verify_fail_if_no_peer_cert : 0));
    }
  }

  Task<void> accept_loop() {
    for (;;) {
      while (active_.load() >= shared_.options.max_connections && !shared_.draining) {
        // Wait for a connection to end (connection_closed() cancels the timer).
        slot_timer_.expires_at(asio::steady_timer::time_point::max());
        asio::error_code ignored;
        co_await slot_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
      }
      if (shared_.draining || !acceptor_.is_open()) co_return;
      asio::error_code ec;
      tcp::socket socket = co_await acceptor_.async_accept(
          connection_executor(), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
        // Out of descriptors or a connection reset before it was accepted: try again shortly.
        asio::steady_timer pause(accept_strand_, std::chrono::milliseconds(10));
        co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      asio::error_code option_ec;
      socket.set_option(tcp::no_delay(true), option_ec);
      const tcp::endpoint remote = socket.remote_endpoint(option_ec);
      const std::string remote_address = option_ec ? std::string() : remote.address().to_string();
      active_.fetch_add(1);
      shared_.metrics->connections.fetch_add(1, std::memory_order_relaxed);
      shared_.metrics->connections_total.fetch_add(1, std::memory_order_relaxed);
      if (tls_) {
        launch(std::make_shared<Connection<TlsStream>>(shared_, TlsStream(std::move(socket), *tls_),
                                                       remote_address));
      } else {
        launch(
            std::make_shared<Connection<tcp::socket>>(shared_, std::move(socket), remote_address));
      }
    }
  }

  // A connection's executor: a strand of its own when several threads run the event loop. On one
  // thread every handler already runs in turn, and the strand would only cost: each operation's
  // handler would pass through the strand's queue and lock, and a strand does not fit in an
  // any_io_executor's small buffer, so each work-tracking copy of it (one or two per operation)
  // would be a heap allocation.
  asio::any_io_executor connection_executor() {
    if (shared_.options.threads > 1) return asio::make_strand(io_);
    return io_.get_executor();
  }

  template <class Stream>
  void launch(std::shared_ptr<Connection<Stream>> connection) {
    {
      std::lock_guard lock(mutex_);
      connections_[connection.get()] = connection;
    }
    asio::co_spawn(connection->executor(), connection->run(),
                   asio::bind_cancellation_slot(connection->cancel_slot(),
                                                [this, connection](std::exception_ptr error) {
                                                  if (error) report(error);
                                                  connection_closed(connection.get());
                                                }));
  }

  static void report(const std::exception_ptr& error) {
    try {
      std::rethrow_exception(error);
    } catch (const asio::system_error& e) {
      if (e.code() == asio::error::operation_aborted) return;  // cancelled by the drain
      std::fprintf(stderr, "idem proxy: connection failed: %s\n", e.what());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "idem proxy: connection failed: %s\n", e.what());
    }
  }

  void connection_closed(ConnectionBase* connection) {
    {
      std::lock_guard lock(mutex_);
      connections_.erase(connection);
    }
    active_.fetch_sub(1);
    shared_.metrics->connections.fetch_sub(1, std::memory_order_relaxed);
    asio::post(accept_strand_, [this] { slot_timer_.cancel(); });
    if (shared_.draining) asio::post(control_, [this] { check_drained(); });
  }

  std::vector<std::shared_ptr<ConnectionBase>> live_connections() {
    std::vector<std::shared_ptr<ConnectionBase>> live;
    std::lock_guard lock(mutex_);
    for (auto& [raw, weak] : connections_) {
      if (auto connection = weak.lock()) live.push_back(std::move(connection));
    }
    return live;
  }

  // On control_ (the signal handler).
  void start_drain() {
    if (shared_.draining.exchange(true)) return;
    shared_.metrics->draining.store(1);
    std::fprintf(stderr, "idem proxy: draining (%lld ms for requests in flight)\n",
                 static_cast<long long>(shared_.options.drain_timeout.count()));
    asio::post(accept_strand_, [this] {
      asio::error_code ignored;
      acceptor_.close(ignored);
      slot_timer_.cancel();
    });
    for (auto& connection : live_connections())
      connection->drain();
    signals_.async_wait([this](const asio::error_code& ec, int) {
      if (ec) return;
      std::fprintf(stderr, "idem proxy: second signal: stopping now\n");
      io_.stop();
    });
    drain_timer_.expires_after(shared_.options.drain_timeout);
    drain_timer_.async_wait([this](const asio::error_code& ec) {
      if (ec) return;
      for (auto& connection : live_connections())
        connection->cancel();
    });
    check_drained();
  }

  // On control_.
  void check_drained() {
    if (active_.load() != 0 || drained_) return;
    drained_ = true;
    asio::error_code ignored;
    metrics_acceptor_.close(ignored);
    signals_.cancel(ignored);
    drain_timer_.cancel();
    shared_.upstream->close_idle();
    std::fprintf(stderr, "idem proxy: drained\n");
  }

  // The metrics listener (on control_): GET /metrics, GET /healthz; one request per connection.
  Task<void> metrics_loop() {
    for (;;) {
      asio::error_code ec;
      tcp::socket socket = co_await metrics_acceptor_.async_accept(
          asio::make_strand(io_), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (!metrics_acceptor_.is_open()) co_return;
        continue;
      }
      auto held = std::make_shared<tcp::socket>(std::move(socket));
      asio::co_spawn(held->get_executor(), serve_metrics(held), asio::detached);
    }
  }

  Task<void> serve_metrics(std::shared_ptr<tcp::socket> socket) {
    asio::steady_timer timer(socket->get_executor(), std::chrono::seconds(5));
    timer.async_wait([weak = std::weak_ptr<tcp::socket>(socket)](const asio::error_code& ec) {
      if (ec) return;
      if (auto s = weak.lock()) {
        asio::error_code ignored;
        s->close(ignored);
      }
    });
    RequestReader reader(8192, 0);
    std::string buffer;
    RequestReader::Step step = RequestReader::Step::need_more;
    while (step == RequestReader::Step::need_more || step == RequestReader::Step::header) {
      char chunk_buffer[4096];
      asio::error_code ec;
      const std::size_t n = co_await socket->async_read_some(
          asio::buffer(chunk_buffer), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      buffer.append(chunk_buffer, n);
      for (;;) {
        std::size_t used = 0;
        step = reader.feed(buffer, used);
        buffer.erase(0, used);
        if (step != RequestReader::Step::header) break;
      }
    }
    idem::http::Response response;
    if (step == RequestReader::Step::error) {
      response = proxy_problem(reader.error().status, reader.error().code, reader.error().detail);
    } else {
      const idem::http::Request request = reader.take();
      const std::string path = request.target.substr(0, request.target.find('?'));
      if (request.method != "GET") {
        response = proxy_problem(405, "method-not-allowed", "only GET is served here");
      } else if (path == "/metrics") {
        response.headers.push_back({"Content-Type", "text/plain; version=0.0.4; charset=utf-8"});
        response.body = shared_.metrics->render();
      } else if (path == "/healthz") {
        response.status = shared_.draining ? 503 : 200;
        response.headers.push_back({"Content-Type", "text/plain"});
        response.body = shared_.draining ? "draining\n" : "ok\n";
      } else {
        response = proxy_problem(404, "not-found", "GET /metrics or /healthz");
      }
    }
    const std::string bytes = serialize_response(response, false);
    asio::error_code ec;
    co_await asio::async_write(*socket, asio::buffer(bytes),
                               asio::redirect_error(asio::use_awaitable, ec));
    timer.cancel();
    socket->close(ec);
  }

  asio::io_context& io_;
  Shared& shared_;
  asio::strand<asio::io_context::executor_type> accept_strand_;
  asio::strand<asio::io_context::executor_type> control_;
  tcp::acceptor acceptor_;
  tcp::acceptor metrics_acceptor_;
  asio::steady_timer slot_timer_;
  asio::steady_timer drain_timer_;
  asio::signal_set signals_;
  std::optional<asio::ssl::context> tls_;
  std::atomic<std::size_t> active_{0};
  bool drained_ = false;
  std::mutex mutex_;
  std::unordered_map<ConnectionBase*, std::weak_ptr<ConnectionBase>> connections_;
};

std::vector<std::string> route_names(const idem::http::GuardOptions& options) {
  std::vector<std::string> names;
  for (const auto& route : options.routes)
    names.push_back(route.name);
  return names;
}

}  // namespace

int run_proxy(const ProxyOptions& given) {
  // A client that goes away mid-write must not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  // glibc gives freed memory at the top of a thread's heap back to the kernel once it exceeds
  // the trim threshold (128 KiB at first): a madvise and a TLB shootdown of every core, which
  // the SQLite store's threads paid on most writes (a statement journal freed). Per-request
  // memory is reused instead; at most this much stays reserved per heap.
  mallopt(M_TRIM_THRESHOLD, 32 << 20);
  Shared shared;
  try {
    validate(given);
    shared.options = given;
    shared.options.guard = idem::http::normalized(given.guard);
  } catch (const std::exception& e) {
    std::cerr << "idem proxy: " << describe(e) << "\n";
    return exit_code_of(e);
  }
  asio::io_context io(shared.options.threads);
  try {
    shared.store = open_async_store(shared.options.store, io.get_executor());
  } catch (const std::exception& e) {
    std::cerr << "idem proxy: store " << redact_url(shared.options.store) << ": " << describe(e)
              << "\n";
    return exit_code_of(e);
  }
  shared.metrics = std::make_unique<Metrics>(route_names(shared.options.guard));
  idem::http::GuardHooks hooks;
  Metrics* metrics = shared.metrics.get();
  hooks.observer = [metrics](const idem::http::GuardEvent& event) {
    metrics->on_guard_event(event);
  };
  shared.guard = std::make_unique<idem::http::Guard>(shared.store, shared.options.guard, hooks);
  shared.upstream = std::make_shared<UpstreamPool>(
      io.get_executor(), parse_host_port(shared.options.upstream, "--upstream"),
      shared.options.upstream_connect_timeout, shared.options.upstream_idle);
  {
    Server server(io, shared);
    try {
      server.start();
    } catch (const std::exception& e) {
      std::cerr << "idem proxy: " << describe(e) << "\n";
      return exit_code_of(e);
    }
    std::vector<std::thread> threads;
    for (int i = 1; i < shared.options.threads; ++i)
      threads.emplace_back([&io] { io.run(); });
    io.run();
    for (auto& thread : threads)
      thread.join();
  }
  shared.guard.reset();
  shared.upstream.reset();
  shared.store.reset();
  return kOk;
}

}  // namespace idem::cli::proxy
