// idem — the command-line tool: demos and store maintenance.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "demo.hpp"
#include "idem/error.hpp"
#include "store_commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"idem: make retried and redelivered work happen once"};
  app.require_subcommand(1);

  idem::cli::DemoOptions demo;
  auto* demo_cmd = app.add_subcommand(
      "demo",
      "Crash-and-replay demo: at-least-once delivery, a consumer killed mid-handler, "
      "side effects exactly once (embedded SQLite, or any recorder with --store URL)");
  demo_cmd->add_option("--events", demo.events, "Distinct events to publish")
      ->capture_default_str()
      ->check(CLI::Range(1, 10'000'000));
  demo_cmd
      ->add_option("--duplicates", demo.duplicate_ratio,
                   "Extra published copies, as a share of --events")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  demo_cmd->add_option("--ack-every", demo.ack_every, "The consumer acks every N deliveries")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000));
  demo_cmd
      ->add_option("--kill-at", demo.kill_at,
                   "Kill the consumer at this share of the stream (0..1)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 0.99));
  demo_cmd->add_option("--mode", demo.mode, "Handler mode")
      ->capture_default_str()
      ->check(CLI::IsMember({"transactional", "exclusive", "check_then_mark"}));
  demo_cmd->add_option("--dir", demo.dir, "Work dir (default: a new temp dir, removed after)");
  demo_cmd->add_flag("--keep", demo.keep, "Keep the work dir");
  demo_cmd->add_option("--seed", demo.seed, "Seed of the duplicate pattern")->capture_default_str();
  demo_cmd->add_option("--store", demo.store,
                       "Recorder URL: sqlite:///path.db, redis://host:port/db, "
                       "postgresql://user@host/db (default: idem.db in the work dir; see "
                       "docs/urls.md)");
  demo_cmd->add_option("--broker", demo.broker,
                       "Deliver through RabbitMQ at this amqp://user:password@host:port/vhost URL "
                       "(default: a file-backed queue; see docs/rabbitmq.md)");

  idem::cli::ConsumerOptions consumer;
  auto* consumer_cmd =
      app.add_subcommand("demo-consumer", "The demo's consumer process (started by `idem demo`)");
  consumer_cmd->group("");  // internal: hidden from --help
  consumer_cmd->add_option("--dir", consumer.dir)->required();
  consumer_cmd->add_option("--mode", consumer.mode);
  consumer_cmd->add_option("--consumer", consumer.consumer);
  consumer_cmd->add_option("--ack-every", consumer.ack_every);
  consumer_cmd->add_option("--stall-at", consumer.stall_at);
  consumer_cmd->add_option("--notify-fd", consumer.notify_fd);

  idem::cli::add_store_commands(app);  // stats, purge, inspect (run from their callbacks)
  CLI11_PARSE(app, argc, argv);
  try {
    if (demo_cmd->parsed()) return idem::cli::run_demo(demo);
    if (consumer_cmd->parsed()) return idem::cli::run_demo_consumer(consumer);
  } catch (const idem::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "idem: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
