#include "demo.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/open.hpp"
#include "idem/outbox.hpp"
#include "outbox_commands.hpp"
#include "progress.hpp"

#include "idem/sql.hpp"

#ifdef IDEM_HAVE_SQLITE
#include "idem/sqlite/sqlite_recorder.hpp"
#endif
#ifdef IDEM_HAVE_POSTGRES
#include "idem/postgres/postgres_recorder.hpp"
#endif
#ifdef IDEM_HAVE_RABBITMQ
#include "idem/rabbitmq/admin.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/outbox_publisher.hpp"
#include "idem/rabbitmq/publisher.hpp"
#endif

extern char** environ;

namespace fs = std::filesystem;

namespace idem::cli {
namespace {

constexpr const char* kConsumer = "billing";
// The ledger of transactional mode (ledger_table()): one row per side effect, tagged with the
// run's consumer name.
constexpr const char* kLedgerColumns =
    "(consumer TEXT NOT NULL, event_id TEXT NOT NULL, order_no BIGINT, amount_cents BIGINT)";

// ---- small RAII helpers --------------------------------------------------------------------

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const std::string& text) {
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("write failed: " + std::string(std::strerror(errno)));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

// Appends lines with O_APPEND writes: every line is on disk (in the page cache) the moment
// write() returns, so what a killed process did is still countable afterwards.
class AppendLog {
 public:
  explicit AppendLog(const fs::path& path)
      : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
    if (fd_.fd < 0) throw std::runtime_error("cannot open " + path.string());
  }
  void line(const std::string& text) { write_all(fd_.fd, text + "\n"); }

 private:
  Fd fd_;
};

HandlerMode parse_mode(const std::string& mode) {
  if (mode == "transactional") return HandlerMode::transactional;
  if (mode == "exclusive") return HandlerMode::exclusive;
  if (mode == "check_then_mark") return HandlerMode::check_then_mark;
  throw InvalidArgument("unknown mode '" + mode +
                        "' (expected transactional, exclusive or check_then_mark)");
}

// The recorder URL a demo (or its consumer) uses: --store, or the SQLite file in the work dir.
std::string recorder_url(const std::string& store, const fs::path& dir) {
  if (!store.empty()) return store;
#ifdef IDEM_HAVE_SQLITE
  return "sqlite://" + fs::absolute(dir / "idem.db").string();
#else
  (void)dir;
  throw NotSupported(
      "this idem was built without the SQLite backend (IDEM_WITH_SQLITE=OFF), the demo's "
      "default recorder: give --store redis://... or --store postgresql://...");
#endif
}

// The ledger of transactional mode: in the recorder's own database, written through the
// marker's transaction (idem::SqlTransaction). Empty: the demo has no ledger for this recorder.
std::string ledger_table([[maybe_unused]] const IdempotencyRecorder& recorder) {
#ifdef IDEM_HAVE_SQLITE
  if (dynamic_cast<const sqlite::SqliteIdempotencyRecorder*>(&recorder) != nullptr) {
    return "idem_demo_ledger";
  }
#endif
#ifdef IDEM_HAVE_POSTGRES
  if (const auto* pg = dynamic_cast<const postgres::PostgresIdempotencyRecorder*>(&recorder)) {
    return pg->pool()->options().schema + ".demo_ledger";
  }
#endif
  return {};
}

// Makes the ledger, through the recorder's own transaction (recorded under "idem-demo-setup").
void create_ledger(IdempotencyRecorder& recorder, const std::string& ledger,
                   const std::string& consumer) {
  // False: an earlier run made it (its setup marker is there), nothing to do.
  static_cast<void>(recorder.run_transactional("idem-demo-setup", consumer, [&](Transaction& tx) {
    dynamic_cast<SqlTransaction&>(tx).exec("CREATE TABLE IF NOT EXISTS " + ledger + kLedgerColumns);
  }));
}

struct LedgerCount {
  std::int64_t rows = 0;
  std::int64_t distinct_events = 0;
  std::int64_t distinct_orders = 0;
};

// Counts the side effects of `consumer` in the ledger, in a transaction of the recorder that is
// always rolled back (its marker with it): the demo's way to read the ledger through the
// recorder's own connection settings.
LedgerCount count_ledger(IdempotencyRecorder& recorder, const std::string& ledger,
                         const std::string& consumer) {
  struct Rollback {};
  LedgerCount count;
  try {
    // Always rolled back by the Rollback thrown below (a fresh id: it never finds a marker).
    static_cast<void>(
        recorder.run_transactional("idem-demo-check", new_event_id(), [&](Transaction& tx) {
          auto& sql = dynamic_cast<SqlTransaction&>(tx);
          const std::string where = " WHERE consumer = $1";
          count.rows =
              sql.query_int64("SELECT COUNT(*) FROM " + ledger + where, {consumer}).value_or(0);
          count.distinct_events =
              sql.query_int64("SELECT COUNT(DISTINCT event_id) FROM " + ledger + where, {consumer})
                  .value_or(0);
          count.distinct_orders =
              sql.query_int64("SELECT COUNT(DISTINCT order_no) FROM " + ledger + where, {consumer})
                  .value_or(0);
          throw Rollback{};
        }));
  } catch (const Rollback&) {
  }
  return count;
}

// The files of one hop in the work dir: its queue (one JSON event a line), the consumer's
// committed offset, its delivery log and (outside transactional mode) its side-effect log.
struct HopFiles {
  fs::path queue, offset, deliveries, side_effects;
};

HopFiles hop_files(const fs::path& dir, int hop) {
  if (hop == 2) {
    return {dir / "charged.jsonl", dir / "charged.offset", dir / "shipping.log",
            dir / "shipping_effects.log"};
  }
  return {dir / "queue.jsonl", dir / "offset", dir / "deliveries.log", dir / "side_effects.log"};
}

std::uint64_t read_offset(const fs::path& path) {
  std::ifstream in(path);
  std::uint64_t offset = 0;
  if (in) in >> offset;
  return offset;
}

// The "ack": atomically replace the committed offset (write a temp file, then rename).
void commit_offset(const fs::path& path, std::uint64_t offset) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << offset << "\n";
  }
  fs::rename(tmp, path);
}

std::vector<Event> read_queue(const fs::path& path) {
  std::ifstream in(path);
  std::vector<Event> events;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    Event e;
    e.id = j.at("id").get<std::string>();
    e.type = j.at("type").get<std::string>();
    e.payload = j.at("payload").get<std::string>();
    e.headers["seq"] = std::to_string(j.at("seq").get<std::uint64_t>());
    if (j.contains("source")) e.headers["source"] = j.at("source").get<std::string>();
    events.push_back(std::move(e));
  }
  return events;
}

// ---- the producer --------------------------------------------------------------------------

// Distinct events, plus `duplicates` extra copies each placed somewhere after its original —
// what a producer that retries its publish (or a broker that redelivers) produces.
std::size_t publish(const fs::path& dir, const DemoOptions& options) {
  std::mt19937_64 rng(options.seed);
  std::vector<nlohmann::json> stream;
  stream.reserve(options.events);
  for (std::uint64_t i = 0; i < options.events; ++i) {
    nlohmann::json payload = {{"order", i + 1}, {"amount_cents", 100 + (rng() % 90000)}};
    stream.push_back({{"id", new_event_id()}, {"type", "order.paid"}, {"payload", payload.dump()}});
  }
  const auto duplicates =
      static_cast<std::uint64_t>(static_cast<double>(options.events) * options.duplicate_ratio);
  for (std::uint64_t d = 0; d < duplicates; ++d) {
    const std::size_t original = rng() % stream.size();
    const std::size_t position = original + 1 + rng() % (stream.size() - original);
    stream.insert(stream.begin() + static_cast<std::ptrdiff_t>(position), stream[original]);
  }
  std::ofstream out(dir / "queue.jsonl", std::ios::trunc);
  for (std::size_t seq = 0; seq < stream.size(); ++seq) {
    stream[seq]["seq"] = seq;
    out << stream[seq].dump() << "\n";
  }
  return stream.size();
}

// ---- watching the consumer -----------------------------------------------------------------

struct DeliveryStats {
  std::uint64_t deliveries = 0;
  std::uint64_t redeliveries = 0;
  std::uint64_t processed = 0;
  std::uint64_t duplicates_dropped = 0;
  std::uint64_t in_progress_retries = 0;
  std::uint64_t furthest = 0;  // highest sequence number delivered + 1
};

// Reads deliveries.log: "D seq" before a handler runs, "P seq" / "X seq" / "B seq" after it
// processed / dropped a duplicate / was told the event is in progress elsewhere.
class DeliveryLogReader {
 public:
  explicit DeliveryLogReader(fs::path path) : path_(std::move(path)) {}

  const DeliveryStats& poll() {
    std::ifstream in(path_);
    in.seekg(static_cast<std::streamoff>(consumed_));
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // a line still being written; read it next time
      consumed_ += line.size() + 1;
      if (line.size() < 3) continue;
      const std::uint64_t seq = std::stoull(line.substr(2));
      switch (line[0]) {
        case 'D':
          ++stats_.deliveries;
          if (!seen_.insert(seq).second) ++stats_.redeliveries;
          stats_.furthest = std::max(stats_.furthest, seq + 1);
          break;
        case 'P':
          ++stats_.processed;
          break;
        case 'X':
          ++stats_.duplicates_dropped;
          break;
        case 'B':
          ++stats_.in_progress_retries;
          break;
        default:
          break;
      }
    }
    return stats_;
  }

 private:
  fs::path path_;
  std::size_t consumed_ = 0;
  std::set<std::uint64_t> seen_;
  DeliveryStats stats_;
};

// Starts this executable again with `args` (argv[0] first), the recorder URL and the broker
// URL in the environment.
pid_t spawn_process(std::vector<std::string> args, const DemoOptions& options,
                    const std::string& url) {
  // The environment is built before fork(): the child may only call async-signal-safe functions.
  std::string store_variable = std::string(kDemoStoreVariable) + "=" + url;
  std::string broker_variable = std::string(kDemoBrokerVariable) + "=" + options.broker;
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.rfind(std::string(kDemoStoreVariable) + "=", 0) != 0 &&
        entry.rfind(std::string(kDemoBrokerVariable) + "=", 0) != 0)
      envp.push_back(*e);
  }
  envp.push_back(store_variable.data());
  if (!options.broker.empty()) envp.push_back(broker_variable.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::execve("/proc/self/exe", argv.data(), envp.data());
    std::perror("exec idem demo-consumer");
    ::_exit(127);
  }
  return pid;
}

pid_t spawn_consumer(const fs::path& dir, const DemoOptions& options, const std::string& url,
                     const std::string& consumer, std::int64_t stall_at, int notify_fd,
                     int hop = 1) {
  std::vector<std::string> args = {
      "idem",       "demo-consumer", "--dir",  dir.string(),  "--mode",
      options.mode, "--consumer",    consumer, "--ack-every", std::to_string(options.ack_every)};
  if (stall_at >= 0) {
    args.insert(args.end(),
                {"--stall-at", std::to_string(stall_at), "--notify-fd", std::to_string(notify_fd)});
  }
  if (options.hops == 2) args.insert(args.end(), {"--hop", std::to_string(hop)});
  if (options.hops == 2 && hop == 1) args.emplace_back("--outbox");
  return spawn_process(std::move(args), options, url);
}

pid_t spawn_relay(const fs::path& dir, const DemoOptions& options, const std::string& url,
                  const std::string& exchange, std::int64_t stall_at, int notify_fd) {
  std::vector<std::string> args = {"idem", "demo-relay", "--dir", dir.string()};
  if (!exchange.empty()) args.insert(args.end(), {"--exchange", exchange});
  if (stall_at >= 0) {
    args.insert(args.end(),
                {"--stall-at", std::to_string(stall_at), "--notify-fd", std::to_string(notify_fd)});
  }
  return spawn_process(std::move(args), options, url);
}

std::string ratio_note(const DeliveryStats& s) {
  return std::to_string(s.deliveries) + " deliveries, " + std::to_string(s.duplicates_dropped) +
         " duplicates dropped";
}

// The relay's log has a "D seq" line per row it published.
std::string relay_note(const DeliveryStats& s) {
  return std::to_string(s.deliveries) + " rows published";
}

// Runs until the child exits (or, with notify_fd, until it reports it stalled — then kills it).
// Returns the child's wait status, or -1 when it was killed on purpose; `stalled_seq` gets the
// sequence number the child stalled in.
int watch(pid_t pid, int notify_fd, DeliveryLogReader& log, ProgressBar& bar,
          std::string* stalled_seq = nullptr,
          std::string (*note)(const DeliveryStats&) = ratio_note) {
  for (;;) {
    bar.update(log.poll().furthest, note(log.poll()));
    if (notify_fd >= 0) {
      pollfd p{notify_fd, POLLIN, 0};
      // A child that exited also makes the pipe readable (EOF): only a message means "stalled".
      char buffer[32];
      ssize_t n = 0;
      if (::poll(&p, 1, 50) > 0 && (n = ::read(notify_fd, buffer, sizeof buffer)) > 0) {
        ::kill(pid, SIGKILL);
        int status = 0;
        ::waitpid(pid, &status, 0);
        if (stalled_seq != nullptr) {
          stalled_seq->assign(buffer, static_cast<std::size_t>(n));
          while (!stalled_seq->empty() && stalled_seq->back() == '\n')
            stalled_seq->pop_back();
        }
        return -1;
      }
      if (n == 0 && (p.revents & POLLHUP) != 0) notify_fd = -1;  // exited: wait for its status
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
  }
}

// Writes the delivery log around a handler: "D seq" before it runs, then "P seq" / "X seq", or
// "B seq" when another delivery holds the event's claim (rethrown: the transport redelivers it).
class LoggedHandler final : public EventHandler {
 public:
  LoggedHandler(EventHandler& inner, AppendLog& log, std::set<std::uint64_t>& settled)
      : inner_(inner), log_(log), settled_(settled) {}
  const std::string& consumer() const noexcept override { return inner_.consumer(); }
  HandleResult operator()(const Event& event, BusProxy& bus) override {
    const auto seq = event.headers.find("seq");
    if (seq == event.headers.end()) throw DecodeError("demo event without a seq header");
    log_.line("D " + seq->second);
    HandleResult result{};
    try {
      result = inner_(event, bus);
    } catch (const AlreadyInProgress&) {
      log_.line("B " + seq->second);
      throw;
    }
    log_.line((result == HandleResult::processed ? "P " : "X ") + seq->second);
    settled_.insert(std::stoull(seq->second));
    return result;
  }

 private:
  EventHandler& inner_;
  AppendLog& log_;
  std::set<std::uint64_t>& settled_;
};

#ifdef IDEM_HAVE_RABBITMQ
// Sequence numbers a previous consumer process already settled (P or X in the delivery log).
std::set<std::uint64_t> settled_in_log(const fs::path& path) {
  std::set<std::uint64_t> settled;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > 2 && (line[0] == 'P' || line[0] == 'X'))
      settled.insert(std::stoull(line.substr(2)));
  }
  return settled;
}

// One exchange and one queue per run (named after the run's fresh consumer name), so runs
// against one broker never see each other's messages.
rabbitmq::ConsumerOptions broker_consumer_options(const std::string& consumer) {
  rabbitmq::ConsumerOptions options;
  options.consumer_name = consumer;
  options.exchange = "idem.demo." + consumer;
  return options;
}
#endif

}  // namespace

// ---- the consumer process ------------------------------------------------------------------

int run_demo_consumer(const ConsumerOptions& options) {
  const fs::path dir = options.dir;
  const HandlerMode mode = parse_mode(options.mode);
  const char* store = std::getenv(kDemoStoreVariable);
  const std::string url = recorder_url(store != nullptr ? store : "", dir);
  std::shared_ptr<IdempotencyRecorder> recorder = open_recorder(url);
  const std::string consumer = options.consumer;
  const HopFiles files = hop_files(dir, options.hop);
  std::shared_ptr<Outbox> outbox;
  if (options.outbox) {
    std::string absent;
    outbox = outbox_of(recorder, /*look_only=*/false, &absent);
    if (!outbox) throw NotSupported("--hops 2: " + redact_url(url) + ": " + absent);
  }
  const std::string ledger_insert = "INSERT INTO " + ledger_table(*recorder) +
                                    "(consumer, event_id, order_no, amount_cents) "
                                    "VALUES ($1, $2, $3, $4)";
  AppendLog deliveries(files.deliveries);
  AppendLog side_effects(files.side_effects);
  bool stalled = false;

  auto stall_here = [&](const Event& event) {
    if (stalled || options.stall_at < 0) return;
    // The first handler that runs at or after the chosen delivery: a duplicate dropped there
    // never reaches the handler, so "exactly at" could miss.
    const std::string& seq = event.headers.at("seq");
    if (std::stoll(seq) < options.stall_at) return;
    stalled = true;
    write_all(options.notify_fd, seq + "\n");  // "kill me now": the parent sends SIGKILL
    for (;;)
      std::this_thread::sleep_for(std::chrono::seconds(1));
  };

  // The business code: record a payment. In transactional mode the ledger row is written through
  // the marker's transaction; otherwise it is an external side effect (a line in a file).
  auto handler = make_idempotent_handler<nlohmann::json>(
      consumer, recorder,
      [&](const nlohmann::json& payload, BusProxy& bus, const Event& event) {
        if (bus.transaction() == nullptr) {
          stall_here(event);  // killed before the side effect: the claim's lease expires
          side_effects.line(event.id);
        } else if (auto* tx = dynamic_cast<SqlTransaction*>(bus.transaction())) {
          tx->exec(ledger_insert, {consumer, event.id, payload.at("order").get<std::int64_t>(),
                                   payload.at("amount_cents").get<std::int64_t>()});
          if (outbox) {
            // A row of the outbox in this same transaction; its id is left empty, so it is
            // follow_up_id(consumer, event.id, 0) on every run of this handler.
            Event charged;
            charged.type = "order.charged";
            charged.payload = event.payload;
            bus.publish(std::move(charged));
          }
          // Killed here: the ledger row and the marker vanish together (the file's journal, or
          // the server, rolls both back).
          stall_here(event);
        } else {
          throw NotSupported("the demo has no ledger for this recorder's transactions");
        }
      },
      HandlerOptions{.mode = mode, .lease = std::chrono::milliseconds(1500), .outbox = outbox});

  const std::vector<Event> queue = read_queue(files.queue);
  const char* broker = std::getenv(kDemoBrokerVariable);
  if (broker != nullptr && *broker != '\0') {
#ifdef IDEM_HAVE_RABBITMQ
    // RabbitMQ acknowledges each message after its handler returned; a killed consumer's
    // unacknowledged messages are delivered again. Done when every published message was
    // settled (by this process or the one before) and the queue holds nothing more.
    const auto connection = rabbitmq::ConnectionOptions::from_url(broker);
    rabbitmq::Consumer amqp(connection, broker_consumer_options(consumer));
    std::set<std::uint64_t> settled = settled_in_log(files.deliveries);
    LoggedHandler logged(*handler, deliveries, settled);
    amqp.run_until(logged, [&] {
      return settled.size() >= queue.size() &&
             rabbitmq::queue_depth(connection, amqp.queue_name()) == 0;
    });
    return 0;
#else
    throw NotSupported("--broker: this idem was built without RabbitMQ (IDEM_WITH_RABBITMQ)");
#endif
  }
  CollectingBusProxy bus(consumer);
  std::uint64_t offset = read_offset(files.offset);
  while (offset < queue.size()) {
    const Event& event = queue[offset];
    const std::string seq = event.headers.at("seq");
    deliveries.line("D " + seq);
    try {
      const HandleResult result = (*handler)(event, bus);
      deliveries.line((result == HandleResult::processed ? "P " : "X ") + seq);
    } catch (const AlreadyInProgress&) {
      // A dead consumer's claim: not acknowledged; the broker redelivers it after a pause.
      deliveries.line("B " + seq);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    ++offset;
    if (offset % options.ack_every == 0) commit_offset(files.offset, offset);
  }
  commit_offset(files.offset, offset);
  return 0;
}

// ---- the relay process (--hops 2) ----------------------------------------------------------

namespace {

// Rows per relay pass in the demo: small, so the relay killed after a pass re-publishes only a
// few rows.
constexpr std::size_t kRelayBatch = 32;

// The relay's publisher: appends each row to the second hop's queue file (with its delivery
// position as "seq"), after handing the rows to `inner` (RabbitMQ) when there is a broker, and
// confirms what was stored. With a stall point it stops after the pass that reached it, before
// the relay deletes that pass's rows: the process is killed there, so those rows go out again.
// Used from the relay's one thread.
class DemoRelayPublisher final : public OutboxPublisher {
 public:
  DemoRelayPublisher(const HopFiles& files, const fs::path& log,
                     std::shared_ptr<OutboxPublisher> inner, std::int64_t stall_at, int notify_fd)
      : queue_(files.queue),
        log_(log),
        inner_(std::move(inner)),
        stall_at_(stall_at),
        notify_fd_(notify_fd),
        next_seq_(read_queue(files.queue).size()) {}

  std::vector<PublishVerdict> publish(std::span<const OutboxRow> rows) override {
    std::vector<OutboxRow> copies(rows.begin(), rows.end());
    for (std::size_t i = 0; i < copies.size(); ++i)
      copies[i].event.headers["seq"] = std::to_string(next_seq_ + i);
    std::vector<PublishVerdict> verdicts =
        inner_ ? inner_->publish(copies) : std::vector<PublishVerdict>(copies.size(), {true, ""});
    for (std::size_t i = 0; i < copies.size() && i < verdicts.size(); ++i) {
      if (!verdicts[i].confirmed) continue;
      const Event& event = copies[i].event;
      const nlohmann::json line = {{"id", event.id},
                                   {"type", event.type},
                                   {"payload", event.payload},
                                   {"seq", next_seq_},
                                   {"source", copies[i].source_event_id}};
      queue_.line(line.dump());
      log_.line("D " + std::to_string(next_seq_));
      ++next_seq_;
      ++published_;
    }
    if (stall_at_ >= 0 && static_cast<std::int64_t>(published_) >= stall_at_) {
      stall_at_ = -1;
      write_all(notify_fd_, std::to_string(published_) + "\n");  // "kill me now"
      for (;;)
        std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    return verdicts;
  }

 private:
  AppendLog queue_;
  AppendLog log_;
  std::shared_ptr<OutboxPublisher> inner_;
  std::int64_t stall_at_;
  int notify_fd_;
  std::uint64_t next_seq_;
  std::uint64_t published_ = 0;
};

}  // namespace

int run_demo_relay(const RelayProcessOptions& options) {
  const fs::path dir = options.dir;
  const char* store = std::getenv(kDemoStoreVariable);
  const std::string url = recorder_url(store != nullptr ? store : "", dir);
  std::shared_ptr<IdempotencyRecorder> recorder = open_recorder(url);
  std::string absent;
  const std::shared_ptr<Outbox> outbox = outbox_of(recorder, /*look_only=*/false, &absent);
  if (!outbox) throw NotSupported("--hops 2: " + redact_url(url) + ": " + absent);
  std::shared_ptr<OutboxPublisher> inner;
  const char* broker = std::getenv(kDemoBrokerVariable);
  if (broker != nullptr && *broker != '\0') {
#ifdef IDEM_HAVE_RABBITMQ
    rabbitmq::PublisherOptions publisher_options;
    publisher_options.exchange = options.exchange;
    inner =
        std::make_shared<rabbitmq::RabbitMqOutboxPublisher>(std::make_shared<rabbitmq::Publisher>(
            rabbitmq::ConnectionOptions::from_url(broker), publisher_options));
#else
    throw NotSupported("--broker: this idem was built without RabbitMQ (IDEM_WITH_RABBITMQ)");
#endif
  }
  OutboxRelayOptions relay_options;
  relay_options.batch_size = kRelayBatch;
  relay_options.poll_interval = std::chrono::milliseconds(100);
  OutboxRelay relay(
      outbox,
      std::make_shared<DemoRelayPublisher>(hop_files(dir, 2), dir / "relay.log", inner,
                                           options.stall_at, options.notify_fd),
      relay_options);
  // A pass may find the rows still held by the killed relay's transaction (PostgreSQL notices
  // the closed connection a moment later): try again, for at most a minute.
  for (int attempt = 0; attempt < 600; ++attempt) {
    relay.drain();
    if (outbox->stats().depth == 0) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::cerr << "idem demo-relay: the outbox still holds " << outbox->stats().depth
            << " rows after a minute\n";
  return 1;
}

// ---- the demo ------------------------------------------------------------------------------

namespace {

// The second hop's consumer name: "shipping", with the run's suffix when billing has one.
std::string shipping_name(const std::string& billing) {
  return "shipping" + billing.substr(std::string_view(kConsumer).size());
}

// One hop's consumer: started, killed with SIGKILL inside a handler at --kill-at of its stream,
// restarted and run to the end. Returns what its delivery log shows, or nothing (after saying
// why) when a process did not behave.
std::optional<DeliveryStats> run_consumer_hop(const fs::path& dir, const DemoOptions& options,
                                              const std::string& url, const std::string& consumer,
                                              int hop, std::size_t stream_size, const char* who,
                                              const char* bar_label,
                                              std::int64_t latest_stall = -1) {
  const HopFiles files = hop_files(dir, hop);
  DeliveryLogReader log(files.deliveries);
  ProgressBar bar(bar_label, stream_size);

  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
  Fd read_end(pipe_fds[0]);
  auto stall_at = static_cast<std::int64_t>(static_cast<double>(stream_size) * options.kill_at);
  if (latest_stall >= 0) stall_at = std::min(stall_at, latest_stall);
  const pid_t first = spawn_consumer(dir, options, url, consumer, stall_at, pipe_fds[1], hop);
  ::close(pipe_fds[1]);
  std::string stalled_seq;
  const int first_status = watch(first, read_end.fd, log, bar, &stalled_seq);
  if (first_status != -1) {
    bar.finish();
    std::cerr << "idem demo: the first " << who << " exited before it was killed (status "
              << first_status << ")\n";
    return std::nullopt;
  }
  const std::uint64_t committed = read_offset(files.offset);
  bar.finish("killed");
  std::cout.flush();
  std::cout << "  crash:     " << who << " pid " << first
            << " killed with SIGKILL inside the handler "
            << "of delivery #" << stalled_seq
            << (options.broker.empty()
                    ? "; last committed offset " + std::to_string(committed)
                    : std::string("; its unacknowledged messages go back to the queue"))
            << std::endl;

  ProgressBar bar2("  restarted", stream_size);
  const pid_t second = spawn_consumer(dir, options, url, consumer, -1, -1, hop);
  const int second_status = watch(second, -1, log, bar2);
  bar2.finish();
  if (!WIFEXITED(second_status) || WEXITSTATUS(second_status) != 0) {
    std::cerr << "idem demo: the restarted " << who << " failed (status " << second_status << ")\n";
    return std::nullopt;
  }
  return log.poll();
}

// What the second hop did and left.
struct SecondHop {
  std::uint64_t follow_ups = 0;        // outbox rows billing committed
  std::uint64_t relayed = 0;           // rows the relays published (with the ones sent again)
  std::uint64_t distinct_relayed = 0;  // distinct event ids among them
  bool ids_deterministic = true;       // every id is follow_up_id(billing, its order.paid id, 0)
  DeliveryStats stats;                 // shipping's deliveries
  LedgerCount ledger;                  // shipping's ledger rows
  std::int64_t markers = 0;            // relayed events shipping marked processed
  std::uint64_t outbox_left = 0;
  std::uint64_t outbox_parked = 0;
};

// The relay process, killed once after a pass published its rows and before it deleted them,
// then restarted until the outbox is empty; then shipping, killed once mid-handler and restarted.
std::optional<SecondHop> run_second_hop(const fs::path& dir, const DemoOptions& options,
                                        const std::string& url, IdempotencyRecorder& recorder,
                                        Outbox& outbox, const std::string& ledger,
                                        const std::string& billing,
                                        const std::set<std::string>& paid) {
  SecondHop hop;
  const std::string shipping = shipping_name(billing);
  hop.follow_ups = outbox.stats().depth;
  std::string exchange;
#ifdef IDEM_HAVE_RABBITMQ
  if (!options.broker.empty()) exchange = broker_consumer_options(shipping).exchange;
#endif
  std::cout << "  outbox:    " << hop.follow_ups
            << " order.charged follow-ups committed with billing's markers and ledger rows\n";
  std::cout.flush();

  DeliveryLogReader relay_log(dir / "relay.log");
  {
    ProgressBar bar("  relaying", hop.follow_ups);
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
    Fd read_end(pipe_fds[0]);
    const auto stall_at = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(static_cast<double>(hop.follow_ups) * options.kill_at));
    const pid_t first = spawn_relay(dir, options, url, exchange, stall_at, pipe_fds[1]);
    ::close(pipe_fds[1]);
    std::string published_before;
    const int first_status =
        watch(first, read_end.fd, relay_log, bar, &published_before, relay_note);
    if (first_status != -1) {
      bar.finish();
      std::cerr << "idem demo: the first relay exited before it was killed (status " << first_status
                << ")\n";
      return std::nullopt;
    }
    bar.finish("killed");
    std::cout.flush();
    std::cout << "  crash:     relay pid " << first << " killed with SIGKILL after "
              << published_before << " rows were published"
              << (options.broker.empty() ? " to " + hop_files(dir, 2).queue.filename().string()
                                         : std::string(" and confirmed by the broker"))
              << ", before it deleted its last batch (" << kRelayBatch << " rows a pass)"
              << std::endl;
  }
  {
    ProgressBar bar("  restarted", hop.follow_ups);
    const pid_t second = spawn_relay(dir, options, url, exchange, -1, -1);
    const int status = watch(second, -1, relay_log, bar, nullptr, relay_note);
    bar.finish();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::cerr << "idem demo: the restarted relay failed (status " << status << ")\n";
      return std::nullopt;
    }
  }
  const std::vector<Event> charged = read_queue(hop_files(dir, 2).queue);
  hop.relayed = charged.size();
  std::set<std::string> ids;
  std::int64_t last_first_seen = 0;  // the last delivery that is an event's first
  for (const Event& event : charged) {
    if (ids.insert(event.id).second) last_first_seen = std::stoll(event.headers.at("seq"));
    const auto source = event.headers.find("source");
    if (source == event.headers.end() || paid.count(source->second) == 0 ||
        event.id != follow_up_id(billing, source->second, 0)) {
      hop.ids_deterministic = false;
    }
  }
  hop.distinct_relayed = ids.size();
  std::cout << "  relay:     " << hop.relayed << " rows published (" << hop.distinct_relayed
            << " distinct ids)";
#ifdef IDEM_HAVE_RABBITMQ
  if (!options.broker.empty())
    std::cout << " to exchange " << exchange << ", queue idem." << shipping;
#endif
  std::cout << "\n  consumer:  " << shipping << " (order.charged, its own markers and ledger)\n";
  std::cout.flush();

  const std::optional<DeliveryStats> shipped =
      run_consumer_hop(dir, options, url, shipping, 2, charged.size(), "shipping", "  shipping",
                       // The stream ends with the batch relayed again, all duplicates, which never
                       // reach the handler: stall in a first delivery at the latest.
                       last_first_seen);
  if (!shipped) return std::nullopt;
  hop.stats = *shipped;
  hop.ledger = count_ledger(recorder, ledger, shipping);
  for (const std::string& id : ids) {
    if (recorder.is_processed(shipping, id)) ++hop.markers;
  }
  const OutboxStats left = outbox.stats();
  hop.outbox_left = left.depth;
  hop.outbox_parked = left.parked;
  return hop;
}

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
  const HandlerMode mode = parse_mode(options.mode);
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

// Opens the --store recorder and checks it can run the demo, before anything is written: a bad
// URL, an unreachable server or a mode the backend cannot do stops the demo here.
std::shared_ptr<IdempotencyRecorder> open_store_recorder(const DemoOptions& options,
                                                         HandlerMode mode) {
  auto recorder = open_recorder(options.store);
  const std::string shown = redact_url(options.store);
  bool in_memory = dynamic_cast<InMemoryIdempotencyRecorder*>(recorder.get()) != nullptr;
#ifdef IDEM_HAVE_SQLITE
  const auto* sqlite_recorder = dynamic_cast<sqlite::SqliteIdempotencyRecorder*>(recorder.get());
  in_memory = in_memory || (sqlite_recorder != nullptr && sqlite_recorder->path() == ":memory:");
#endif
  if (in_memory) {
    throw NotSupported("--store " + shown +
                       ": an in-memory recorder lives and dies with one process, but the demo "
                       "kills its consumer process and starts a new one; use a SQLite file, "
                       "redis:// or postgresql://");
  }
  if (options.hops == 2 && !recorder->supports_transactions()) {
    throw NotSupported("--hops 2: --store " + shown +
                       " has no outbox: billing's follow-ups are outbox rows written in its "
                       "marker's transaction, which needs sqlite: or postgresql://");
  }
  if (mode == HandlerMode::transactional && !recorder->supports_transactions()) {
    throw NotSupported("--store " + shown +
                       ": --mode transactional needs a recorder whose transaction the handler "
                       "can write through (sqlite: or postgresql://); use --mode exclusive or "
                       "check_then_mark with this one");
  }
  if (mode == HandlerMode::exclusive && !recorder->supports_claims()) {
    throw NotSupported("--store " + shown + ": --mode exclusive needs a recorder with claims");
  }
  return recorder;
}

// The work directory: --dir emptied of an earlier run's files, or a fresh temporary one
// (removed at the end unless --keep).
struct WorkDir {
  fs::path path;
  bool remove = false;
};

WorkDir prepare_work_dir(const DemoOptions& options) {
  WorkDir dir{options.dir, false};
  if (dir.path.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "idem-demo-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir.path = tmpl;
    dir.remove = !options.keep;
    return dir;
  }
  fs::create_directories(dir.path);
  for (const char* f : {"queue.jsonl", "offset", "deliveries.log", "side_effects.log", "idem.db",
                        "idem.db-wal", "idem.db-shm", "idem.db-outbox.lock", "charged.jsonl",
                        "charged.offset", "shipping.log", "shipping_effects.log", "relay.log"}) {
    fs::remove(dir.path / f);
  }
  return dir;
}

// The outbox of a two-hop run, which must hold none but this run's rows (the relay publishes
// every waiting row). Null for one hop.
std::shared_ptr<Outbox> demo_outbox(const DemoOptions& options,
                                    const std::shared_ptr<IdempotencyRecorder>& recorder,
                                    const std::string& url) {
  if (options.hops != 2) return nullptr;
  std::string absent;
  auto outbox = outbox_of(recorder, /*look_only=*/false, &absent);
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

// The demo's use of RabbitMQ (--broker): the queues, the first hop's publish and the clean-up.
// Without --broker (or without RabbitMQ in this build) every step does nothing.
class DemoBroker {
 public:
  // Parses --broker (ConfigError when bad); NotSupported when this build has no RabbitMQ.
  explicit DemoBroker(const DemoOptions& options) : options_(options) {
#ifdef IDEM_HAVE_RABBITMQ
    if (!options.broker.empty()) broker_ = rabbitmq::ConnectionOptions::from_url(options.broker);
#else
    if (!options.broker.empty()) {
      throw NotSupported(
          "--broker: this idem was built without RabbitMQ (IDEM_WITH_RABBITMQ=ON and "
          "librabbitmq-dev build it)");
    }
#endif
  }

  bool used() const noexcept {
    return !options_.broker.empty();
  }

  // Declares the consumers' queues before anything is published, so they receive every message
  // (and an unreachable broker stops the demo before it starts).
  void declare([[maybe_unused]] const std::string& consumer) {
#ifdef IDEM_HAVE_RABBITMQ
    if (!broker_) return;
    rabbitmq::Consumer(*broker_, broker_consumer_options(consumer)).connect();
    if (options_.hops == 2) {
      rabbitmq::Consumer(*broker_, broker_consumer_options(shipping_name(consumer))).connect();
    }
#endif
  }

  // Publishes the first hop's queue file to the consumer's exchange: one batch, sent, then every
  // confirm awaited (about one broker fsync, not one per event).
  void publish([[maybe_unused]] const fs::path& queue,
               [[maybe_unused]] const std::string& consumer) {
#ifdef IDEM_HAVE_RABBITMQ
    if (!broker_) return;
    rabbitmq::PublisherOptions publisher_options;
    publisher_options.exchange = broker_consumer_options(consumer).exchange;
    rabbitmq::Publisher publisher(*broker_, publisher_options);
    publisher.publish_batch(read_queue(queue));
    std::cout << "  broker:    " << rabbitmq::redact_amqp_url(options_.broker) << ", exchange "
              << publisher_options.exchange << ", queue idem." << consumer
              << " (acked after each handler)\n";
#endif
  }

  // Deletes the run's queues and exchanges.
  void clean_up([[maybe_unused]] const std::string& consumer) {
#ifdef IDEM_HAVE_RABBITMQ
    if (!broker_) return;
    std::vector<std::string> consumers = {consumer};
    if (options_.hops == 2) consumers.push_back(shipping_name(consumer));
    for (const std::string& name : consumers) {
      const auto topology = broker_consumer_options(name);
      rabbitmq::delete_queue(*broker_, "idem." + name);
      rabbitmq::delete_queue(*broker_, "idem." + name + ".dlq");
      rabbitmq::delete_exchange(*broker_, topology.exchange);
    }
#endif
  }

 private:
  const DemoOptions& options_;
#ifdef IDEM_HAVE_RABBITMQ
  std::optional<rabbitmq::ConnectionOptions> broker_;
#endif
};

// What the first hop came to, read back from the recorder and the side-effect record.
struct FirstHop {
  DeliveryStats stats;
  std::int64_t side_effects = 0;
  std::int64_t distinct_side_effects = 0;
  std::int64_t markers = 0;
  std::set<std::string> published;  // the distinct events published
};

FirstHop tally_first_hop(const DeliveryStats& stats, const fs::path& dir,
                         IdempotencyRecorder& recorder, HandlerMode mode, const std::string& ledger,
                         const std::string& consumer) {
  FirstHop hop;
  hop.stats = stats;
  const HopFiles files = hop_files(dir, 1);
  for (const Event& event : read_queue(files.queue))
    hop.published.insert(event.id);
  // Markers: every published event must be processed in the recorder (asked through the same
  // interface on every backend).
  for (const std::string& id : hop.published) {
    if (recorder.is_processed(consumer, id)) ++hop.markers;
  }
  if (mode == HandlerMode::transactional) {
    const LedgerCount count = count_ledger(recorder, ledger, consumer);
    hop.side_effects = count.rows;
    hop.distinct_side_effects = count.distinct_events;
    return hop;
  }
  std::ifstream in(files.side_effects);
  std::set<std::string> ids;
  std::string line;
  while (std::getline(in, line)) {
    ++hop.side_effects;
    ids.insert(line);
  }
  hop.distinct_side_effects = static_cast<std::int64_t>(ids.size());
  return hop;
}

// Prints the result table and the verdicts; true when every check passed.
bool report_results(const DemoOptions& options, std::size_t stream_size, const FirstHop& first,
                    const std::optional<SecondHop>& second) {
  const DeliveryStats& stats = first.stats;
  std::cout << "\nresults\n"
            << "  events published           " << stream_size << "\n"
            << "  distinct events            " << options.events << "\n"
            << "  deliveries                 " << stats.deliveries << "\n"
            << "  redeliveries after crash   " << stats.redeliveries << "\n"
            << "  duplicates dropped         " << stats.duplicates_dropped << "\n"
            << "  in-progress retries        " << stats.in_progress_retries << "\n"
            << "  handlers completed         " << stats.processed << "\n"
            << "  side effects               " << first.side_effects << "\n"
            << "  events marked processed    " << first.markers << "\n";
  if (second) {
    const SecondHop& h = *second;
    std::cout << "  follow-ups in the outbox   " << h.follow_ups << "\n"
              << "  relayed (published)        " << h.relayed << "\n"
              << "  relayed again after crash  " << (h.relayed - h.distinct_relayed) << "\n"
              << "  shipping deliveries        " << h.stats.deliveries << "\n"
              << "  shipping redeliveries      " << h.stats.redeliveries << "\n"
              << "  duplicates dropped (ship)  " << h.stats.duplicates_dropped << "\n"
              << "  shipping side effects      " << h.ledger.rows << "\n"
              << "  orders shipped             " << h.ledger.distinct_orders << "\n"
              << "  charges marked shipped     " << h.markers << "\n"
              << "  outbox left                " << h.outbox_left << " waiting, " << h.outbox_parked
              << " parked\n";
  }

  const auto n = static_cast<std::int64_t>(options.events);
  const bool once = first.side_effects == n && first.distinct_side_effects == first.side_effects &&
                    first.markers == n;
  if (once) {
    std::cout << "\nOK: side effects == distinct events == " << options.events
              << " (each exactly once, despite " << stats.redeliveries << " redeliveries, "
              << (stream_size - options.events) << " published duplicates and a SIGKILL)\n";
  } else {
    std::cout << "\nFAILED: " << first.side_effects << " side effects ("
              << first.distinct_side_effects << " distinct) and " << first.markers
              << " events marked processed for " << options.events << " distinct events\n";
  }
  if (!second) return once;
  const SecondHop& h = *second;
  const bool shipped_once =
      h.follow_ups == options.events && h.distinct_relayed == options.events &&
      h.ids_deterministic && h.ledger.rows == n && h.ledger.distinct_events == n &&
      h.ledger.distinct_orders == n && h.markers == n && h.outbox_left == 0 && h.outbox_parked == 0;
  if (shipped_once) {
    std::cout << "OK: orders shipped == follow-ups == " << options.events
              << " (each exactly once, despite " << (h.relayed - h.distinct_relayed)
              << " rows relayed again, " << h.stats.redeliveries
              << " redeliveries and a SIGKILL of the relay and of shipping); outbox empty\n";
  } else {
    std::cout << "FAILED: " << h.follow_ups << " follow-ups in the outbox, " << h.distinct_relayed
              << " distinct relayed"
              << (h.ids_deterministic ? "" : " (some not follow_up_id(billing, order, 0))") << ", "
              << h.ledger.rows << " shipping side effects (" << h.ledger.distinct_orders
              << " distinct orders), " << h.markers << " charges marked shipped, " << h.outbox_left
              << " rows left in the outbox and " << h.outbox_parked << " parked, for "
              << options.events << " distinct events\n";
  }
  return once && shipped_once;
}

}  // namespace

int run_demo(const DemoOptions& options) {
  const HandlerMode mode = check_demo_options(options);
  // A --store recorder is opened and checked before anything is written.
  std::shared_ptr<IdempotencyRecorder> recorder;
  std::string consumer = kConsumer;
  if (!options.store.empty()) recorder = open_store_recorder(options, mode);
  DemoBroker broker(options);
  // A fresh name per run: runs against one server or broker never see each other's markers.
  if (recorder || broker.used()) consumer += "-" + new_event_id().substr(0, 8);

  const WorkDir work = prepare_work_dir(options);
  const fs::path& dir = work.path;
  const std::string url = recorder_url(options.store, dir);
  if (!recorder) recorder = open_recorder(url);
  std::shared_ptr<Outbox> outbox = demo_outbox(options, recorder, url);

  std::cout << "idem demo: at-least-once delivery, a consumer killed mid-handler, side effects "
               "once\n"
            << "  work dir:  " << dir.string() << "\n"
            << "  recorder:  " << redact_url(url) << " (mode " << options.mode << ")\n"
            << "  consumer:  " << consumer
            << (options.store.empty() ? "\n" : " (a fresh name for this run)\n");
  if (options.hops == 2) {
    std::cout << "  hops:      2: " << consumer << " -> outbox -> relay process -> "
              << shipping_name(consumer) << "\n";
  }
  broker.declare(consumer);
  const std::size_t stream_size = publish(dir, options);
  broker.publish(hop_files(dir, 1).queue, consumer);
  std::cout << "  producer:  published " << stream_size << " events (" << options.events
            << " distinct + " << (stream_size - options.events) << " duplicates)\n";

  // Transactional mode writes its side effect, a ledger row, through the marker's transaction,
  // so the ledger lives in the recorder's database.
  const std::string ledger = ledger_table(*recorder);
  if (mode == HandlerMode::transactional) {
    if (ledger.empty()) {
      throw NotSupported("--mode transactional: the demo has no ledger for " + redact_url(url));
    }
    create_ledger(*recorder, ledger, consumer);
  }
  std::cout.flush();  // the progress bar writes to stderr; keep the two in order

  const std::optional<DeliveryStats> billed =
      run_consumer_hop(dir, options, url, consumer, 1, stream_size, "consumer", "  consuming");
  if (!billed) return 1;
  const FirstHop first = tally_first_hop(*billed, dir, *recorder, mode, ledger, consumer);

  // ---- the second hop: the outbox, the relay, shipping ----
  std::optional<SecondHop> second;
  if (options.hops == 2) {
    second =
        run_second_hop(dir, options, url, *recorder, *outbox, ledger, consumer, first.published);
    if (!second) return 1;
  }

  const bool ok = report_results(options, stream_size, first, second);
  broker.clean_up(consumer);
  outbox.reset();
  recorder.reset();  // close the database before its directory goes
  if (work.remove) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  } else {
    std::cout << "(work dir kept: " << dir.string() << ")\n";
  }
  return ok ? 0 : 1;
}

}  // namespace idem::cli
