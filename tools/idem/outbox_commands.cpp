#include "outbox_commands.hpp"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <thread>

#include "command_support.hpp"
#include "exit_codes.hpp"
#include "idem/error.hpp"
#include "idem/open.hpp"

#if IDEM_HAVE_RABBITMQ
#include "idem/rabbitmq/outbox_publisher.hpp"
#include "idem/rabbitmq/publisher.hpp"
#endif

namespace idem::cli {

std::shared_ptr<Outbox> outbox_of(std::string_view url, bool look_only, std::string* absent) {
  const auto none = [&](const std::string& why) -> std::shared_ptr<Outbox> {
    if (absent != nullptr) *absent = why;
    return nullptr;
  };
  OpenOptions options;
  if (look_only) options.schema = OpenOptions::Schema::look_only;
  std::shared_ptr<Outbox> outbox;
  try {
    outbox = open_outbox(url, options);
    // A look-only SQLite outbox finds out on first use whether the table exists.
    if (look_only) (void)outbox->stats();
  } catch (const NotSupported& e) {
    return none(e.what());  // memory, redis, sqlite::memory:
  } catch (const StoreError& e) {
    // Look-only opening creates nothing: a missing table is "none", not a failure.
    if (!look_only || e.retryable()) throw;
    return none(e.what());
  }
  return outbox;
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
  std::string retry_delay = "500ms";  // first wait after a failed connect; doubles up to retry_max
  std::string retry_max = "30s";
  std::string status_every = "1m";     // a summary line this often while the broker stays down
  std::uint64_t connect_attempts = 0;  // give up after this many failed connects (0: never)
};

#if IDEM_HAVE_RABBITMQ
void print_stats(const OutboxRelayStats& s, const std::optional<OutboxStats>& outbox) {
  std::printf("relay: %llu published, %llu refused, %llu parked, %llu failed passes\n",
              static_cast<unsigned long long>(s.published),
              static_cast<unsigned long long>(s.refused), static_cast<unsigned long long>(s.parked),
              static_cast<unsigned long long>(s.failures));
  if (outbox) {
    std::printf("outbox: %llu waiting, %llu parked\n",
                static_cast<unsigned long long>(outbox->depth),
                static_cast<unsigned long long>(outbox->parked));
  }
  std::fflush(stdout);
}

// The outbox's counts for the summary; a database that fails now does not hide what the relay
// did (the failure is on stderr).
std::optional<OutboxStats> outbox_stats(Outbox& outbox) {
  try {
    return outbox.stats();
  } catch (const std::exception& e) {
    std::cerr << "idem relay: outbox: " << describe(e) << "\n";
    return std::nullopt;
  }
}
#endif

int run_relay(const RelayArgs& args) {
  // From the first line: a SIGINT or SIGTERM while the broker is still down ends the relay with
  // its summary too.
  const StopSignals signals;
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
    const auto retry_delay = parse_duration(args.retry_delay);
    const auto retry_max = std::max(parse_duration(args.retry_max), retry_delay);
    const auto status_every = parse_duration(args.status_every);
    const auto connection = rabbitmq::ConnectionOptions::from_url(args.broker);
    std::string absent;
    auto outbox = outbox_of(args.store, /*look_only=*/false, &absent);
    if (!outbox) {
      std::cerr << "idem relay: " << redact_url(args.store) << ": " << absent << "\n";
      return kUsage;
    }
    rabbitmq::PublisherOptions publisher_options;
    publisher_options.exchange = args.exchange;
    auto broker = std::make_shared<OutageLog>("idem relay", "broker", status_every);
    auto database = std::make_shared<OutageLog>("idem relay", "outbox database", status_every);
    OutboxRelayOptions options;
    options.batch_size = args.batch;
    options.poll_interval = std::chrono::milliseconds(args.poll_ms);
    options.max_attempts = args.max_attempts;
    options.failure_backoff = retry_delay;
    options.on_failure = [broker, database](const std::exception& e) {
      (dynamic_cast<const rabbitmq::BrokerError*>(&e) != nullptr ? broker : database)
          ->failed(describe(e));
    };
    const std::string endpoint = rabbitmq::redact_amqp_url(args.broker);

    // The broker may be down when the relay starts: wait for it as for a restart, backing off.
    std::shared_ptr<rabbitmq::Publisher> publisher;
    auto delay = retry_delay;
    while (!publisher) {
      try {
        publisher = std::make_shared<rabbitmq::Publisher>(connection, publisher_options);
      } catch (const rabbitmq::BrokerError& e) {
        if (args.once || !e.retryable()) throw;
        broker->failed(describe(e));
        if (args.connect_attempts != 0 && broker->attempts() >= args.connect_attempts) {
          print_stats(OutboxRelayStats{}, outbox_stats(*outbox));
          std::cerr << "idem relay: gave up: broker " << broker->status() << "\n";
          return exit_code_of(e);
        }
        if (StopSignals::sleep_for(delay)) {
          print_stats(OutboxRelayStats{}, outbox_stats(*outbox));
          std::cerr << "idem relay: stopped by " << StopSignals::name() << " while the broker was "
                    << broker->status() << "\n";
          return kOk;
        }
        delay = std::min(delay * 2, retry_max);
      }
    }
    broker->recovered();
    OutboxRelay relay(outbox, std::make_shared<rabbitmq::RabbitMqOutboxPublisher>(publisher),
                      options);
    if (args.once) {
      relay.drain();
      print_stats(relay.stats(), outbox_stats(*outbox));
      return kOk;
    }
    std::printf("relay: %s -> %s (exchange %s); stop with SIGINT/SIGTERM\n",
                redact_url(args.store).c_str(), endpoint.c_str(), args.exchange.c_str());
    std::fflush(stdout);
    relay.start();
    // A pass that did not fail after failed ones means the broker answers again.
    std::uint64_t good_passes = 0;
    while (!StopSignals::sleep_for(std::chrono::milliseconds(50))) {
      const OutboxRelayStats now = relay.stats();
      if (now.passes - now.failures > good_passes) {
        good_passes = now.passes - now.failures;
        broker->recovered();
        database->recovered();
      }
    }
    relay.stop();
    print_stats(relay.stats(), outbox_stats(*outbox));
    if (broker->down()) std::cerr << "idem relay: broker " << broker->status() << "\n";
    if (database->down()) std::cerr << "idem relay: outbox database " << database->status() << "\n";
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
  relay_cmd->add_option(
      "--retry-delay", args->retry_delay,
      "Wait after a failed attempt to reach the broker; doubles up to --retry-max "
      "(default 500ms)");
  relay_cmd->add_option("--retry-max", args->retry_max,
                        "Longest wait between attempts to reach the broker (default 30s)");
  relay_cmd->add_option("--status-every", args->status_every,
                        "While the broker is down, a summary line this often (default 1m)");
  relay_cmd->add_option("--connect-attempts", args->connect_attempts,
                        "Give up (exit 3) after this many failed attempts to reach the broker at "
                        "start (default 0: keep trying)");
  relay_cmd->callback([args] {
    const int code = run_relay(*args);
    std::cout.flush();
    if (code != kOk) throw CLI::RuntimeError(code);
  });
}

}  // namespace idem::cli
