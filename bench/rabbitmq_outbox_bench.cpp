// What the outbox costs, measured in one run against its baselines:
//
//   bench_rabbitmq_outbox AMQP_URL|none [EVENTS [REPEATS]]
//
//   handler  a transactional SQLite handler (durability normal) writing one business row per
//            event, with 0, 1 and 4 follow-ups through the outbox: events/s of each, and the
//            ratio to the handler without follow-ups (the cost of the outbox rows);
//   relay    EVENTS committed outbox rows relayed to RabbitMQ by OutboxRelay (256 rows per
//            pass: one publish_batch with confirms, then the delete), next to
//            Publisher::publish_batch alone sending the same events in batches of 256 (the
//            broker's confirmed throughput): rows/s of each and their ratio. Skipped for "none".
// Each figure is the median of REPEATS runs (default 3), the variants interleaved. Default EVENTS
// 5000. Prints one line per figure and the ratios.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "idem/handler.hpp"
#include "idem/outbox.hpp"
#include "idem/rabbitmq/admin.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/outbox_publisher.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "idem/sql.hpp"
#include "idem/sqlite/sqlite_outbox.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

int g_run = 0;

std::string fresh_db() {
  const fs::path dir =
      fs::temp_directory_path() / ("idem-outbox-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / ("run-" + std::to_string(g_run++) + ".db")).string();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Db {
  std::string path = fresh_db();
  idem::sqlite::SqliteOptions options = [] {
    idem::sqlite::SqliteOptions o;
    o.durability = idem::sqlite::Durability::normal;
    return o;
  }();
  std::shared_ptr<idem::sqlite::SqliteIdempotencyRecorder> recorder =
      std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(path, options);
  std::shared_ptr<idem::sqlite::SqliteOutbox> outbox =
      std::make_shared<idem::sqlite::SqliteOutbox>(path, options);
  Db() {
    // False on a later run: the setup marker says the table is there.
    static_cast<void>(recorder->run_transactional("setup", "schema", [](idem::Transaction& t) {
      dynamic_cast<idem::SqlTransaction&>(t).exec(
          "CREATE TABLE IF NOT EXISTS ledger(order_no TEXT PRIMARY KEY, cents INTEGER)");
    }));
  }
  ~Db() {
    for (const char* suffix : {"", "-wal", "-shm", "-outbox.lock"})
      fs::remove(path + suffix);
  }
};

// The follow-up event a handler publishes for an order it charged.
idem::Event charged(const std::string& payload) {
  idem::Event out;
  out.type = "order.charged";
  out.payload = payload;
  return out;
}

// Events/s of a transactional handler with `follow_ups` outbox rows per event.
double handler_rate(int events, int follow_ups) {
  Db db;
  idem::HandlerOptions options;
  options.mode = idem::HandlerMode::transactional;
  if (follow_ups > 0) options.outbox = db.outbox;
  auto handler = idem::make_idempotent_handler(
      "billing", db.recorder,
      [follow_ups](const std::string& payload, idem::BusProxy& bus, const idem::Event& event) {
        auto& tx = dynamic_cast<idem::SqlTransaction&>(*bus.transaction());
        tx.exec("INSERT INTO ledger(order_no, cents) VALUES ($1, $2)", {event.id, 1250});
        for (int i = 0; i < follow_ups; ++i)
          bus.publish(charged(payload));
      },
      options);
  idem::CollectingBusProxy proxy("billing");
  std::vector<idem::Event> incoming;
  for (int i = 0; i < events; ++i)
    incoming.push_back(
        idem::Event::make("order.created", R"({"order":)" + std::to_string(i) + "}"));
  const auto start = Clock::now();
  for (const auto& e : incoming)
    (*handler)(e, proxy);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return events / seconds;
}

struct Broker {
  idem::rabbitmq::ConnectionOptions connection;
  std::string exchange;
  std::string queue;
  explicit Broker(const std::string& url)
      : connection(idem::rabbitmq::ConnectionOptions::from_url(url)),
        exchange("idem.outbox-bench." + idem::new_event_id().substr(0, 8)) {
    idem::rabbitmq::ConsumerOptions options;
    options.consumer_name = "outbox-bench-" + idem::new_event_id().substr(0, 8);
    options.exchange = exchange;
    queue = "idem." + options.consumer_name;
    idem::rabbitmq::Consumer(connection, options).connect();  // a bound queue: messages are stored
  }
  ~Broker() {
    try {
      idem::rabbitmq::delete_queue(connection, queue);
      idem::rabbitmq::delete_queue(connection, queue + ".dlq");
      idem::rabbitmq::delete_exchange(connection, exchange);
    } catch (...) {
    }
  }
  std::shared_ptr<idem::rabbitmq::Publisher> publisher() const {
    idem::rabbitmq::PublisherOptions options;
    options.exchange = exchange;
    return std::make_shared<idem::rabbitmq::Publisher>(connection, options);
  }
};

double publish_batch_rate(const Broker& broker, int events) {
  auto publisher = broker.publisher();
  std::vector<idem::Event> all;
  for (int i = 0; i < events; ++i)
    all.push_back(idem::Event::make("order.charged", R"({"order":)" + std::to_string(i) + "}"));
  const auto start = Clock::now();
  for (std::size_t i = 0; i < all.size(); i += 256) {
    const std::size_t n = std::min<std::size_t>(256, all.size() - i);
    publisher->publish_batch(std::span<const idem::Event>(all.data() + i, n));
  }
  return events / std::chrono::duration<double>(Clock::now() - start).count();
}

double relay_rate(const Broker& broker, int events) {
  Db db;
  idem::HandlerOptions options;
  options.mode = idem::HandlerMode::transactional;
  options.outbox = db.outbox;
  auto handler = idem::make_idempotent_handler(
      "billing", db.recorder,
      [](const std::string& payload, idem::BusProxy& bus) { bus.publish(charged(payload)); },
      options);
  idem::CollectingBusProxy proxy("billing");
  for (int i = 0; i < events; ++i)
    (*handler)(idem::Event::make("order.created", R"({"order":)" + std::to_string(i) + "}"), proxy);
  idem::OutboxRelay relay(
      db.outbox, std::make_shared<idem::rabbitmq::RabbitMqOutboxPublisher>(broker.publisher()));
  const auto start = Clock::now();
  const std::size_t published = relay.drain();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (published != static_cast<std::size_t>(events)) {
    std::fprintf(stderr, "relay published %zu of %d\n", published, events);
    std::exit(1);
  }
  return events / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_rabbitmq_outbox AMQP_URL|none [EVENTS [REPEATS]]\n");
    return 2;
  }
  const std::string url = argv[1];
  const int events = argc > 2 ? std::atoi(argv[2]) : 5000;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  if (events < 1 || repeats < 1) {
    std::fprintf(stderr, "EVENTS and REPEATS must be >= 1\n");
    return 2;
  }
  std::vector<double> h0, h1, h4, pb, rl;
  for (int r = 0; r < repeats; ++r) {
    h0.push_back(handler_rate(events, 0));
    h1.push_back(handler_rate(events, 1));
    h4.push_back(handler_rate(events, 4));
  }
  const double base = median(h0);
  std::printf("handler_no_follow_ups events_per_s=%.0f\n", base);
  std::printf("handler_1_outbox_row events_per_s=%.0f ratio=%.3f\n", median(h1), median(h1) / base);
  std::printf("handler_4_outbox_rows events_per_s=%.0f ratio=%.3f\n", median(h4),
              median(h4) / base);
  if (url != "none") {
    Broker broker(url);
    for (int r = 0; r < repeats; ++r) {
      pb.push_back(publish_batch_rate(broker, events));
      rl.push_back(relay_rate(broker, events));
    }
    std::printf("publish_batch_alone events_per_s=%.0f\n", median(pb));
    std::printf("outbox_relay rows_per_s=%.0f ratio=%.3f\n", median(rl), median(rl) / median(pb));
  }
  std::error_code ec;
  fs::remove_all(fs::temp_directory_path() / ("idem-outbox-bench-" + std::to_string(::getpid())),
                 ec);
  return 0;
}
