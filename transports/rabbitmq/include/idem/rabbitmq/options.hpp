// Options of idem's RabbitMQ transport: where the broker is and how to reconnect to it.
//
// ConnectionOptions::from_url() reads `amqp://user:password@host:port/vhost` (rabbitmq-c's URL
// rules: user, password, port and vhost may be left out; percent-escapes are decoded; a missing
// or empty vhost is "/"). A URL that cannot be used throws ConfigError naming the part that is
// wrong; the password never appears in a message (redact_amqp_url()).
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

  // Parses an amqp:// URL. Throws ConfigError naming the bad part (scheme, host, port, ...).
  static ConnectionOptions from_url(std::string_view url);

  // "amqp://user@host:port/vhost" — for logs and messages; never contains the password.
  std::string describe() const;
};

// The URL with any password replaced by "***" ("amqp://guest:***@host:5672/").
std::string redact_amqp_url(std::string_view url);

}  // namespace idem::rabbitmq
