// idem — the command-line tool: demos and store maintenance.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "demo.hpp"
#include "exit_codes.hpp"
#include "outbox_commands.hpp"
#include "proxy/proxy_command.hpp"
#include "store_commands.hpp"

namespace {

// The command line the user typed, for the hint after a usage error: "idem" or "idem purge".
std::string command_name(const CLI::App& app) {
  std::string name = "idem";
  for (const CLI::App* sub : app.get_subcommands())
    name += " " + sub->get_name();
  return name;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = idem::cli;
  CLI::App app{"idem: make retried and redelivered work happen once"};
  // Not require_subcommand(1): CLI11 would then report "a subcommand is required" for an unknown
  // one too. The checks after the parse name what is wrong instead.
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", std::string("idem ") + IDEM_VERSION);

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
  demo_cmd
      ->add_option("--kill-point", demo.kill_point,
                   "Where in the handler the consumer is killed: before-effect or after-effect "
                   "(default: after it in transactional and check_then_mark, before it in "
                   "exclusive)")
      ->check(CLI::IsMember({"before-effect", "after-effect"}));
  demo_cmd->add_option("--dir", demo.dir,
                       "Work dir, kept afterwards: new, empty or an earlier demo's (default: a "
                       "new temp dir, removed at the end)");
  demo_cmd->add_flag("--reuse-dir", demo.reuse_dir,
                     "Let --dir hold other files: the demo then replaces only its own file names "
                     "there (queue.jsonl, idem.db, ...; docs/cli.md)");
  demo_cmd->add_flag("--keep", demo.keep,
                     "Keep the temp work dir and what the demo wrote into --store, and print how "
                     "to look at them");
  demo_cmd->add_option("--seed", demo.seed, "Seed of the duplicate pattern")->capture_default_str();
  demo_cmd->add_option("--store", demo.store,
                       "Recorder URL: sqlite:///path.db, redis://host:port/db, "
                       "postgresql://user@host/db (default: idem.db in the work dir; see "
                       "docs/urls.md). It must hold no data; the demo writes under a namespace of "
                       "its own and removes it at the end");
  demo_cmd->add_flag("--allow-nonempty-store", demo.allow_nonempty_store,
                     "Run on a --store that already holds data (the demo still changes none of "
                     "it)");
  demo_cmd->add_option("--broker", demo.broker,
                       "Deliver through RabbitMQ at this amqp://user:password@host:port/vhost URL "
                       "(default: a file-backed queue; see docs/rabbitmq.md)");
  demo_cmd
      ->add_option("--hops", demo.hops,
                   "1: one consumer. 2: billing also publishes order.charged through the outbox "
                   "(transactional mode, a SQLite or PostgreSQL store), a relay process killed "
                   "once publishes it to a second queue, and a second consumer, shipping, killed "
                   "once too, ships each order once (docs/outbox.md)")
      ->capture_default_str()
      ->check(CLI::Range(1, 2));

  idem::cli::ConsumerOptions consumer;
  auto* consumer_cmd =
      app.add_subcommand("demo-consumer", "The demo's consumer process (started by `idem demo`)");
  consumer_cmd->group("");  // internal: hidden from --help
  consumer_cmd->add_option("--dir", consumer.dir)->required();
  consumer_cmd->add_option("--mode", consumer.mode);
  consumer_cmd->add_option("--kill-point", consumer.kill_point);
  consumer_cmd->add_option("--ledger", consumer.ledger);
  consumer_cmd->add_option("--consumer", consumer.consumer);
  consumer_cmd->add_option("--ack-every", consumer.ack_every);
  consumer_cmd->add_option("--stall-at", consumer.stall_at);
  consumer_cmd->add_option("--notify-fd", consumer.notify_fd);
  consumer_cmd->add_option("--hop", consumer.hop);
  consumer_cmd->add_flag("--outbox", consumer.outbox);

  idem::cli::RelayProcessOptions relay;
  auto* relay_cmd = app.add_subcommand(
      "demo-relay", "The demo's relay process (started by `idem demo --hops 2`)");
  relay_cmd->group("");  // internal: hidden from --help
  relay_cmd->add_option("--dir", relay.dir)->required();
  relay_cmd->add_option("--exchange", relay.exchange);
  relay_cmd->add_option("--stall-at", relay.stall_at);
  relay_cmd->add_option("--notify-fd", relay.notify_fd);

  idem::cli::add_store_commands(app);   // stats, purge, inspect (run from their callbacks)
  idem::cli::add_outbox_commands(app);  // relay (run from its callback)
  idem::cli::add_proxy_command(app);    // proxy (run from its callback)
  app.allow_extras();                   // an unknown command or option: named below
  // Every usage error exits with kUsage and one line (CLI11's own exit codes, 104-114, would
  // leak otherwise); the store commands end the parse from their callbacks with
  // CLI::RuntimeError(their exit code), after printing their own message.
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::string command = command_name(app);
    std::cerr << command << ": " << e.what() << " (see '" << command << " --help')\n";
    return cli::kUsage;
  }
  const std::string command = command_name(app);
  if (app.get_subcommands().empty()) {
    const std::vector<std::string> extras = app.remaining();
    if (extras.empty()) {
      std::cerr << "idem: a command is required: demo, stats, purge, inspect or relay (see 'idem "
                   "--help')\n";
    } else if (extras.front().rfind('-', 0) == 0) {
      std::cerr << "idem: unknown option '" << extras.front() << "' (see 'idem --help')\n";
    } else {
      std::cerr << "idem: unknown command '" << extras.front()
                << "': expected demo, stats, purge, inspect or relay (see 'idem --help')\n";
    }
    return cli::kUsage;
  }
  try {
    if (demo_cmd->parsed()) return cli::run_demo(demo);
    if (consumer_cmd->parsed()) return cli::run_demo_consumer(consumer);
    if (relay_cmd->parsed()) return cli::run_demo_relay(relay);
  } catch (const std::exception& e) {
    std::cerr << command << ": " << cli::describe(e) << "\n";
    return cli::exit_code_of(e);
  }
  return cli::kOk;
}
