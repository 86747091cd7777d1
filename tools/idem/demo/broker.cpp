// The demo's RabbitMQ exchanges and queues (broker.hpp).
#include "broker.hpp"

#include <algorithm>
#include <iostream>
#include <span>

#include "../exit_codes.hpp"
#include "file_queue.hpp"
#include "idem/error.hpp"

#ifdef IDEM_HAVE_RABBITMQ
#include "idem/rabbitmq/admin.hpp"
#include "idem/rabbitmq/publisher.hpp"
#endif

namespace idem::cli::demo {

std::string consumer_exchange(const std::string& consumer) {
  return consumer;
}

#ifdef IDEM_HAVE_RABBITMQ
// Events per confirmed batch of the first hop's publish: one broker fsync each, and a progress
// step.
constexpr std::size_t kPublishBatch = 2000;

rabbitmq::ConsumerOptions broker_consumer_options(const std::string& consumer) {
  rabbitmq::ConsumerOptions options;
  options.consumer_name = consumer;
  options.exchange = consumer_exchange(consumer);
  return options;
}

struct DemoBroker::Connection {
  rabbitmq::ConnectionOptions options;
};
#else
struct DemoBroker::Connection {};
#endif

DemoBroker::DemoBroker(const std::string& broker) : broker_url_(broker) {
  if (broker.empty()) return;
#ifdef IDEM_HAVE_RABBITMQ
  connection_ =
      std::make_unique<Connection>(Connection{rabbitmq::ConnectionOptions::from_url(broker)});
#else
  throw NotSupported(
      "--broker: this idem was built without RabbitMQ (IDEM_WITH_RABBITMQ=ON and "
      "librabbitmq-dev build it)");
#endif
}

DemoBroker::~DemoBroker() {
  clean_up();
}

void DemoBroker::declare([[maybe_unused]] const std::vector<std::string>& consumers) {
#ifdef IDEM_HAVE_RABBITMQ
  if (!connection_) return;
  for (const std::string& consumer : consumers) {
    // Recorded first: a declare that fails part way still has its remains deleted.
    declared_.push_back(consumer);
    rabbitmq::Consumer(connection_->options, broker_consumer_options(consumer)).connect();
  }
#endif
}

void DemoBroker::publish([[maybe_unused]] const std::filesystem::path& queue,
                         [[maybe_unused]] const std::string& consumer,
                         [[maybe_unused]] const std::function<void(std::uint64_t)>& progress) {
#ifdef IDEM_HAVE_RABBITMQ
  if (!connection_) return;
  rabbitmq::PublisherOptions publisher_options;
  publisher_options.exchange = consumer_exchange(consumer);
  rabbitmq::Publisher publisher(connection_->options, publisher_options);
  const std::vector<Event> events = read_queue(queue);
  for (std::size_t start = 0; start < events.size(); start += kPublishBatch) {
    const std::size_t end = std::min(events.size(), start + kPublishBatch);
    publisher.publish_batch(std::span<const Event>(events).subspan(start, end - start));
    progress(end);
  }
#endif
}

void DemoBroker::clean_up() noexcept {
#ifdef IDEM_HAVE_RABBITMQ
  if (!connection_) return;
  for (const std::string& name : declared_) {
    try {
      rabbitmq::delete_queue(connection_->options, "idem." + name);
      rabbitmq::delete_queue(connection_->options, "idem." + name + ".dlq");
      rabbitmq::delete_exchange(connection_->options, consumer_exchange(name));
    } catch (const std::exception& e) {
      std::cerr << "idem demo: could not delete the broker queue idem." << name << ": "
                << describe(e) << "\n";
    }
  }
#endif
  declared_.clear();
}

}  // namespace idem::cli::demo
