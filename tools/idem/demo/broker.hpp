// The demo's use of RabbitMQ (--broker amqp://...): the run's exchanges and queues, the first
// hop's publish, and their removal.
//
// Each consumer of a run gets an exchange and a quorum queue named after its consumer name,
// which is fresh for every run that uses a broker, so runs against one broker never see each
// other's messages. The destructor deletes what declare() made (queues, dead-letter queues,
// exchanges) on every way out of the demo. Without --broker every step does nothing; in a build
// without RabbitMQ a --broker is refused by the constructor (NotSupported).
//
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#ifdef IDEM_HAVE_RABBITMQ
#include "idem/rabbitmq/consumer.hpp"
#endif

namespace idem::cli::demo {

#ifdef IDEM_HAVE_RABBITMQ
// The consumer options of one consumer of the demo: its queue "idem.<consumer>" bound to the
// exchange consumer_exchange(consumer).
rabbitmq::ConsumerOptions broker_consumer_options(const std::string& consumer);
#endif
std::string consumer_exchange(const std::string& consumer);

class DemoBroker {
 public:
  // Parses `broker` (ConfigError when bad); NotSupported when this build has no RabbitMQ.
  explicit DemoBroker(const std::string& broker);
  ~DemoBroker();
  DemoBroker(const DemoBroker&) = delete;
  DemoBroker& operator=(const DemoBroker&) = delete;

  bool used() const noexcept { return !broker_url_.empty(); }

  // Declares the consumers' queues before anything is published, so they receive every message
  // (and an unreachable broker stops the demo before it starts).
  void declare(const std::vector<std::string>& consumers);

  // Publishes `events` (a hop's queue file) to the consumer's exchange in confirmed batches,
  // calling `progress` with the count published after each.
  void publish(const std::filesystem::path& queue, const std::string& consumer,
               const std::function<void(std::uint64_t)>& progress);

  // Deletes the declared queues and exchanges now (the destructor does it otherwise); a failure
  // is reported on stderr, not thrown.
  void clean_up() noexcept;

 private:
  std::string broker_url_;
  std::vector<std::string> declared_;
  struct Connection;
  std::unique_ptr<Connection> connection_;
};

}  // namespace idem::cli::demo
