#include "amqp_connection.hpp"

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "idem/detail/printable.hpp"

namespace idem::rabbitmq::detail {
namespace {

constexpr amqp_channel_t kChannel = 1;

timeval to_timeval(Millis duration) {
  const auto ms = std::max<Millis::rep>(duration.count(), 0);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

amqp_bytes_t bytes_of(std::string_view text) {
  amqp_bytes_t bytes;
  bytes.len = text.size();
  bytes.bytes = const_cast<char*>(text.data());  // rabbitmq-c only reads it
  return bytes;
}

std::string string_of(amqp_bytes_t bytes) {
  if (bytes.len == 0 || bytes.bytes == nullptr) return {};
  return std::string(static_cast<const char*>(bytes.bytes), bytes.len);
}

// 406 PRECONDITION_FAILED, 403 ACCESS_REFUSED, 404 NOT_FOUND and the like say the request is
// wrong: trying again gives the same answer. 320 CONNECTION_FORCED (the broker is stopping),
// 541 INTERNAL_ERROR and 504/505 channel/frame trouble can pass.
bool retryable_reply_code(int code) {
  return code == 320 || code == 541 || code == 504 || code == 505 || code == 506;
}

void read_table(const amqp_table_t& table, std::map<std::string, std::string>& headers,
                std::int64_t& delivery_count) {
  for (int i = 0; i < table.num_entries; ++i) {
    const amqp_table_entry_t& entry = table.entries[i];
    const std::string key = string_of(entry.key);
    const amqp_field_value_t& value = entry.value;
    switch (value.kind) {
      case AMQP_FIELD_KIND_UTF8:
      case AMQP_FIELD_KIND_BYTES:
        headers[key] = string_of(value.value.bytes);
        break;
      case AMQP_FIELD_KIND_I8:
        // NOLINTNEXTLINE(bugprone-signed-char-misuse): AMQP's short-short-int is signed
        if (key == "x-delivery-count") delivery_count = value.value.i8;
        break;
      case AMQP_FIELD_KIND_U8:
        if (key == "x-delivery-count") delivery_count = value.value.u8;
        break;
      case AMQP_FIELD_KIND_I16:
        if (key == "x-delivery-count") delivery_count = value.value.i16;
        break;
      case AMQP_FIELD_KIND_U16:
        if (key == "x-delivery-count") delivery_count = value.value.u16;
        break;
      case AMQP_FIELD_KIND_I32:
        if (key == "x-delivery-count") delivery_count = value.value.i32;
        break;
      case AMQP_FIELD_KIND_U32:
        if (key == "x-delivery-count") delivery_count = value.value.u32;
        break;
      case AMQP_FIELD_KIND_I64:
        if (key == "x-delivery-count") delivery_count = value.value.i64;
        break;
      case AMQP_FIELD_KIND_U64:
        if (key == "x-delivery-count") delivery_count = static_cast<std::int64_t>(value.value.u64);
        break;
      default:
        break;  // tables, arrays, ... (x-death) are broker bookkeeping, not event headers
    }
  }
}

// The first certificate error OpenSSL met while verifying the broker's chain during this
// thread's current connect (X509_V_OK: none). librabbitmq reports only "SSL handshake failed";
// this callback, on its SSL_CTX, keeps the reason.
thread_local long tls_verify_error = X509_V_OK;

int remember_verify_error(int preverify_ok, X509_STORE_CTX* store) {
  if (preverify_ok == 0 && tls_verify_error == X509_V_OK)
    tls_verify_error = X509_STORE_CTX_get_error(store);
  return preverify_ok;
}

// OpenSSL's latest queued error as text ("" when none), clearing the queue.
std::string take_openssl_error() {
  unsigned long last = 0;
  while (const unsigned long e = ERR_get_error())
    last = e;
  if (last == 0) return {};
  const char* reason = ERR_reason_error_string(last);
  return reason != nullptr ? reason : "";
}

// What listens at host:port, found by a connection of its own on the failure path only
// (librabbitmq reports most of these as "a socket error occurred" or a timeout at login): it
// connects and sends the AMQP protocol header, which a broker answers at once.
struct ListenerProbe {
  enum class Kind {
    unresolved,  // the host name does not resolve (`detail`: the resolver's text)
    refused,     // nothing listens there
    timed_out,   // no connection within the budget
    failed,      // another connect error (`detail`: its text)
    amqp,        // an AMQP broker: it answered with a frame or its protocol header
    tls,         // a TLS listener: it answered with a TLS alert record
    silent,      // connected, but nothing came back within the budget
    other,       // something else answered (`detail`: its first bytes)
  };
  Kind kind = Kind::failed;
  std::string detail;
  bool temporary = false;  // unresolved: the resolver could not answer now
};

ListenerProbe probe_listener(const std::string& host, int port, Millis budget) {
  ListenerProbe probe;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    probe.kind = ListenerProbe::Kind::unresolved;
    probe.detail = ::gai_strerror(rc);
    probe.temporary = rc == EAI_AGAIN;
    return probe;
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);
  const timeval tv = to_timeval(budget);
  for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      const int error_number = errno;
      ::close(fd);
      if (error_number == ECONNREFUSED) {
        probe.kind = ListenerProbe::Kind::refused;
      } else if (error_number == EINPROGRESS || error_number == ETIMEDOUT ||
                 error_number == EAGAIN) {
        probe.kind = ListenerProbe::Kind::timed_out;
      } else {
        probe.kind = ListenerProbe::Kind::failed;
        probe.detail = std::strerror(error_number);
      }
      continue;  // the next address may answer
    }
    static constexpr char kHeader[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
    unsigned char reply[16] = {};
    ssize_t n = 0;
    if (::send(fd, kHeader, sizeof kHeader, MSG_NOSIGNAL) == sizeof kHeader) {
      n = ::recv(fd, reply, 2, MSG_WAITALL);
      if (n == 2) {
        const ssize_t more = ::recv(fd, reply + 2, sizeof reply - 2, MSG_DONTWAIT);
        if (more > 0) n += more;
      }
    }
    ::close(fd);
    if (n <= 0) {
      probe.kind = ListenerProbe::Kind::silent;
    } else if (reply[0] == 0x15 && reply[1] == 0x03) {
      probe.kind = ListenerProbe::Kind::tls;
    } else if (reply[0] == 0x01 || (n >= 4 && std::memcmp(reply, "AMQP", 4) == 0)) {
      probe.kind = ListenerProbe::Kind::amqp;  // a method frame (connection.start), or a header
    } else {
      probe.kind = ListenerProbe::Kind::other;
      probe.detail = ::idem::detail::printable(
          std::string_view(reinterpret_cast<const char*>(reply), static_cast<std::size_t>(n)), 16);
    }
    return probe;
  }
  return probe;
}

// The BrokerError of a connection that failed without the broker saying why, named by a probe
// of what listens at host:port. Nullopt when the probe finds a broker (the failure is then the
// broker's: a refused login, a broker that is starting).
std::optional<BrokerError> diagnosed(const std::string& operation, const ConnectionOptions& options,
                                     Millis budget) {
  const ListenerProbe probe = probe_listener(options.host, options.port, budget);
  const std::string where = "idem rabbitmq: " + operation + ": ";
  const std::string address = options.host + ":" + std::to_string(options.port);
  switch (probe.kind) {
    case ListenerProbe::Kind::unresolved:
      return BrokerError(where + "cannot resolve host '" + options.host + "': " + probe.detail,
                         /*retryable=*/probe.temporary, false, ErrorCode::host_not_found);
    case ListenerProbe::Kind::refused:
      return BrokerError(where + "connection refused: nothing listens at " + address +
                             " (is the broker running, on this port?)",
                         /*retryable=*/true, false, ErrorCode::connection_refused);
    case ListenerProbe::Kind::timed_out:
      return BrokerError(where + "no connection to " + address + " within " +
                             std::to_string(budget.count()) + " ms",
                         /*retryable=*/true, false, ErrorCode::connect_timeout);
    case ListenerProbe::Kind::tls:
      return BrokerError(where + "TLS: the port speaks TLS: connect with amqps://",
                         /*retryable=*/false, false, ErrorCode::store_open_failed);
    case ListenerProbe::Kind::silent:
      return BrokerError(where + "the server at " + address +
                             " accepted the connection but did not answer the AMQP protocol "
                             "header (is this a RabbitMQ port?)",
                         /*retryable=*/true, false, ErrorCode::connect_timeout);
    case ListenerProbe::Kind::other:
      return BrokerError(where + "the server at " + address +
                             " does not speak AMQP (it answered '" + probe.detail +
                             "'): is this a RabbitMQ port?",
                         /*retryable=*/false, false, ErrorCode::wrong_protocol);
    case ListenerProbe::Kind::failed:
    case ListenerProbe::Kind::amqp:
      break;
  }
  return std::nullopt;
}

}  // namespace

void read_message(const amqp_message_t& message, Delivery& delivery) {
  const amqp_basic_properties_t& properties = message.properties;
  delivery.body = string_of(message.body);
  if ((properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) != 0)
    delivery.message_id = string_of(properties.message_id);
  if ((properties._flags & AMQP_BASIC_TYPE_FLAG) != 0) delivery.type = string_of(properties.type);
  if ((properties._flags & AMQP_BASIC_TIMESTAMP_FLAG) != 0)
    delivery.timestamp = properties.timestamp;
  if ((properties._flags & AMQP_BASIC_HEADERS_FLAG) != 0)
    read_table(properties.headers, delivery.headers, delivery.delivery_count);
}

AmqpConnection::AmqpConnection(const ConnectionOptions& options)
    : endpoint_(options.describe()), rpc_timeout_(options.connect_timeout) {
  state_.reset(amqp_new_connection());
  connection_ = state_.get();
  if (connection_ == nullptr) fail("connect to " + endpoint_, "out of memory", false);
  const std::string connect_to = "connect to " + endpoint_;
  // What a probe of the listener may take on a failure path.
  const Millis probe_budget = std::min<Millis>(options.connect_timeout, std::chrono::seconds(2));
  const auto tls_fail = [&](const std::string& cause) {
    broken_ = true;
    throw BrokerError("idem rabbitmq: " + connect_to + ": TLS: " + cause, /*retryable=*/false,
                      false, ErrorCode::store_open_failed);
  };
  std::string password;
  std::string key_password;
  try {
    password = options.resolved_password();
    key_password = options.resolved_key_password();
  } catch (const ConfigError& e) {
    // Readable when the consumer or publisher was made: it went away since.
    throw BrokerError("idem rabbitmq: " + connect_to + ": " + e.message(), false, false,
                      ErrorCode::store_open_failed);
  }
  amqp_socket_t* socket = nullptr;
  if (options.tls) {
    socket = amqp_ssl_socket_new(connection_);
    if (socket == nullptr) fail(connect_to, "cannot create a TLS socket", true);
    if (!options.ca_cert_file.empty() &&
        amqp_ssl_socket_set_cacert(socket, options.ca_cert_file.c_str()) != AMQP_STATUS_OK) {
      tls_fail("the CA file (ca_cert_file) cannot be used: " + take_openssl_error());
    }
    if (!key_password.empty()) amqp_ssl_socket_set_key_passwd(socket, key_password.c_str());
    if (!options.cert_file.empty() &&
        amqp_ssl_socket_set_key(socket, options.cert_file.c_str(), options.key_file.c_str()) !=
            AMQP_STATUS_OK) {
      tls_fail("the client certificate or key (cert_file, key_file) cannot be used: " +
               take_openssl_error());
    }
    amqp_ssl_socket_set_verify_peer(socket, options.verify_peer ? 1 : 0);
    amqp_ssl_socket_set_verify_hostname(socket, options.verify_hostname ? 1 : 0);
    auto* ctx = static_cast<SSL_CTX*>(amqp_ssl_socket_get_context(socket));
    if (ctx != nullptr && options.verify_peer)
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, &remember_verify_error);
  } else {
    socket = amqp_tcp_socket_new(connection_);
    if (socket == nullptr) fail(connect_to, "cannot create a TCP socket", true);
  }
  timeval timeout = to_timeval(options.connect_timeout);
  amqp_set_handshake_timeout(connection_, &timeout);
  amqp_set_rpc_timeout(connection_, &timeout);
  ERR_clear_error();
  tls_verify_error = X509_V_OK;
  const int status = amqp_socket_open_noblock(socket, options.host.c_str(), options.port, &timeout);
  const long verify_error = tls_verify_error;
  tls_verify_error = X509_V_OK;
  if (status != AMQP_STATUS_OK && options.tls) {
    const std::string detail = take_openssl_error();
    if (status == AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED) {
      tls_fail("host name mismatch: the broker's certificate does not name '" + options.host + "'");
    }
    if (verify_error != X509_V_OK) {
      tls_fail(std::string("the broker's certificate is not trusted (ca_cert_file): ") +
               X509_verify_cert_error_string(verify_error));
    }
    if (status == AMQP_STATUS_SSL_PEER_VERIFY_FAILED) {
      tls_fail("the broker's certificate is not trusted (ca_cert_file)");
    }
    if (status == AMQP_STATUS_SSL_CONNECTION_FAILED || status == AMQP_STATUS_SSL_ERROR) {
      tls_fail("the TLS handshake failed" + (detail.empty() ? "" : ": " + detail) +
               " (is the port a TLS listener? does the broker accept the client certificate?)");
    }
  }
  if (status != AMQP_STATUS_OK) {
    // "a socket error occurred" (refused), "hostname lookup failed", a timeout: say which.
    if (auto error = diagnosed(connect_to, options, probe_budget)) {
      broken_ = true;
      throw *error;
    }
    fail(connect_to, amqp_error_string2(status), true);
  }

  const auto heartbeat_ms = options.heartbeat.count();
  const int heartbeat_s = heartbeat_ms <= 0
                              ? 0
                              : static_cast<int>(std::max<long long>(
                                    1, (static_cast<long long>(heartbeat_ms) + 999) / 1000));
  const amqp_rpc_reply_t login =
      amqp_login(connection_, options.vhost.c_str(), 0, AMQP_DEFAULT_FRAME_SIZE, heartbeat_s,
                 AMQP_SASL_METHOD_PLAIN, options.user.c_str(), password.c_str());
  if (login.reply_type != AMQP_RESPONSE_NORMAL) {
    if (login.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && options.tls &&
        login.library_error == AMQP_STATUS_SSL_ERROR) {
      // TLS 1.3 finishes the client's side of the handshake before the broker checks the client
      // certificate: its refusal arrives as an alert on the first read.
      const std::string detail = take_openssl_error();
      tls_fail(std::string(options.cert_file.empty()
                               ? "the broker requires a client certificate (cert_file, key_file)"
                               : "the broker refused the client certificate (not signed by a CA "
                                 "it trusts, or expired)") +
               (detail.empty() ? "" : ": " + detail));
    }
    if (login.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && !options.tls) {
      // A bare socket error or timeout at login: a TLS port, something that is not a broker, or
      // a broker refusing the login (it closes the socket) — the probe tells them apart.
      if (auto error = diagnosed("login to " + endpoint_, options, probe_budget)) {
        broken_ = true;
        throw *error;
      }
    }
    if (login.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
      // The broker answers bad credentials by closing the socket during the handshake.
      fail("login to " + endpoint_,
           std::string(amqp_error_string2(login.library_error)) +
               " (wrong user/password or vhost, or the broker is starting)",
           true);
    }
    if (login.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        login.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
      // connection.open refused, e.g. 530 NOT_ALLOWED: no access to the vhost. (The login's
      // reply is not the connection's last RPC reply, so check_rpc would not see it.)
      const auto* close = static_cast<const amqp_connection_close_t*>(login.reply.decoded);
      fail("login to " + endpoint_,
           "the broker refused: " + std::to_string(close->reply_code) + " " +
               string_of(close->reply_text),
           retryable_reply_code(close->reply_code));
    }
    check_rpc("login to " + endpoint_);
  }
  amqp_channel_open(connection_, kChannel);
  check_rpc("open a channel on " + endpoint_);
  channel_open_ = true;
}

void AmqpConnection::StateDeleter::operator()(amqp_connection_state_t_* state) const noexcept {
  amqp_destroy_connection(state);  // closes the socket, frees every buffer
}

AmqpConnection::~AmqpConnection() {
  if (connection_ == nullptr || broken_) return;
  // A clean close: the broker requeues unacked deliveries at once instead of on socket EOF.
  if (channel_open_) amqp_channel_close(connection_, kChannel, AMQP_REPLY_SUCCESS);
  amqp_connection_close(connection_, AMQP_REPLY_SUCCESS);
}

void AmqpConnection::fail(std::string_view operation, const std::string& reason, bool retryable,
                          bool in_doubt) {
  broken_ = true;
  throw BrokerError("idem rabbitmq: " + std::string(operation) + ": " + reason, retryable,
                    in_doubt);
}

void AmqpConnection::check_status(int status, std::string_view operation) {
  if (status != AMQP_STATUS_OK) fail(operation, amqp_error_string2(status), true);
}

void AmqpConnection::check_rpc(std::string_view operation) {
  const amqp_rpc_reply_t reply = amqp_get_rpc_reply(connection_);
  switch (reply.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return;
    case AMQP_RESPONSE_NONE:
      fail(operation, "no reply from the broker", true);
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      fail(operation, amqp_error_string2(reply.library_error), true);
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      break;
  }
  int code = 0;
  std::string text;
  if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
    const auto* close = static_cast<const amqp_connection_close_t*>(reply.reply.decoded);
    code = close->reply_code;
    text = string_of(close->reply_text);
  } else if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
    const auto* close = static_cast<const amqp_channel_close_t*>(reply.reply.decoded);
    code = close->reply_code;
    text = string_of(close->reply_text);
  } else {
    fail(operation, "unexpected method from the broker", true);
  }
  fail(operation, "the broker refused: " + std::to_string(code) + " " + text,
       retryable_reply_code(code));
}

bool AmqpConnection::alive() {
  if (broken_) return false;
  for (;;) {
    timeval no_wait{};
    amqp_frame_t frame;
    const int status = amqp_simple_wait_frame_noblock(connection_, &frame, &no_wait);
    if (status == AMQP_STATUS_TIMEOUT) return true;
    if (status != AMQP_STATUS_OK) {
      broken_ = true;
      return false;
    }
    if (frame.frame_type == AMQP_FRAME_METHOD &&
        (frame.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD ||
         frame.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD)) {
      broken_ = true;
      return false;
    }
    // Anything else unasked for (a late confirm) carries nothing we need.
  }
}

void AmqpConnection::declare_exchange(const std::string& name, std::string_view type) {
  amqp_exchange_declare(connection_, kChannel, bytes_of(name), bytes_of(type), /*passive=*/0,
                        /*durable=*/1, /*auto_delete=*/0, /*internal=*/0, amqp_empty_table);
  check_rpc("declare exchange '" + name + "' on " + endpoint_);
}

void AmqpConnection::declare_queue(const std::string& name, bool quorum) {
  amqp_table_entry_t entry;
  entry.key = amqp_cstring_bytes("x-queue-type");
  entry.value.kind = AMQP_FIELD_KIND_UTF8;
  entry.value.value.bytes = amqp_cstring_bytes(quorum ? "quorum" : "classic");
  amqp_table_t arguments;
  arguments.num_entries = 1;
  arguments.entries = &entry;
  amqp_queue_declare(connection_, kChannel, bytes_of(name), /*passive=*/0, /*durable=*/1,
                     /*exclusive=*/0, /*auto_delete=*/0, arguments);
  check_rpc("declare queue '" + name + "' on " + endpoint_);
}

void AmqpConnection::bind_queue(const std::string& queue, const std::string& exchange,
                                const std::string& key) {
  amqp_queue_bind(connection_, kChannel, bytes_of(queue), bytes_of(exchange), bytes_of(key),
                  amqp_empty_table);
  check_rpc("bind queue '" + queue + "' to exchange '" + exchange + "' on " + endpoint_);
}

std::uint32_t AmqpConnection::message_count(const std::string& queue) {
  const amqp_queue_declare_ok_t* ok = amqp_queue_declare(connection_, kChannel, bytes_of(queue),
                                                         /*passive=*/1, 0, 0, 0, amqp_empty_table);
  check_rpc("look at queue '" + queue + "' on " + endpoint_);
  return ok->message_count;
}

void AmqpConnection::delete_queue(const std::string& name) {
  amqp_queue_delete(connection_, kChannel, bytes_of(name), /*if_unused=*/0, /*if_empty=*/0);
  check_rpc("delete queue '" + name + "' on " + endpoint_);
}

void AmqpConnection::delete_exchange(const std::string& name) {
  amqp_exchange_delete(connection_, kChannel, bytes_of(name), /*if_unused=*/0);
  check_rpc("delete exchange '" + name + "' on " + endpoint_);
}

void AmqpConnection::enable_confirms() {
  amqp_confirm_select(connection_, kChannel);
  check_rpc("enable publisher confirms on " + endpoint_);
  confirms_ = true;
}

void AmqpConnection::send(const std::string& exchange, const std::string& routing_key,
                          const Outgoing& message, std::string_view operation) {
  amqp_basic_properties_t properties{};
  properties._flags = AMQP_BASIC_DELIVERY_MODE_FLAG;
  properties.delivery_mode = AMQP_DELIVERY_PERSISTENT;
  if (message.message_id != nullptr) {
    properties._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
    properties.message_id = bytes_of(*message.message_id);
  }
  if (message.type != nullptr) {
    properties._flags |= AMQP_BASIC_TYPE_FLAG;
    properties.type = bytes_of(*message.type);
  }
  if (message.timestamp) {
    properties._flags |= AMQP_BASIC_TIMESTAMP_FLAG;
    properties.timestamp = *message.timestamp;
  }
  std::vector<amqp_table_entry_t> entries;
  entries.reserve(message.headers.size());
  for (const auto& [key, value] : message.headers) {
    amqp_table_entry_t entry;
    entry.key = bytes_of(key);
    entry.value.kind = AMQP_FIELD_KIND_UTF8;
    entry.value.value.bytes = bytes_of(value);
    entries.push_back(entry);
  }
  if (!entries.empty()) {
    properties._flags |= AMQP_BASIC_HEADERS_FLAG;
    properties.headers.num_entries = static_cast<int>(entries.size());
    properties.headers.entries = entries.data();
  }
  const int status =
      amqp_basic_publish(connection_, kChannel, bytes_of(exchange), bytes_of(routing_key),
                         /*mandatory=*/0, /*immediate=*/0, &properties, bytes_of(message.body));
  if (status != AMQP_STATUS_OK) fail(operation, amqp_error_string2(status), true);
  ++published_;
}

void AmqpConnection::publish(const std::string& exchange, const std::string& routing_key,
                             const Outgoing& message) {
  const std::string operation = "publish to exchange '" + exchange + "' on " + endpoint_;
  send(exchange, routing_key, message, operation);
  if (!confirms_) return;

  const std::string lost =
      "; the message was sent but not confirmed: the broker may or may not have it";
  const auto deadline = std::chrono::steady_clock::now() + rpc_timeout_;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) fail(operation, "no confirm within the timeout" + lost, true, true);
    timeval timeout = to_timeval(left);
    amqp_frame_t frame;
    const int wait = amqp_simple_wait_frame_noblock(connection_, &frame, &timeout);
    if (wait == AMQP_STATUS_TIMEOUT) continue;
    if (wait != AMQP_STATUS_OK) fail(operation, amqp_error_string2(wait) + lost, true, true);
    if (frame.frame_type != AMQP_FRAME_METHOD) continue;
    switch (frame.payload.method.id) {
      case AMQP_BASIC_ACK_METHOD: {
        const auto* ack = static_cast<const amqp_basic_ack_t*>(frame.payload.method.decoded);
        if (ack->delivery_tag == published_ ||
            (ack->multiple != 0 && ack->delivery_tag >= published_))
          return;
        break;  // an earlier message's confirm
      }
      case AMQP_BASIC_NACK_METHOD: {
        const auto* nack = static_cast<const amqp_basic_nack_t*>(frame.payload.method.decoded);
        if (nack->delivery_tag == published_ ||
            (nack->multiple != 0 && nack->delivery_tag >= published_)) {
          // The channel is still fine, but keep the rule simple: an error drops the connection.
          fail(operation, "the broker nacked the message (it did not store it)", true);
        }
        break;
      }
      case AMQP_BASIC_RETURN_METHOD: {
        amqp_message_t returned;
        const amqp_rpc_reply_t read = amqp_read_message(connection_, frame.channel, &returned, 0);
        if (read.reply_type != AMQP_RESPONSE_NORMAL)
          fail(operation, "lost a returned message" + lost, true, true);
        amqp_destroy_message(&returned);
        break;
      }
      case AMQP_CHANNEL_CLOSE_METHOD:
      case AMQP_CONNECTION_CLOSE_METHOD:
        fail(operation, "the broker closed the connection" + lost, true, true);
      default:
        break;
    }
  }
}

void AmqpConnection::publish_batch(const std::string& exchange,
                                   const std::vector<const std::string*>& keys,
                                   const std::vector<Outgoing>& messages,
                                   std::size_t& confirmed_prefix) {
  confirmed_prefix = 0;
  if (messages.empty()) return;
  const std::string operation = "publish a batch of " + std::to_string(messages.size()) +
                                " to exchange '" + exchange + "' on " + endpoint_;
  const std::uint64_t first = published_ + 1;  // delivery tag of messages[0]
  for (std::size_t i = 0; i < messages.size(); ++i) {
    try {
      send(exchange, *keys[i], messages[i], operation);
    } catch (const BrokerError& error) {
      // Earlier messages of the batch were sent without their confirms being awaited: in
      // doubt, and the message says so as every in-doubt failure does.
      const std::string sent =
          i == 0 ? std::string(" (before any of the batch's messages was sent)")
                 : " (after sending " + std::to_string(i) +
                       " of the batch's messages, none of them confirmed: those are in doubt, "
                       "the broker may or may not have them)";
      throw BrokerError(bare_message(error) + sent, true, i > 0);
    }
  }
  if (!confirms_) {
    confirmed_prefix = messages.size();
    return;
  }

  // Confirms may acknowledge tags singly, several at once (`multiple`), and not necessarily in
  // order, so each message's state is kept and the confirmed prefix advanced over it.
  std::vector<bool> acked(messages.size(), false);
  const auto mark = [&](std::uint64_t tag, bool multiple) {
    if (tag < first || tag > published_) return;  // not this batch's
    const std::size_t last = static_cast<std::size_t>(tag - first);
    const std::size_t from = multiple ? confirmed_prefix : last;
    for (std::size_t i = from; i <= last; ++i)
      acked[i] = true;
    while (confirmed_prefix < acked.size() && acked[confirmed_prefix])
      ++confirmed_prefix;
  };
  const auto doubt = [&](const std::string& reason) {
    fail(operation,
         reason + "; " + std::to_string(confirmed_prefix) + " of " +
             std::to_string(messages.size()) +
             " messages (the first ones) were confirmed, the rest are in doubt: the "
             "broker may or may not have them",
         true, true);
  };
  auto deadline = std::chrono::steady_clock::now() + rpc_timeout_;
  while (confirmed_prefix < messages.size()) {
    const auto left =
        std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) doubt("no confirm within the timeout");
    timeval timeout = to_timeval(left);
    amqp_frame_t frame;
    const int wait = amqp_simple_wait_frame_noblock(connection_, &frame, &timeout);
    if (wait == AMQP_STATUS_TIMEOUT) continue;
    if (wait != AMQP_STATUS_OK) doubt(amqp_error_string2(wait));
    if (frame.frame_type != AMQP_FRAME_METHOD) continue;
    switch (frame.payload.method.id) {
      case AMQP_BASIC_ACK_METHOD: {
        const auto* ack = static_cast<const amqp_basic_ack_t*>(frame.payload.method.decoded);
        mark(ack->delivery_tag, ack->multiple != 0);
        // Progress restarts the timeout: a large batch may take longer than one rpc timeout.
        deadline = std::chrono::steady_clock::now() + rpc_timeout_;
        break;
      }
      case AMQP_BASIC_NACK_METHOD: {
        const auto* nack = static_cast<const amqp_basic_nack_t*>(frame.payload.method.decoded);
        if (nack->delivery_tag >= first) {
          // As publish(): any error drops the connection, and with it the pending confirms.
          doubt("the broker nacked message " + std::to_string(nack->delivery_tag - first) +
                " of the batch (it did not store it)");
        }
        break;
      }
      case AMQP_BASIC_RETURN_METHOD: {
        amqp_message_t returned;
        const amqp_rpc_reply_t read = amqp_read_message(connection_, frame.channel, &returned, 0);
        if (read.reply_type != AMQP_RESPONSE_NORMAL) doubt("lost a returned message");
        amqp_destroy_message(&returned);
        break;
      }
      case AMQP_CHANNEL_CLOSE_METHOD:
      case AMQP_CONNECTION_CLOSE_METHOD:
        doubt("the broker closed the connection");
      default:
        break;
    }
  }
}

void AmqpConnection::qos(int prefetch) {
  amqp_basic_qos(connection_, kChannel, 0, static_cast<std::uint16_t>(prefetch), 0);
  check_rpc("set prefetch on " + endpoint_);
}

void AmqpConnection::consume(const std::string& queue) {
  amqp_basic_consume(connection_, kChannel, bytes_of(queue), amqp_empty_bytes, /*no_local=*/0,
                     /*no_ack=*/0, /*exclusive=*/0, amqp_empty_table);
  check_rpc("consume from queue '" + queue + "' on " + endpoint_);
}

std::optional<Delivery> AmqpConnection::next_delivery(Millis timeout) {
  const std::string operation = "receive from " + endpoint_;
  amqp_maybe_release_buffers(connection_);
  timeval tv = to_timeval(timeout);
  amqp_envelope_t envelope;
  const amqp_rpc_reply_t reply = amqp_consume_message(connection_, &envelope, &tv, 0);
  if (reply.reply_type == AMQP_RESPONSE_NORMAL) {
    Delivery delivery;
    delivery.tag = envelope.delivery_tag;
    delivery.redelivered = envelope.redelivered != 0;
    delivery.routing_key = string_of(envelope.routing_key);
    read_message(envelope.message, delivery);
    amqp_destroy_envelope(&envelope);
    return delivery;
  }
  if (reply.reply_type != AMQP_RESPONSE_LIBRARY_EXCEPTION)
    fail(operation, "unexpected reply from the broker", true);
  if (reply.library_error == AMQP_STATUS_TIMEOUT) return std::nullopt;
  if (reply.library_error != AMQP_STATUS_UNEXPECTED_STATE)
    fail(operation, amqp_error_string2(reply.library_error), true);
  // A frame that is not a delivery: rabbitmq-c put it back for us to read.
  amqp_frame_t frame;
  const int status = amqp_simple_wait_frame(connection_, &frame);
  if (status != AMQP_STATUS_OK) fail(operation, amqp_error_string2(status), true);
  if (frame.frame_type == AMQP_FRAME_METHOD) {
    switch (frame.payload.method.id) {
      case AMQP_CHANNEL_CLOSE_METHOD: {
        const auto* close = static_cast<const amqp_channel_close_t*>(frame.payload.method.decoded);
        fail(operation,
             "the broker closed the channel: " + std::to_string(close->reply_code) + " " +
                 string_of(close->reply_text),
             true);
      }
      case AMQP_CONNECTION_CLOSE_METHOD: {
        const auto* close =
            static_cast<const amqp_connection_close_t*>(frame.payload.method.decoded);
        fail(operation,
             "the broker closed the connection: " + std::to_string(close->reply_code) + " " +
                 string_of(close->reply_text),
             true);
      }
      case AMQP_BASIC_CANCEL_METHOD:
        // The queue was deleted under us (or a quorum queue lost its leader).
        fail(operation, "the broker cancelled the consumer", true);
      default:
        break;
    }
  }
  return std::nullopt;
}

void AmqpConnection::wait_readable(Millis timeout, int wake_fd) {
  if (broken_ || amqp_frames_enqueued(connection_) != 0 || amqp_data_in_buffer(connection_) != 0)
    return;
  std::array<pollfd, 2> fds{};
  fds[0].fd = amqp_get_sockfd(connection_);
  fds[0].events = POLLIN;
  fds[1].fd = wake_fd;
  fds[1].events = POLLIN;
  const auto ms = std::clamp<Millis::rep>(timeout.count(), 0, std::numeric_limits<int>::max());
  // Errors (EINTR) and hang-ups alike return: the next read reports what happened.
  ::poll(fds.data(), fds.size(), static_cast<int>(ms));
}

std::optional<Delivery> AmqpConnection::get(const std::string& queue) {
  const std::string operation = "get from queue '" + queue + "' on " + endpoint_;
  const amqp_rpc_reply_t reply =
      amqp_basic_get(connection_, kChannel, bytes_of(queue), /*no_ack=*/0);
  if (reply.reply_type != AMQP_RESPONSE_NORMAL) check_rpc(operation);
  if (reply.reply.id == AMQP_BASIC_GET_EMPTY_METHOD) return std::nullopt;
  const auto* ok = static_cast<const amqp_basic_get_ok_t*>(reply.reply.decoded);
  Delivery delivery;
  delivery.tag = ok->delivery_tag;
  delivery.redelivered = ok->redelivered != 0;
  delivery.routing_key = string_of(ok->routing_key);
  amqp_message_t message;
  const amqp_rpc_reply_t read = amqp_read_message(connection_, kChannel, &message, 0);
  if (read.reply_type != AMQP_RESPONSE_NORMAL) fail(operation, "could not read the message", true);
  read_message(message, delivery);
  amqp_destroy_message(&message);
  return delivery;
}

void AmqpConnection::ack(std::uint64_t tag, bool multiple) {
  check_status(amqp_basic_ack(connection_, kChannel, tag, multiple ? 1 : 0), "ack on " + endpoint_);
}

void AmqpConnection::nack(std::uint64_t tag, bool requeue) {
  check_status(amqp_basic_nack(connection_, kChannel, tag, 0, requeue ? 1 : 0),
               "nack on " + endpoint_);
}

}  // namespace idem::rabbitmq::detail
