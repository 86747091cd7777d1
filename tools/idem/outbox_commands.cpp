#include "outbox_commands.hpp"

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "exit_codes.hpp"
#include "idem/error.hpp"
#include "idem/open.hpp"

#if IDEM_HAVE_SQLITE
#include "idem/sqlite/sqlite_outbox.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#endif
#if IDEM_HAVE_POSTGRES
#include "idem/postgres/postgres_outbox.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#endif
#if IDEM_HAVE_RABBITMQ
#include "idem/rabbitmq/outbox_publisher.hpp"
#include "idem/rabbitmq/publisher.hpp"
#endif

namespace idem::cli {

std::shared_ptr<Outbox> outbox_of(
    [[maybe_unused]] const std::shared_ptr<IdempotencyRecorder>& recorder,
    [[maybe_unused]] bool look_only, std::string* absent) {
  const auto none = [&](const std::string& why) -> std::shared_ptr<Outbox> {
    if (absent != nullptr) *absent = why;
    return nullptr;
  };
#if IDEM_HAVE_SQLITE
  if (auto* sqlite = dynamic_cast<sqlite::SqliteIdempotencyRecorder*>(recorder.get())) {
    if (sqlite->path() == ":memory:") return none("a private in-memory database has no outbox");
    sqlite::SqliteOptions options = sqlite->options();
    if (look_only) {
      options.read_only = true;
      options.create_schema = false;
    }
    auto outbox = std::make_shared<sqlite::SqliteOutbox>(sqlite->path(), options);
    if (look_only) {
      try {
        (void)outbox->stats();
      } catch (const StoreError& e) {
        return none(e.what());  // no idem_outbox table in the file
      }
    }
    return outbox;
  }
#endif
#if IDEM_HAVE_POSTGRES
  if (auto* pg = dynamic_cast<postgres::PostgresIdempotencyRecorder*>(recorder.get())) {
    try {
      return std::make_shared<postgres::PostgresOutbox>(pg->pool());
    } catch (const StoreError& e) {
      // Look-only pools do not create schemas: a missing table is "none", not a failure.
      if (!look_only || e.retryable()) throw;
      return none(e.what());
    }
  }
#endif
  return none("the backend has no outbox (SQLite and PostgreSQL have)");
}

namespace {

struct RelayArgs {
  std::string store;
  std::string broker;
  std::string exchange = "idem.events";
  bool once = false;
  std::size_t batch = 256;
  int poll_ms = 1000;
  int max_attempts = 5;
};

#if IDEM_HAVE_RABBITMQ
std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) {
  g_stop.store(true);
}

void print_stats(const OutboxRelayStats& s, const OutboxStats& outbox) {
  std::printf("relay: %llu published, %llu refused, %llu parked, %llu failed passes\n",
              static_cast<unsigned long long>(s.published),
              static_cast<unsigned long long>(s.refused), static_cast<unsigned long long>(s.parked),
              static_cast<unsigned long long>(s.failures));
  std::printf("outbox: %llu waiting, %llu parked\n", static_cast<unsigned long long>(outbox.depth),
              static_cast<unsigned long long>(outbox.parked));
  std::fflush(stdout);
}
#endif

int run_relay(const RelayArgs& args) {
  if (args.store.empty()) {
    std::cerr << "idem relay: --store URL is required (sqlite:PATH or postgresql://...)\n";
    return kUsage;
  }
  if (args.broker.empty()) {
    std::cerr << "idem relay: --broker amqp://... is required\n";
    return kUsage;
  }
#if IDEM_HAVE_RABBITMQ
  try {
    const auto connection = rabbitmq::ConnectionOptions::from_url(args.broker);
    auto recorder = open_recorder(args.store);
    std::string absent;
    auto outbox = outbox_of(recorder, /*look_only=*/false, &absent);
    if (!outbox) {
      std::cerr << "idem relay: " << redact_url(args.store) << ": " << absent << "\n";
      return kUsage;
    }
    rabbitmq::PublisherOptions publisher_options;
    publisher_options.exchange = args.exchange;
    OutboxRelayOptions options;
    options.batch_size = args.batch;
    options.poll_interval = std::chrono::milliseconds(args.poll_ms);
    options.max_attempts = args.max_attempts;
    // One line per kind of failure in a row, not one per pass: a broker restart is one message.
    options.on_failure = [last = std::string()](const std::exception& e) mutable {
      std::string message = describe(e);
      if (message == last) return;
      std::cerr << "idem relay: publishing failed, retrying: " << message << "\n";
      last = std::move(message);
    };
    std::shared_ptr<rabbitmq::Publisher> publisher;
    // The broker may be down when the relay starts: wait for it as for a restart.
    for (;;) {
      try {
        publisher = std::make_shared<rabbitmq::Publisher>(connection, publisher_options);
        break;
      } catch (const rabbitmq::BrokerError& e) {
        if (args.once || g_stop.load()) throw;
        std::cerr << "idem relay: broker unreachable, retrying: " << describe(e) << "\n";
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    }
    OutboxRelay relay(outbox, std::make_shared<rabbitmq::RabbitMqOutboxPublisher>(publisher),
                      options);
    if (args.once) {
      relay.drain();
      print_stats(relay.stats(), outbox->stats());
      return kOk;
    }
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
    std::printf("relay: %s -> %s (exchange %s); stop with SIGINT/SIGTERM\n",
                redact_url(args.store).c_str(), rabbitmq::redact_amqp_url(args.broker).c_str(),
                args.exchange.c_str());
    std::fflush(stdout);
    relay.start();
    while (!g_stop.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    relay.stop();
    print_stats(relay.stats(), outbox->stats());
    return kOk;
  } catch (const std::exception& e) {
    std::cerr << "idem relay: " << describe(e) << "\n";
    return exit_code_of(e);
  }
#else
  std::cerr << "idem relay: this idem was built without RabbitMQ (IDEM_WITH_RABBITMQ)\n";
  return kUsage;
#endif
}

}  // namespace

void add_outbox_commands(CLI::App& app) {
  auto args = std::make_shared<RelayArgs>();
  auto* relay_cmd = app.add_subcommand(
      "relay",
      "Publish the committed outbox rows of the recorder database at --store to RabbitMQ, with "
      "publisher confirms, deleting each row once confirmed (docs/outbox.md)");
  relay_cmd->add_option("--store", args->store, "sqlite:PATH or postgresql://...");
  relay_cmd->add_option("--broker", args->broker, "amqp://user:password@host:port/vhost");
  relay_cmd->add_option("--exchange", args->exchange, "Exchange to publish to")
      ->capture_default_str();
  relay_cmd->add_flag("--once", args->once, "Publish what is waiting, then exit");
  relay_cmd->add_option("--batch", args->batch, "Rows per pass (one publish_batch)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  relay_cmd->add_option("--poll-ms", args->poll_ms, "Longest wait between passes (ms)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3'600'000));
  relay_cmd
      ->add_option("--max-attempts", args->max_attempts,
                   "Refusals after which a row is parked (dead-lettered)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000));
  relay_cmd->callback([args] {
    const int code = run_relay(*args);
    std::cout.flush();
    if (code != kOk) throw CLI::RuntimeError(code);
  });
}

}  // namespace idem::cli
