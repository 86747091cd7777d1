// `idem demo` itself (../demo.hpp): checks its options, makes its work dir, store namespace and
// broker queues, runs the phases in order — producer, consumer (killed, restarted), and with
// --hops 2 the relay and shipping — reports, and removes what it made on every way out.
#include <sys/wait.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../demo.hpp"
#include "../exit_codes.hpp"
#include "../outbox_commands.hpp"
#include "../progress.hpp"
#include "broker.hpp"
#include "file_queue.hpp"
#include "hops.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/open.hpp"
#include "idem/outbox.hpp"
#include "ledger.hpp"
#include "modes.hpp"
#include "producer.hpp"
#include "report.hpp"
#include "store_namespace.hpp"
#include "supervisor.hpp"
#include "work_dir.hpp"

#ifdef IDEM_HAVE_SQLITE
#include "idem/sqlite/sqlite_recorder.hpp"
#endif

namespace idem::cli {
namespace {

using demo::fs::path;

// The argument checks of `idem demo` (InvalidArgument); returns the handler mode.
HandlerMode check_demo_options(const DemoOptions& options) {
  if (options.events == 0) throw InvalidArgument("--events must be at least 1");
  if (options.duplicate_ratio < 0 || options.duplicate_ratio > 10) {
    throw InvalidArgument("--duplicates must be between 0 and 10");
  }
  if (options.kill_at <= 0 || options.kill_at >= 1) {
    throw InvalidArgument("--kill-at must be between 0 and 1 (exclusive)");
  }
  if (options.ack_every == 0) throw InvalidArgument("--ack-every must be at least 1");
  const HandlerMode mode = demo::parse_mode(options.mode);
  if (options.hops != 1 && options.hops != 2) {
    throw InvalidArgument("--hops must be 1 or 2, got " + std::to_string(options.hops));
  }
  if (options.hops == 2 && mode != HandlerMode::transactional) {
    throw InvalidArgument(
        "--hops 2 needs --mode transactional: billing's follow-ups are outbox rows written in "
        "its marker's transaction");
  }
  return mode;
}

// Checks that the recorder can run the demo before anything is written to it: a mode the
// backend cannot do, or a recorder that dies with its process, stops the demo here.
void check_recorder(const IdempotencyRecorder& recorder, const DemoOptions& options,
                    HandlerMode mode, const std::string& shown) {
  bool in_memory = dynamic_cast<const InMemoryIdempotencyRecorder*>(&recorder) != nullptr;
#ifdef IDEM_HAVE_SQLITE
  const auto* sqlite_recorder = dynamic_cast<const sqlite::SqliteIdempotencyRecorder*>(&recorder);
  in_memory = in_memory || (sqlite_recorder != nullptr && sqlite_recorder->path() == ":memory:");
#endif
  if (in_memory) {
    throw NotSupported("--store " + shown +
                       ": an in-memory recorder lives and dies with one process, but the demo "
                       "kills its consumer process and starts a new one; use a SQLite file, "
                       "redis:// or postgresql://");
  }
  if (options.hops == 2 && !recorder.supports_transactions()) {
    throw NotSupported("--hops 2: --store " + shown +
                       " has no outbox: billing's follow-ups are outbox rows written in its "
                       "marker's transaction, which needs sqlite: or postgresql://");
  }
  if (mode == HandlerMode::transactional && !recorder.supports_transactions()) {
    throw NotSupported("--store " + shown +
                       ": --mode transactional needs a recorder whose transaction the handler "
                       "can write through (sqlite: or postgresql://); use --mode exclusive or "
                       "check_then_mark with this one");
  }
  if (mode == HandlerMode::exclusive && !recorder.supports_claims()) {
    throw NotSupported("--store " + shown + ": --mode exclusive needs a recorder with claims");
  }
}

// The outbox of a two-hop run, which must hold none but this run's rows (the relay publishes
// every waiting row). Null for one hop.
std::shared_ptr<Outbox> demo_outbox(const DemoOptions& options, const std::string& url) {
  if (options.hops != 2) return nullptr;
  std::string absent;
  auto outbox = outbox_of(url, /*look_only=*/false, &absent);
  if (!outbox) {
    throw NotSupported("--hops 2: " + redact_url(url) + " has no outbox (" + absent +
                       "); use a SQLite file or postgresql://");
  }
  const OutboxStats waiting = outbox->stats();
  if (waiting.depth != 0) {
    throw NotSupported("--hops 2: the outbox of " + redact_url(url) + " already holds " +
                       std::to_string(waiting.depth) +
                       " waiting rows, which the demo's relay would publish; give the demo a "
                       "database (or ?schema=) of its own");
  }
  return outbox;
}

// `text` as one shell word: as it is when it holds nothing a shell reads specially, else in
// single quotes.
std::string shell_word(const std::string& text) {
  if (text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                             "_-./:@%+=,") == std::string::npos) {
    return text;
  }
  std::string quoted = "'";
  for (const char c : text)
    quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// One run of the demo: what it made so far, so that close() removes (or keeps) exactly that.
class DemoRun {
 public:
  explicit DemoRun(const DemoOptions& options) : options_(options) {}

  // Runs every phase; returns 0 when every check passed, 1 otherwise.
  int execute();
  // Removes what the run made, or keeps it (--keep, --dir), and says which on `out`.
  void close(std::ostream& out) noexcept;

 private:
  const DemoOptions& options_;
  HandlerMode mode_ = HandlerMode::transactional;
  demo::KillPoint kill_point_ = demo::KillPoint::after_effect;
  std::optional<demo::DemoBroker> broker_;
  std::optional<demo::StoreNamespace> namespace_;
  std::optional<demo::WorkDir> work_;
  std::shared_ptr<IdempotencyRecorder> recorder_;
  std::shared_ptr<Outbox> outbox_;
  std::string ledger_;
  std::string billing_;
  std::string sample_event_;  // an event id for the "try: idem inspect" line
};

int DemoRun::execute() {
  mode_ = check_demo_options(options_);
  kill_point_ = demo::parse_kill_point(options_, mode_);
  // Everything that can refuse the run does so before anything is made.
  broker_.emplace(options_.broker);
  namespace_.emplace(options_, "idem-demo-" + new_event_id().substr(0, 8));
  work_.emplace(options_);
  const path& dir = work_->path();
  namespace_->place_default(dir);
  const std::string& url = namespace_->url();
  const std::string shown = redact_url(url);
  recorder_ = open_recorder(url);
  check_recorder(*recorder_, options_, mode_, redact_url(options_.store));
  outbox_ = demo_outbox(options_, url);
  billing_ = namespace_->consumer("billing");
  const std::string shipping = namespace_->consumer("shipping");
  // Transactional mode writes its side effect, a ledger row, through the marker's transaction,
  // so the ledger lives in the recorder's database.
  if (mode_ == HandlerMode::transactional) {
    ledger_ = namespace_->ledger(*recorder_);
    if (ledger_.empty()) {
      throw NotSupported("--mode transactional: the demo has no ledger for " + shown);
    }
    demo::create_ledger(*recorder_, ledger_);
  }

  std::cout << "idem demo: at-least-once delivery, a consumer killed mid-handler\n"
            << "  work dir:  " << dir.string()
            << (work_->kept() ? "\n" : " (removed at the end; --keep keeps it)\n")
            << "  recorder:  " << shown << "\n"
            << "  mode:      " << options_.mode << "\n"
            << "  kill:      " << demo::kill_description(mode_, kill_point_) << "\n"
            << "  consumer:  " << billing_
            << (namespace_->run().empty() ? "\n" : " (a fresh name for this run)\n");
  if (options_.hops == 2) {
    std::cout << "  hops:      2: billing -> outbox -> relay process -> shipping\n";
  }
  std::vector<std::string> consumers = {billing_};
  if (options_.hops == 2) consumers.push_back(shipping);
  broker_->declare(consumers);
  demo::enter_phase("starting");

  const path queue = demo::hop_files(dir, 1).queue;
  std::uint64_t stream_size = 0;
  {
    std::cout.flush();  // the progress line writes to stderr; keep the two in order
    ProgressBar bar(
        demo::bar_label("producing"),
        options_.events + static_cast<std::uint64_t>(static_cast<double>(options_.events) *
                                                     options_.duplicate_ratio));
    demo::enter_phase("producing");
    stream_size = demo::produce(queue, options_, [&](std::uint64_t written, std::uint64_t) {
      bar.update(written, "events written");
    });
    bar.finish();
  }
  if (broker_->used()) {
    ProgressBar bar(demo::bar_label("publishing"), stream_size);
    broker_->publish(queue, billing_, [&](std::uint64_t published) {
      bar.update(published, "confirmed by the broker");
      demo::check_interrupted();
    });
    bar.finish();
    std::cout << "  broker:    " << redact_url(options_.broker) << " (acked after each handler)\n"
              << "             exchange " << demo::consumer_exchange(billing_) << "\n"
              << "             queue idem." << billing_ << "\n";
  }
  std::cout << "  producer:  published " << stream_size << " events (" << options_.events
            << " distinct + " << (stream_size - options_.events) << " duplicates)\n";
  std::cout.flush();

  const demo::HopContext context{.options = options_,
                                 .dir = dir,
                                 .environment = {url, options_.broker},
                                 .ledger = ledger_,
                                 .kill_point = kill_point_};
  const std::optional<demo::DeliveryStats> billed = demo::run_consumer_hop(
      context,
      options_.hops == 2
          ? demo::ConsumerHop{billing_, 1, "billing", "billing", "consuming", "consumer-restarted"}
          : demo::ConsumerHop{billing_, 1, "consumer", "consuming", "consuming",
                              "consumer-restarted"},
      stream_size);
  if (!billed) return 1;

  std::optional<demo::SecondHop> second;
  demo::FirstHop first = demo::tally_first_hop(*billed, dir, *recorder_, mode_, ledger_, billing_);
  if (!first.published.empty()) sample_event_ = *first.published.begin();
  if (options_.hops == 2) {
    second =
        demo::run_second_hop(context, *recorder_, *outbox_, billing_, shipping, first.published);
    if (!second) return 1;
  }
  demo::enter_phase("results");
  return demo::report_results(options_, mode_, kill_point_, stream_size, first, second) ? 0 : 1;
}

void DemoRun::close(std::ostream& out) noexcept {
  outbox_.reset();
  const bool keep = options_.keep || !options_.dir.empty();
  std::string kept;
  if (namespace_) {
    if (options_.keep) {
      kept += namespace_->kept();
    } else {
      namespace_->remove(recorder_);
    }
  }
  recorder_.reset();  // closed before its directory goes
  if (broker_) broker_->clean_up();
  if (!work_) return;
  const std::string dir = work_->path().string();
  if (!work_->kept()) {
    work_.reset();  // removes it
    out << "\n(work dir " << dir << " removed; --keep keeps it)\n";
    return;
  }
  if (!keep) return;
  const std::string url = namespace_ ? shell_word(redact_url(namespace_->url())) : std::string();
  out << "\nkept:\n  work dir:  " << dir << "\n" << kept;
  if (!url.empty()) {
    out << "try:\n  idem stats " << url << "\n";
    if (!sample_event_.empty()) {
      out << "  idem inspect " << url << " \\\n      " << sample_event_ << " --consumer "
          << billing_ << "\n";
    }
  }
  if (mode_ == HandlerMode::transactional && !ledger_.empty()) {
    out << "  (transactional mode's side effects are the rows of " << ledger_ << ",\n"
        << "  written in the marker's transaction; side_effects.log is for the other modes)\n";
  }
}

}  // namespace

int run_demo(const DemoOptions& options) {
  demo::SignalScope signals;  // before anything starts
  DemoRun run(options);
  int code = 0;
  int stopped_by = 0;
  try {
    code = run.execute();
  } catch (const demo::Interrupted& stop) {
    stopped_by = stop.signal();
  } catch (...) {
    // A call cut short by the signal (EINTR) throws its own error: the signal is the cause.
    stopped_by = demo::pending_signal();
    if (stopped_by == 0) {
      run.close(std::cerr);
      throw;
    }
  }
  if (stopped_by == 0) {
    run.close(std::cout);
    std::cout.flush();
    return code;
  }
  // After SIGPIPE stdout may be gone: the summary goes to stderr.
  std::cerr << "\nidem demo: stopped by " << demo::signal_name(stopped_by) << " in phase "
            << demo::current_phase() << "; no child process of it is left\n";
  run.close(std::cerr);
  return 128 + stopped_by;
}

}  // namespace idem::cli
