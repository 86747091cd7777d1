// A slot of the Redis Cluster that scripts/servers.sh starts (IDEM_TEST_REDIS_CLUSTER_URL) moves
// from one primary to another while idem uses records in it, the way `redis-cli --cluster
// reshard` moves it: CLUSTER SETSLOT IMPORTING on the target and MIGRATING on the source, MIGRATE
// of the slot's keys in batches, CLUSTER SETSLOT NODE on every primary. Checked:
//  * while the slot migrates, a key still on the source is served there and a key already moved
//    (or a new one) is reached through ASK, one command at a time and inside pipelines;
//  * a two-key script (the recorder's claim and complete) whose keys are not all on one node, or
//    not all on the target yet (a new claim: neither key exists), is refused with TRYAGAIN: idem
//    waits for the move to finish within command_timeout, or fails with a retryable RedisError
//    that is not in doubt (and changed nothing);
//  * after the move, calls follow MOVED to the new primary and everything written before and
//    during the move is there (marks stay processed, completed records replay);
//  * under threads marking, claiming and completing while the keys move in small batches: every
//    acknowledged mark and completion is there afterwards, every call ends, and no call fails
//    other than retryably and not in doubt.
// Each test moves a slot of its own choosing (one that holds no keys, when it can find one) and
// moves it back when it ends, also when it fails (SlotMove), leaving every slot served and every
// node agreeing: other tests share this cluster. Each test runs under a key prefix of its own.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <typeindex>
#include <utility>
#include <vector>

#include <unistd.h>

#include "../server_env.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "redis_cluster_env.hpp"
#include "redis_names.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_CLUSTER_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::redis_names;

constexpr int kSlots = 16384;
// The consumer of every mark and claim; a record's hash tag is "<consumer>:<event id>".
constexpr const char* kConsumer = "billing";

// ---- slots --------------------------------------------------------------------------------

// CRC16 (XMODEM), as the cluster specification hashes keys, table-driven: the tests search
// thousands of candidate ids for a few in one slot.
constexpr std::array<std::uint16_t, 256> crc16_table() {
  std::array<std::uint16_t, 256> table{};
  for (int byte = 0; byte < 256; ++byte) {
    std::uint16_t crc = static_cast<std::uint16_t>(byte << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<std::uint16_t>(crc << 1);
    }
    table[static_cast<std::size_t>(byte)] = crc;
  }
  return table;
}

// The slot of a hash tag (the text between a key's braces).
int slot_of_tag(std::string_view tag) {
  static constexpr std::array<std::uint16_t, 256> kTable = crc16_table();
  std::uint16_t crc = 0;
  for (const char c : tag) {
    crc = static_cast<std::uint16_t>((crc << 8) ^
                                     kTable[((crc >> 8) ^ static_cast<unsigned char>(c)) & 0xff]);
  }
  return crc % kSlots;
}

std::string random_hex() {
  std::random_device device;
  std::ostringstream out;
  out << std::hex << device() << device();
  return out.str();
}

// Event ids whose records (the marker and claim of kConsumer's event, and the store record of
// store_key(id)) all live in `slot`.
std::vector<std::string> ids_in_slot(int slot, std::size_t count) {
  const std::string base = random_hex();
  std::vector<std::string> ids;
  // One id in 16384 lands in a given slot: 64 times that per id is more than enough.
  for (std::size_t n = 0; ids.size() < count && n < count * kSlots * 64; ++n) {
    std::string id = base + "-" + std::to_string(n);
    if (slot_of_tag(std::string(kConsumer) + ":" + id) == slot) ids.push_back(std::move(id));
  }
  return ids;
}

// The store key of an id: its record's hash tag is the marker's, so it shares the slot.
std::string store_key(const std::string& id) {
  return std::string(kConsumer) + ":" + id;
}

std::string unique_prefix(const char* name) {
  return "idemtest:" + std::to_string(::getpid()) + ":" + random_hex() + ":" + name + ":";
}

RedisOptions cluster_options(const std::string& prefix) {
  auto options = RedisOptions::from_url(idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL"));
  options.key_prefix = prefix;
  return options;
}

// ---- the cluster, node by node --------------------------------------------------------------

// Commands to single nodes (by port), outside idem's routing: CLUSTER SETSLOT, MIGRATE, reads of
// where keys are. Thread-safe.
class Nodes {
 public:
  Nodes() {
    std::istringstream ports(idem::test::env("IDEM_TEST_REDIS_CLUSTER_PORTS"));
    int port = 0;
    while (ports >> port)
      ports_.push_back(port);
  }

  const std::vector<int>& ports() const { return ports_; }

  // The reply, error replies included.
  RedisReply reply(int port, const std::vector<std::string>& args) {
    const std::vector<std::string_view> views(args.begin(), args.end());
    auto connection = pool(port).lease();
    return connection->command(std::span<const std::string_view>(views),
                               idem::redis::CommandKind::write, "test admin");
  }

  // The reply; an error reply throws.
  RedisReply command(int port, const std::vector<std::string>& args) {
    RedisReply out = reply(port, args);
    if (out.is_error()) {
      std::string line;
      for (const auto& arg : args)
        line += (line.empty() ? "" : " ") + arg;
      throw std::runtime_error("port " + std::to_string(port) + ": " + line + ": " + out.str);
    }
    return out;
  }

 private:
  ConnectionPool& pool(int port) {
    std::lock_guard lock(mutex_);
    auto& pool = pools_[port];
    if (!pool) {
      auto options = RedisOptions::from_url("redis://127.0.0.1:" + std::to_string(port) + "/0");
      options.command_timeout = 10s;  // MIGRATE waits up to 5 s for the target
      pool = std::make_unique<ConnectionPool>(options);
    }
    return *pool;
  }

  std::vector<int> ports_;
  std::mutex mutex_;
  std::map<int, std::unique_ptr<ConnectionPool>> pools_;
};

// One line of CLUSTER NODES.
struct Node {
  std::string id;
  std::string host;
  int port = 0;
  bool primary = false;
  bool myself = false;
  std::vector<std::pair<int, int>> slots;  // ranges served
  std::vector<std::string> moving;         // "[slot->-id]" (migrating), "[slot-<-id]" (importing)

  bool serves(int slot) const {
    for (const auto& [first, last] : slots) {
      if (slot >= first && slot <= last) return true;
    }
    return false;
  }
};

// CLUSTER NODES as one node sees the cluster.
std::vector<Node> nodes_seen_by(Nodes& nodes, int port) {
  const RedisReply reply = nodes.command(port, {"CLUSTER", "NODES"});
  std::vector<Node> out;
  std::istringstream lines(reply.str);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    Node node;
    std::string address, flags, skip;
    if (!(fields >> node.id >> address >> flags)) continue;
    for (int i = 0; i < 5; ++i)
      fields >> skip;  // primary id, ping sent, pong received, config epoch, link state
    // address: host:port@cport[,hostname]
    const std::string host_port = address.substr(0, address.find('@'));
    const std::size_t colon = host_port.rfind(':');
    node.host = host_port.substr(0, colon);
    node.port = std::stoi(host_port.substr(colon + 1));
    node.primary = flags.find("master") != std::string::npos;
    node.myself = flags.find("myself") != std::string::npos;
    std::string range;
    while (fields >> range) {
      if (range.front() == '[') {
        node.moving.push_back(range);
        continue;
      }
      const std::size_t dash = range.find('-');
      const int first = std::stoi(range.substr(0, dash));
      const int last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
      node.slots.emplace_back(first, last);
    }
    out.push_back(std::move(node));
  }
  return out;
}

// The primary serving `slot` as the first node that answers sees it; throws when none does.
Node owner_of(Nodes& nodes, int slot, int view_port) {
  for (const Node& node : nodes_seen_by(nodes, view_port)) {
    if (node.primary && node.serves(slot)) return node;
  }
  throw std::runtime_error("port " + std::to_string(view_port) + " sees no primary serving slot " +
                           std::to_string(slot));
}

// A slot no key lives in (so the test moves nothing of other tests'), when one of a few random
// picks is; else the last pick.
int quiet_slot(Nodes& nodes) {
  std::random_device device;
  int slot = 0;
  for (int attempt = 0; attempt < 32; ++attempt) {
    slot = static_cast<int>(device() % kSlots);
    const Node owner = owner_of(nodes, slot, nodes.ports().at(0));
    const RedisReply count =
        nodes.command(owner.port, {"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)});
    if (count.integer == 0) break;
  }
  return slot;
}

// Moves one slot from the primary serving it to another, step by step as the test says, and
// back when destroyed (also when the test failed half-way): the slot served by its first owner
// again, no node migrating or importing it, every node agreeing and cluster_state:ok.
class SlotMove {
 public:
  SlotMove(Nodes& nodes, int slot) : nodes_(nodes), slot_(slot), name_(std::to_string(slot)) {
    source_ = owner_of(nodes_, slot_, nodes_.ports().at(0));
    for (const Node& node : nodes_seen_by(nodes_, source_.port)) {
      if (node.primary && node.id != source_.id && !node.slots.empty()) {
        target_ = node;
        break;
      }
    }
    if (target_.id.empty()) throw std::runtime_error("no second primary to move the slot to");
  }
  SlotMove(const SlotMove&) = delete;
  SlotMove& operator=(const SlotMove&) = delete;

  ~SlotMove() {
    if (!touched_) return;
    try {
      // Whatever step was reached: finish the move to the target, then move the slot back.
      if (owner_of(nodes_, slot_, source_.port).id == source_.id) move(source_, target_);
      move(target_, source_);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "moving slot " << slot_ << " back to " << source_.port << ": " << e.what();
    }
  }

  const Node& source() const { return source_; }
  const Node& target() const { return target_; }

  // CLUSTER SETSLOT IMPORTING on the target, MIGRATING on the source.
  void begin() {
    touched_ = true;
    start(source_, target_, /*again=*/false);
  }

  // MIGRATEs `keys` (those that exist) from the source to the target.
  void migrate(const std::vector<std::string>& keys) { migrate(source_, target_, keys); }

  // MIGRATEs up to `n` keys of the slot that are still on the source; how many there were.
  std::size_t migrate_some(std::size_t n) {
    const RedisReply keys =
        nodes_.command(source_.port, {"CLUSTER", "GETKEYSINSLOT", name_, std::to_string(n)});
    std::vector<std::string> names;
    for (const RedisReply& key : keys.elements)
      names.push_back(key.str);
    migrate(names);
    return names.size();
  }

  // Moves the keys left on the source, then CLUSTER SETSLOT NODE <target> on every primary.
  void finish() { end(source_, target_); }

  // Keys of the slot a node holds.
  long long keys_on(const Node& node) {
    return nodes_.command(node.port, {"CLUSTER", "COUNTKEYSINSLOT", name_}).integer;
  }

 private:
  void start(const Node& from, const Node& to, bool again) {
    // When moving back from a half-done move, a node may already own the slot or be set: then
    // the refusal is expected, and the steps after decide.
    const RedisReply importing =
        nodes_.reply(to.port, {"CLUSTER", "SETSLOT", name_, "IMPORTING", from.id});
    if (importing.is_error() && !again) throw std::runtime_error("IMPORTING: " + importing.str);
    const RedisReply migrating =
        nodes_.reply(from.port, {"CLUSTER", "SETSLOT", name_, "MIGRATING", to.id});
    if (migrating.is_error() && !again) throw std::runtime_error("MIGRATING: " + migrating.str);
  }

  void migrate(const Node& from, const Node& to, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    std::vector<std::string> args = {"MIGRATE", to.host, std::to_string(to.port), "", "0",
                                     "5000",    "KEYS"};
    args.insert(args.end(), keys.begin(), keys.end());
    const RedisReply reply = nodes_.command(from.port, args);
    if (reply.str != "OK" && reply.str != "NOKEY") {
      throw std::runtime_error("MIGRATE answered " + reply.str);
    }
  }

  void end(const Node& from, const Node& to) {
    for (int batch = 0;; ++batch) {
      const RedisReply keys = nodes_.command(from.port, {"CLUSTER", "GETKEYSINSLOT", name_, "100"});
      if (keys.elements.empty()) break;
      if (batch == 1000) throw std::runtime_error("the slot's keys keep coming back");
      std::vector<std::string> names;
      for (const RedisReply& key : keys.elements)
        names.push_back(key.str);
      migrate(from, to, names);
    }
    // The target first (it bumps its config epoch, so the change wins), then the source (which
    // then answers MOVED), then every other primary.
    nodes_.command(to.port, {"CLUSTER", "SETSLOT", name_, "NODE", to.id});
    nodes_.command(from.port, {"CLUSTER", "SETSLOT", name_, "NODE", to.id});
    // (Optional for them: they also learn it by gossip. A node the target still sees as a
    // primary may have become a replica since, after a failover test; it refuses, harmlessly.)
    for (const Node& node : nodes_seen_by(nodes_, to.port)) {
      if (node.primary && node.id != to.id && node.id != from.id) {
        (void)nodes_.reply(node.port, {"CLUSTER", "SETSLOT", name_, "NODE", to.id});
      }
    }
    settle(to);
  }

  void move(const Node& from, const Node& to) {
    start(from, to, /*again=*/true);
    end(from, to);
  }

  // Waits (bounded) until every node sees `owner` serving the slot, nobody migrating or
  // importing it, and cluster_state:ok.
  void settle(const Node& owner) {
    std::string last;
    for (int round = 0; round < 400; ++round) {
      last.clear();
      for (int port : nodes_.ports()) {
        const RedisReply info = nodes_.command(port, {"CLUSTER", "INFO"});
        if (info.str.find("cluster_state:ok") == std::string::npos) {
          last = "port " + std::to_string(port) + " is not cluster_state:ok";
          break;
        }
        for (const Node& node : nodes_seen_by(nodes_, port)) {
          const bool moving = node.myself && !node.moving.empty();
          if ((node.serves(slot_) && node.id != owner.id) ||
              (node.id == owner.id && !node.serves(slot_)) || moving) {
            last = "port " + std::to_string(port) + " sees " + std::to_string(node.port) +
                   (moving ? " moving slots" : " serving slot " + name_ + " or not");
            break;
          }
        }
        if (!last.empty()) break;
      }
      if (last.empty()) return;
      std::this_thread::sleep_for(25ms);
    }
    throw std::runtime_error("the cluster did not settle on " + std::to_string(owner.port) +
                             " serving slot " + name_ + ": " + last);
  }

  Nodes& nodes_;
  const int slot_;
  const std::string name_;
  Node source_;
  Node target_;
  bool touched_ = false;
};

// ---- checks -------------------------------------------------------------------------------

idem::StoredValue bytes_value(const std::string& text) {
  idem::StoredValue value;
  value.object = std::make_shared<const std::string>(text);
  value.type = std::type_index(typeid(std::string));
  value.bytes = text;
  return value;
}

idem::ExecutionReport sample_report() {
  idem::ExecutionReport report;
  report.operation = "charge";
  report.started_at = idem::WallTime(std::chrono::seconds(1893456000));
  return report;
}

// `call` throws a RedisError for a refused multi-key script: TRYAGAIN, retryable, not in doubt.
template <typename Call>
void expect_try_again(Call&& call, const char* what) {
  try {
    call();
    ADD_FAILURE() << what << ": succeeded while its keys were split between two nodes";
  } catch (const RedisError& e) {
    EXPECT_EQ(e.failure(), idem::redis::RedisFailure::reply) << what << ": " << e.what();
    EXPECT_TRUE(e.retryable()) << what << ": " << e.what();
    EXPECT_FALSE(e.in_doubt()) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("TRYAGAIN"), std::string::npos)
        << what << ": " << e.what();
  }
}

#define IDEM_REQUIRE_CLUSTER_PORTS(nodes)                                                     \
  do {                                                                                        \
    if ((nodes).ports().size() < 3) {                                                         \
      IDEM_SERVER_MISSING("no Redis Cluster nodes: IDEM_TEST_REDIS_CLUSTER_PORTS is unset");  \
    }                                                                                         \
    /* A failover test before this one may have left the cluster settling. */                 \
    ASSERT_TRUE(::idem::test::cluster::poll_until(::idem::test::cluster::cluster_as_started)) \
        << "the cluster is not whole before the test";                                        \
  } while (false)

// ---- tests ----------------------------------------------------------------------------------

TEST(RedisClusterMigration, BothSidesOfAMigratingSlotAreServedAndTheMovedSlotIsFollowed) {
  Nodes nodes;
  IDEM_REQUIRE_CLUSTER_PORTS(nodes);
  const int slot = quiet_slot(nodes);
  const auto ids = ids_in_slot(slot, 12);
  ASSERT_EQ(ids.size(), 12u);
  const auto options = cluster_options(unique_prefix("move"));
  auto pool = std::make_shared<ConnectionPool>(options);
  RedisIdempotencyRecorder recorder(pool);
  RedisIdempotencyStore store(pool);
  const auto marker = [&](int i) { return recorder.marker_key(kConsumer, ids[i]); };
  const auto record = [&](int i) { return store.record_key(store_key(ids[i])); };
  // The test's slot arithmetic is the server's.
  ASSERT_EQ(nodes.command(nodes.ports()[0], {"CLUSTER", "KEYSLOT", marker(0)}).integer, slot);
  ASSERT_EQ(nodes.command(nodes.ports()[0], {"CLUSTER", "KEYSLOT", record(0)}).integer, slot);
  SlotMove move(nodes, slot);

  // Before the move: four marks, a completed record (4) and one in progress (5).
  for (int i = 0; i < 4; ++i)
    recorder.mark_processed(kConsumer, ids[i]);
  const auto done = store.claim(store_key(ids[4]), std::nullopt, idem::Millis(60'000));
  ASSERT_EQ(done.status, idem::ClaimOutcome::Status::acquired);
  ASSERT_TRUE(store.complete(store_key(ids[4]), done.token, bytes_value("receipt-4"),
                             sample_report(), idem::Millis(3'600'000)));
  const auto held = store.claim(store_key(ids[5]), std::nullopt, idem::Millis(60'000));
  ASSERT_EQ(held.status, idem::ClaimOutcome::Status::acquired);

  move.begin();
  // Migrating, nothing moved yet: what is on the source is served there; what is new goes to
  // the target through ASK.
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(recorder.is_processed(kConsumer, ids[i])) << i;
  recorder.mark_processed(kConsumer, ids[6]);
  EXPECT_TRUE(recorder.is_processed(kConsumer, ids[6]));
  EXPECT_FALSE(recorder.is_processed(kConsumer, ids[7]));
  auto found = store.lookup(store_key(ids[4]));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->state, idem::IdempotencyRecord::State::completed);
  EXPECT_EQ(store.claim(store_key(ids[5]), std::nullopt, idem::Millis(60'000)).status,
            idem::ClaimOutcome::Status::in_progress);
  const auto fresh = store.claim(store_key(ids[8]), std::nullopt, idem::Millis(60'000));
  ASSERT_EQ(fresh.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(store.complete(store_key(ids[8]), fresh.token, bytes_value("receipt-8"),
                             sample_report(), idem::Millis(3'600'000)));
  EXPECT_EQ(move.keys_on(move.target()), 2) << "the new mark and the new record";

  // Half of the slot moved: moved keys are reached through ASK, the rest stays on the source.
  move.migrate({marker(0), marker(1), record(4)});
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(recorder.is_processed(kConsumer, ids[i])) << i;
  // Pipelines: one batch over moved, unmoved and new keys.
  const std::vector<std::string> batch(ids.begin(), ids.begin() + 10);
  EXPECT_EQ(recorder.is_processed_many(kConsumer, batch),
            (std::vector<bool>{true, true, true, true, false, false, true, false, false, false}));
  const std::vector<std::string> marks = {ids[0], ids[2], ids[9]};
  EXPECT_EQ(recorder.mark_processed_batch(kConsumer, marks), 1u) << "only the last one is new";
  const auto replay = store.claim(store_key(ids[4]), std::nullopt, idem::Millis(60'000));
  ASSERT_EQ(replay.status, idem::ClaimOutcome::Status::completed);
  ASSERT_TRUE(replay.record.has_value());
  EXPECT_EQ(replay.record->value.bytes.value_or(""), "receipt-4");
  EXPECT_TRUE(store.complete(store_key(ids[5]), held.token, bytes_value("receipt-5"),
                             sample_report(), idem::Millis(3'600'000)))
      << "the claim still on the source completes there";
  EXPECT_GT(move.keys_on(move.source()), 0);

  move.finish();
  EXPECT_EQ(move.keys_on(move.source()), 0);
  // The slot is the target's: calls follow MOVED, and everything written before and during the
  // move is there.
  EXPECT_EQ(recorder.is_processed_many(kConsumer, batch),
            (std::vector<bool>{true, true, true, true, false, false, true, false, false, true}));
  recorder.mark_processed(kConsumer, ids[10]);
  EXPECT_TRUE(recorder.is_processed(kConsumer, ids[10]));
  EXPECT_FALSE(recorder.is_processed(kConsumer, ids[11]));
  for (const auto& [i, text] : {std::pair{4, "receipt-4"}, {5, "receipt-5"}, {8, "receipt-8"}}) {
    const auto again = store.claim(store_key(ids[i]), std::nullopt, idem::Millis(60'000));
    EXPECT_EQ(again.status, idem::ClaimOutcome::Status::completed) << i;
    if (again.record) {
      EXPECT_EQ(again.record->value.bytes.value_or(""), text) << i;
    }
  }
  {
    auto connection = pool->lease();
    EXPECT_EQ(connection->command({"EXISTS", marker(10)}, idem::redis::CommandKind::read).integer,
              1);
    EXPECT_NE(connection->endpoint().find(":" + std::to_string(move.target().port) + "/"),
              std::string::npos)
        << connection->endpoint();
  }
  EXPECT_EQ(move.keys_on(move.target()), 10) << "markers 0-3, 6, 9, 10 and records 4, 5, 8";
}

TEST(RedisClusterMigration, AScriptWhoseKeysAreSplitWaitsForTheMoveOrFailsRetryably) {
  Nodes nodes;
  IDEM_REQUIRE_CLUSTER_PORTS(nodes);
  const int slot = quiet_slot(nodes);
  const auto ids = ids_in_slot(slot, 5);
  ASSERT_EQ(ids.size(), 5u);
  const std::string prefix = unique_prefix("tryagain");
  RedisIdempotencyRecorder recorder(cluster_options(prefix));  // command_timeout 2 s
  auto quick_options = cluster_options(prefix);
  quick_options.command_timeout = 300ms;
  RedisIdempotencyRecorder quick(quick_options);
  auto patient_options = cluster_options(prefix);
  patient_options.command_timeout = 20s;
  RedisIdempotencyRecorder patient(patient_options);
  SlotMove move(nodes, slot);

  const idem::Millis lease(60'000);
  std::vector<std::uint64_t> tokens;
  for (int i = 0; i < 3; ++i) {
    const auto claim = recorder.claim(kConsumer, ids[i], lease);
    ASSERT_EQ(claim.status, idem::Claim::Status::acquired) << i;
    tokens.push_back(claim.token);
  }

  move.begin();
  // complete() touches the claim (on the source) and the marker (on neither node): the source
  // refuses it until the move ends.
  expect_try_again([&] { (void)quick.complete(kConsumer, ids[0], tokens[0]); }, "complete 0");
  // Claim 1 moved: the source sends the call to the target (ASK), which holds one of its two
  // keys and refuses it; round after round, for the whole command_timeout.
  move.migrate({recorder.claim_key(kConsumer, ids[1])});
  expect_try_again([&] { (void)recorder.complete(kConsumer, ids[1], tokens[1]); }, "complete 1");
  // A new claim: neither key exists anywhere, and the target refuses two missing keys as well.
  expect_try_again([&] { (void)quick.claim(kConsumer, ids[3], lease); }, "claim 3");
  // The refused calls changed nothing.
  EXPECT_FALSE(recorder.is_processed(kConsumer, ids[0]));
  EXPECT_FALSE(recorder.is_processed(kConsumer, ids[1]));

  // A call that meets the split while the move ends waits for it, and then succeeds.
  std::string finisher_failure;
  std::thread finisher([&] {
    std::this_thread::sleep_for(300ms);  // let the call below meet the split first
    try {
      move.finish();
    } catch (const std::exception& e) {
      finisher_failure = e.what();
    }
  });
  bool completed = false;
  try {
    completed = patient.complete(kConsumer, ids[2], tokens[2]);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "complete 2 during the end of the move: " << e.what();
  }
  finisher.join();
  ASSERT_EQ(finisher_failure, "");
  EXPECT_TRUE(completed);

  // After the move: the claims that were refused are still held and complete now.
  EXPECT_TRUE(recorder.complete(kConsumer, ids[0], tokens[0]));
  EXPECT_TRUE(recorder.complete(kConsumer, ids[1], tokens[1]));
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(recorder.is_processed(kConsumer, ids[i])) << i;
  EXPECT_EQ(recorder.claim(kConsumer, ids[3], lease).status, idem::Claim::Status::acquired);
  EXPECT_EQ(move.keys_on(move.source()), 0);
}

TEST(RedisClusterMigration, ConcurrentCallsWhileTheSlotMovesInBatchesLoseNothing) {
  Nodes nodes;
  IDEM_REQUIRE_CLUSTER_PORTS(nodes);
  constexpr int kMarkers = 4;   // threads marking + checking and claiming + completing records
  constexpr int kMarks = 25;    // steps of each
  constexpr int kClaimers = 2;  // threads claiming + completing in the recorder (two-key scripts)
  constexpr int kClaims = 4;    // steps of each
  const int slot = quiet_slot(nodes);
  const auto ids = ids_in_slot(slot, kMarkers * kMarks + kClaimers * kClaims);
  ASSERT_EQ(ids.size(), static_cast<std::size_t>(kMarkers * kMarks + kClaimers * kClaims));
  auto pool = std::make_shared<ConnectionPool>(cluster_options(unique_prefix("concurrent")));
  RedisIdempotencyRecorder recorder(pool);
  RedisIdempotencyStore store(pool);
  SlotMove move(nodes, slot);

  std::mutex mutex;                    // guards the lists below
  std::vector<std::string> marked;     // acknowledged marks
  std::vector<std::string> completed;  // store keys completed (value = "v-" + key)
  std::vector<std::string> claimed;    // recorder claims completed
  std::vector<std::string> failures;   // anything but a retryable, not-in-doubt RedisError
  std::atomic<int> started{0}, ended{0}, retryable{0}, during{0}, markers_done{0};
  std::atomic<bool> moving{false};  // between begin() and finish()
  // One call: true when it returned; a RedisError must be retryable and not in doubt.
  const auto call = [&](const std::string& what, auto&& body) {
    ++started;
    if (moving) ++during;
    bool returned = false;
    try {
      body();
      returned = true;
    } catch (const RedisError& e) {
      if (e.retryable() && !e.in_doubt()) {
        ++retryable;
      } else {
        std::lock_guard lock(mutex);
        failures.push_back(what + ": " + e.what());
      }
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex);
      failures.push_back(what + ": " + e.what());
    }
    ++ended;
    return returned;
  };
  const auto fail = [&](const std::string& what) {
    std::lock_guard lock(mutex);
    failures.push_back(what);
  };

  std::vector<std::thread> workers;
  for (int t = 0; t < kMarkers; ++t) {
    workers.emplace_back([&, t] {
      const auto mine = ids.begin() + t * kMarks;
      std::vector<bool> marked_here(kMarks, false), completed_here(kMarks, false);
      for (int i = 0; i < kMarks; ++i) {
        const std::string& id = mine[i];
        const std::string key = store_key(id);
        marked_here[i] = call("mark " + id, [&] {
          recorder.mark_processed(kConsumer, id);
          std::lock_guard lock(mutex);
          marked.push_back(id);
        });
        call("store " + key, [&] {
          const auto claim = store.claim(key, std::nullopt, idem::Millis(60'000));
          if (claim.status != idem::ClaimOutcome::Status::acquired) {
            fail("store claim " + key + ": " + std::string(idem::to_string(claim.status)));
            return;
          }
          if (!store.complete(key, claim.token, bytes_value("v-" + key), sample_report(),
                              idem::Millis(3'600'000))) {
            fail("store complete " + key + " fenced");
            return;
          }
          completed_here[i] = true;
          std::lock_guard lock(mutex);
          completed.push_back(key);
        });
        // An earlier record of this thread, on whichever node it is now.
        const int earlier = i / 2;
        call("check " + mine[earlier], [&] {
          if (marked_here[earlier] && !recorder.is_processed(kConsumer, mine[earlier])) {
            fail("mark " + mine[earlier] + " not seen");
          }
          if (completed_here[earlier]) {
            const auto found = store.lookup(store_key(mine[earlier]));
            if (!found || found->state != idem::IdempotencyRecord::State::completed) {
              fail("record " + store_key(mine[earlier]) + " not seen completed");
            }
          }
        });
        std::this_thread::sleep_for(5ms);  // spread the calls over the move
      }
      ++markers_done;
    });
  }
  for (int t = 0; t < kClaimers; ++t) {
    workers.emplace_back([&, t] {
      const auto mine = ids.begin() + kMarkers * kMarks + t * kClaims;
      for (int i = 0; i < kClaims; ++i) {
        const std::string& id = mine[i];
        call("claim " + id, [&] {
          const auto claim = recorder.claim(kConsumer, id, idem::Millis(60'000));
          if (claim.status != idem::Claim::Status::acquired) {
            fail("recorder claim " + id + ": " + std::string(idem::to_string(claim.status)));
            return;
          }
          if (!recorder.complete(kConsumer, id, claim.token)) {
            fail("recorder complete " + id + " fenced");
            return;
          }
          std::lock_guard lock(mutex);
          claimed.push_back(id);
        });
        std::this_thread::sleep_for(20ms);
      }
    });
  }
  // Once the workers have written a few records: the slot moves, three keys at a time, while
  // the markers go on; then the rest, and the switch.
  for (int wait = 0; wait < 2000 && started < 4 * kMarkers; ++wait)
    std::this_thread::sleep_for(1ms);
  try {
    move.begin();
    moving = true;
    for (int batch = 0; batch < 100 && markers_done < kMarkers; ++batch) {
      move.migrate_some(3);
      std::this_thread::sleep_for(10ms);
    }
    move.finish();
    moving = false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "moving the slot: " << e.what();
  }
  for (auto& worker : workers)
    worker.join();

  // Every call ended, and none failed but retryably.
  EXPECT_EQ(started.load(), ended.load());
  EXPECT_EQ(started.load(), kMarkers * kMarks * 3 + kClaimers * kClaims);
  for (const auto& failure : failures)
    ADD_FAILURE() << failure;
  // Every acknowledged write is there.
  EXPECT_FALSE(marked.empty());
  EXPECT_EQ(recorder.is_processed_many(kConsumer, marked), std::vector<bool>(marked.size(), true));
  for (const auto& key : completed) {
    const auto found = store.lookup(key);
    ASSERT_TRUE(found.has_value()) << key;
    EXPECT_EQ(found->state, idem::IdempotencyRecord::State::completed) << key;
    EXPECT_EQ(found->value.bytes.value_or(""), "v-" + key);
  }
  EXPECT_EQ(recorder.is_processed_many(kConsumer, claimed),
            std::vector<bool>(claimed.size(), true));
  EXPECT_EQ(move.keys_on(move.source()), 0);
  std::printf(
      "[ migration ] %zu marks, %zu store completions, %zu recorder claims acknowledged; "
      "%d of %d calls started while the slot moved, %d failed retryably\n",
      marked.size(), completed.size(), claimed.size(), during.load(), started.load(),
      retryable.load());
}

}  // namespace
