// Options of idem's RabbitMQ transport: where the broker is and how to reconnect to it.
//
// ConnectionOptions::from_url() reads `amqp://user:password@host:port/vhost` (RabbitMQ's URI
// rules: user, password, port and vhost may be left out; an IPv6 host goes in brackets;
// percent-escapes are decoded; a missing or empty vhost is "/") and `amqps://...` (TLS, default
// port 5671), with optional query parameters (RabbitMQ's URI spelling where it has one):
//   cacertfile=PATH  certfile=PATH  keyfile=PATH  verify=verify_peer|verify_none
//   server_name_indication=disable (no host name check; the default checks the URL's host)
//   password_file=PATH  password_env=NAME  key_password_file=PATH  key_password_env=NAME
// A URL that cannot be used throws ConfigError naming the part that is wrong; the password never
// appears in a message (redact_amqp_url()).
//
// Thread-safety: plain values.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "idem/clock.hpp"

namespace idem::rabbitmq {

struct ConnectionOptions {
  std::string host = "127.0.0.1";  // default 127.0.0.1
  int port = 5672;                 // default 5672 (1..65535)
  std::string user = "guest";      // default guest
  std::string password = "guest";  // default guest; never printed
  std::string vhost = "/";         // default "/"
  // AMQP heartbeat asked of the broker; 0 turns heartbeats off. Default 10 s. The broker closes
  // a connection that stays silent for two intervals, so a handler must return well within
  // 2 × heartbeat (rabbitmq-c sends heartbeats only while idem waits for the broker).
  Millis heartbeat = std::chrono::seconds(10);
  // TCP connect plus AMQP handshake, and every synchronous broker call (declare, bind, confirm
  // wait). Default 5 s; must be positive.
  Millis connect_timeout = std::chrono::seconds(5);
  // First wait before reconnecting after a failed connect; doubled per failure. Default 100 ms.
  Millis initial_backoff = std::chrono::milliseconds(100);
  // Upper bound of that wait. Default 5 s.
  Millis max_backoff = std::chrono::seconds(5);
  // Failed connects in a row before Consumer::run() gives up and throws BrokerError; 0 means
  // never give up. Default 0.
  int max_reconnect_attempts = 0;
  // Backoff waits go through clock->sleep_for. Default (null): idem::system_clock().
  std::shared_ptr<Clock> clock = nullptr;

  // ---- TLS (amqps://; docs/rabbitmq.md "TLS") ------------------------------------------------
  // Connect with TLS (librabbitmq's OpenSSL socket). Every reconnect of a Consumer or
  // Publisher uses the same settings. A TLS failure (untrusted or expired certificate, host
  // name mismatch, a refused client certificate, a plain broker port) throws a non-retryable
  // BrokerError, code store_open_failed, whose message says "TLS: <cause>". Default false.
  bool tls = false;
  // The CA certificate(s) (PEM) the broker's chain must lead to. Required when verify_peer.
  std::string ca_cert_file;
  // A client certificate and its key (PEM), for brokers with fail_if_no_peer_cert; both or
  // neither.
  std::string cert_file;
  std::string key_file;
  // Check the broker's chain against ca_cert_file. Default true; false only for tests.
  bool verify_peer = true;
  // Check that the certificate names `host`. Default true.
  bool verify_hostname = true;

  // ---- secrets --------------------------------------------------------------------------------
  // The password from a file (its content minus one trailing newline; read at every connect,
  // so rotation needs no restart) or an environment variable; either overrides `password`.
  // At most one of the two. Never printed.
  std::string password_file;
  std::string password_env;
  // The passphrase of an encrypted key_file: inline, from a file or from the environment (at
  // most one).
  std::string key_password;
  std::string key_password_file;
  std::string key_password_env;

  // Parses an amqp:// or amqps:// URL. Throws ConfigError naming the bad part (scheme, host,
  // port, a query parameter, ...).
  static ConnectionOptions from_url(std::string_view url);

  // "amqp://user@host:port/vhost" (amqps:// with TLS) — for logs and messages; never contains
  // the password.
  std::string describe() const;

  // Throws ConfigError for settings that cannot work (TLS verification without a CA file, a
  // certificate without its key, two sources of one secret, a secret file that cannot be
  // read). The Consumer and Publisher call it at construction.
  void validate() const;

  // The password a connect sends (password_file / password_env / password) and the key
  // passphrase (empty: none). Throws ConfigError when a file or variable cannot be read.
  std::string resolved_password() const;
  std::string resolved_key_password() const;
};

// The URL with any password replaced by "***" ("amqp://guest:***@host:5672/").
std::string redact_amqp_url(std::string_view url);

}  // namespace idem::rabbitmq
