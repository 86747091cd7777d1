// rabbitmq_consumer: events through RabbitMQ, side effects once, markers in SQLite.
//
//   * A Publisher sends three "order.paid" events to the topic exchange "example.<pid>", with
//     publisher confirms — and one of them a second time, as a retrying producer would.
//   * A Consumer named "shipping" (queue "idem.example-<pid>-shipping", durable, quorum) runs an
//     exclusive-mode IdempotentHandler on a SQLite recorder: four deliveries, three parcels.
//     The ack goes out only after the handler returned, so a crash mid-handler would bring the
//     event back — and the recorder would drop it if it had been marked.
//   * The queues, the exchange and the database file are removed at the end.
//
// Run: ./example_rabbitmq_consumer amqp://guest:guest@127.0.0.1:5672/ [RECORDER_URL]
//      RECORDER_URL defaults to a SQLite file in /tmp (any idem::open_recorder URL works).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "idem/handler.hpp"
#include "idem/open.hpp"
#include "idem/rabbitmq/admin.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/publisher.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cout << "example_rabbitmq_consumer: no broker URL given, nothing to do.\n"
                 "usage: example_rabbitmq_consumer amqp://USER:PASS@HOST:PORT/VHOST "
                 "[RECORDER_URL]\n";
    return 0;
  }
  const std::string pid = std::to_string(::getpid());
  const std::string db_path = "/tmp/idem-example-rabbitmq-" + pid + ".db";
  const std::string recorder_url = argc > 2 ? argv[2] : "sqlite://" + db_path;
  int status = 0;
  try {
    const auto connection = idem::rabbitmq::ConnectionOptions::from_url(argv[1]);
    std::cout << "broker " << connection.describe() << ", recorder "
              << idem::redact_url(recorder_url) << "\n";
    auto recorder = idem::open_recorder(recorder_url);

    idem::rabbitmq::ConsumerOptions options;
    options.consumer_name = "example-" + pid + "-shipping";
    options.exchange = "example." + pid;
    options.binding_key = "order.*";
    idem::rabbitmq::Consumer consumer(connection, options);
    consumer.connect();  // declare the queue first, so nothing published below is unroutable

    idem::rabbitmq::PublisherOptions publisher_options;
    publisher_options.exchange = options.exchange;
    idem::rabbitmq::Publisher publisher(connection, publisher_options);
    const idem::Event first = idem::Event::make("order.paid", "order-1001", {{"tenant", "acme"}});
    publisher.publish(first);
    publisher.publish(idem::Event::make("order.paid", "order-1002"));
    publisher.publish(idem::Event::make("order.paid", "order-1003"));
    publisher.publish(first);  // a producer retry: same id
    std::cout << "published 4 messages (3 events, " << first.id << " twice)\n";

    int parcels = 0;
    auto shipping = idem::make_idempotent_handler(
        options.consumer_name, recorder,
        [&](const std::string& order, idem::BusProxy&, const idem::Event& event) {
          ++parcels;
          std::cout << "  shipping: parcel for " << order << " (event " << event.id << ")\n";
        },
        {idem::HandlerMode::exclusive});
    consumer.run_for(*shipping, 4);

    const auto stats = consumer.stats();
    std::cout << "delivered " << stats.delivered << ", acked " << stats.acked << " ("
              << stats.duplicates << " duplicate dropped), dead-lettered " << stats.dead_lettered
              << "; parcels shipped: " << parcels << "\n";
    if (parcels != 3) status = 1;

    idem::rabbitmq::delete_queue(connection, consumer.queue_name());
    idem::rabbitmq::delete_queue(connection, consumer.dead_letter_queue());
    idem::rabbitmq::delete_exchange(connection, options.exchange);
  } catch (const std::exception& e) {
    std::cerr << "example_rabbitmq_consumer: " << e.what() << "\n";
    status = 1;
  }
  for (const char* suffix : {"", "-wal", "-shm", "-journal"})
    std::remove((db_path + suffix).c_str());
  return status;
}
