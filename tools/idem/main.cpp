// idem — the command-line tool: demos and store maintenance.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <exception>
#include <iostream>
#include <memory>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "demo.hpp"
#include "exit_codes.hpp"
#include "outbox_commands.hpp"
#include "proxy/proxy_command.hpp"
#include "record_commands.hpp"
#include "store_commands.hpp"

namespace {

// The command line the user typed, for the hint after a usage error: "idem" or "idem purge".
std::string command_name(const CLI::App& app) {
  std::string name = "idem";
  for (const CLI::App* sub : app.get_subcommands())
    name += " " + sub->get_name();
  return name;
}

// The commands a user may type, in the order of the help ("demo, stats, ... or relay").
std::vector<std::string> public_commands(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App* s) {
         return !s->get_group().empty();  // internal commands have no group
       })) {
    if (sub->get_name() != "help") names.push_back(sub->get_name());
  }
  return names;
}

// The subcommand called `name`, or null.
const CLI::App* find_command(CLI::App& app, const std::string& name) {
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == name) return sub;
  }
  return nullptr;
}

std::string listed(const std::vector<std::string>& names) {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i) {
    text += names[i];
    text += i + 2 == names.size() ? " or " : i + 1 == names.size() ? "" : ", ";
  }
  return text;
}

// A number as CLI11 prints a range's end ("0.010000") as a user writes it ("0.01").
std::string plain_number(std::string text) {
  if (text.find('.') == std::string::npos) return text;
  while (text.back() == '0')
    text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text;
}

bool is_number(const std::string& text) {
  static const std::regex kNumber(R"(-?[0-9]+(\.[0-9]+)?)");
  return std::regex_match(text, kNumber);
}

// CLI11's parse errors in idem's words: the value quoted, ranges as a user writes them, no type
// strings ("1 required UINT:INT in [1 - 10000000] missing") and no capitalised sentences.
std::string plain_parse_error(const std::string& text) {
  std::smatch m;
  static const std::regex kRange(R"(^(--[\w-]+): Value (.*) not in range (\S+) to (\S+)$)");
  static const std::regex kMember(R"(^(--[\w-]+): (.*) not in \{(.*)\}$)");
  static const std::regex kMissing(R"(^(--[\w-]+): [0-9]+ required .* missing$)");
  static const std::regex kConvert(R"(^Could not convert: (--[\w-]+) = (.*)$)");
  static const std::regex kExtra(
      R"(^The following arguments? (?:was|were) not expected: (\S+).*$)");
  if (std::regex_match(text, m, kRange)) {
    const std::string range =
        "expected " + plain_number(m[3].str()) + " to " + plain_number(m[4].str());
    if (!is_number(m[2].str()))
      return m[1].str() + ": '" + m[2].str() + "' is not a number (" + range + ")";
    return m[1].str() + ": " + m[2].str() + " is out of range (" + range + ")";
  }
  if (std::regex_match(text, m, kMember)) {
    std::vector<std::string> names;
    std::string list = m[3].str();
    for (std::size_t at = 0; at <= list.size();) {
      const std::size_t comma = std::min(list.find(',', at), list.size());
      names.push_back(list.substr(at, comma - at));
      at = comma + 1;
    }
    return m[1].str() + ": '" + m[2].str() + "' is not " + listed(names);
  }
  if (std::regex_match(text, m, kMissing)) return m[1].str() + ": a value is required";
  if (std::regex_match(text, m, kConvert))
    return m[1].str() + ": '" + m[2].str() + "' is not a number";
  if (std::regex_match(text, m, kExtra)) {
    const std::string word = m[1].str();
    return (word.starts_with('-') ? "unknown option '" : "unexpected argument '") + word + "'";
  }
  return text;
}

// CLI11's help without its type noise ("UINT:INT in [1 - 10000000]"): an option's value is
// named by what it is (N, NUMBER, TEXT), its default follows "=", ranges are in the
// descriptions. Positionals are shown by name in capitals (URL, KEY), required unless named in
// `optional` (CLI11 would show every one as optional: idem's commands check them themselves).
class HelpFormatter : public CLI::Formatter {
 public:
  explicit HelpFormatter(std::vector<std::string> optional) : optional_(std::move(optional)) {}

  std::string make_option_name(const CLI::Option* opt, bool is_positional) const override {
    if (!is_positional) return CLI::Formatter::make_option_name(opt, false);
    std::string name = opt->get_name(true, false);
    for (char& c : name)
      c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return name;
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    if (opt->get_positional() || opt->get_type_size() == 0) return {};
    std::string type = opt->get_type_name();
    type = type.substr(0, type.find(':'));  // drop the validators' descriptions
    if (type == "UINT" || type == "INT") type = "N";
    if (type == "FLOAT") type = "NUMBER";
    std::string text = " " + type;
    if (!opt->get_default_str().empty()) text += "=" + opt->get_default_str();
    return text;
  }
  std::string make_usage(const CLI::App* app, std::string name) const override {
    std::string usage = CLI::Formatter::make_usage(app, std::move(name));
    const std::size_t at = usage.find("SUBCOMMAND");
    if (at != std::string::npos) usage.replace(at, 10, "COMMAND");
    return usage;
  }
  std::string make_option_usage(const CLI::Option* opt) const override {
    const std::string name = make_option_name(opt, true);
    const bool optional = std::find(optional_.begin(), optional_.end(),
                                    opt->get_name(true, false)) != optional_.end();
    return optional ? "[" + name + "]" : name;
  }

 private:
  std::vector<std::string> optional_;
};

}  // namespace

int main(int argc, char** argv) {
  namespace cli = idem::cli;
  CLI::App app{"idem: make retried and redelivered work happen once", "idem"};
  app.formatter(std::make_shared<HelpFormatter>(std::vector<std::string>{"command"}));
  // Not require_subcommand(1): CLI11 would then report "a subcommand is required" for an unknown
  // one too. The checks after the parse name what is wrong instead.
  app.require_subcommand(0, 1);
  app.set_version_flag(
      "-v,--version",
      std::string("idem ") + IDEM_VERSION + "\nfaces: " + IDEM_BUILD_FACES +
          "\nbackends: " + IDEM_BUILD_BACKENDS + "\ntransports: " +
          (std::string_view(IDEM_BUILD_TRANSPORTS).empty() ? std::string("none")
                                                           : std::string(IDEM_BUILD_TRANSPORTS)),
      "Print the version and what this build holds, then exit");
  app.footer("Run 'idem help COMMAND' (or 'idem COMMAND --help') for a command's options.");

  idem::cli::DemoOptions demo;
  auto* demo_cmd = app.add_subcommand(
      "demo",
      "Crash-and-replay demo: at-least-once delivery, a consumer killed mid-handler, "
      "side effects exactly once (embedded SQLite, or any recorder with --store URL)");
  demo_cmd->add_option("--events", demo.events, "Distinct events to publish (1 to 10000000)")
      ->capture_default_str()
      ->check(CLI::Range(1, 10'000'000));
  demo_cmd
      ->add_option("--duplicates", demo.duplicate_ratio,
                   "Extra published copies, as a share of --events (0 to 10)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  demo_cmd
      ->add_option("--ack-every", demo.ack_every,
                   "The consumer acks every N deliveries (1 to 1000000)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000));
  demo_cmd
      ->add_option("--kill-at", demo.kill_at,
                   "Kill the consumer at this share of the stream (0.01 to 0.99)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 0.99));
  demo_cmd
      ->add_option("--mode", demo.mode, "Handler mode: transactional, exclusive or check_then_mark")
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
  idem::cli::add_record_commands(app);  // list, release
  idem::cli::add_outbox_commands(app);  // relay (run from its callback)
  idem::cli::add_proxy_command(app);    // proxy (run from its callback)
  std::string help_topic;
  auto* help_cmd = app.add_subcommand("help", "Show the help of idem, or of one command");
  help_cmd->add_option("command", help_topic, "The command whose help to show");
  app.allow_extras();  // an unknown command or option: named below

  const std::vector<std::string> commands = public_commands(app);
  const auto unknown_command = [&](std::string_view name) {
    std::cerr << "idem: unknown command '" << name << "': expected " << listed(commands)
              << " (see 'idem --help')\n";
    return cli::kUsage;
  };
  // An unknown command is an error even with --help after it (CLI11 would show the main help).
  if (argc > 1 && argv[1][0] != '-' && find_command(app, argv[1]) == nullptr) {
    return unknown_command(argv[1]);
  }

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
    std::cerr << command << ": " << plain_parse_error(e.what()) << " (see '" << command
              << " --help')\n";
    return cli::kUsage;
  }
  const std::string command = command_name(app);
  if (app.get_subcommands().empty()) {
    const std::vector<std::string> extras = app.remaining();
    if (extras.empty()) {
      std::cerr << "idem: a command is required: " << listed(commands) << " (see 'idem --help')\n";
    } else if (extras.front().rfind('-', 0) == 0) {
      std::cerr << "idem: unknown option '" << extras.front() << "' (see 'idem --help')\n";
    } else {
      return unknown_command(extras.front());
    }
    return cli::kUsage;
  }
  if (help_cmd->parsed()) {
    if (!help_cmd->remaining().empty()) {
      std::cerr << "idem help: unexpected argument '" << help_cmd->remaining().front()
                << "' (see 'idem help')\n";
      return cli::kUsage;
    }
    // App::help() would show the help of the command that ran: `help` itself.
    if (help_topic.empty()) {
      std::cout << app.get_formatter()->make_help(&app, "idem", CLI::AppFormatMode::Normal);
      return cli::kOk;
    }
    const CLI::App* topic = find_command(app, help_topic);
    if (topic == nullptr || topic->get_group().empty()) return unknown_command(help_topic);
    std::cout << topic->help("idem");
    return cli::kOk;
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
