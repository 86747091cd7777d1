#include "cluster.hpp"

#include <algorithm>
#include <charconv>
#include <thread>
#include <utility>

#include "idem/error.hpp"
#include "idem/redis/redis_error.hpp"
#include "internal.hpp"

namespace idem::redis::detail {

// ---- slots and redirections -------------------------------------------------------------------

namespace {

// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as the cluster specification gives it.
std::uint16_t crc16(std::string_view bytes) noexcept {
  std::uint16_t crc = 0;
  for (const char c : bytes) {
    crc ^= static_cast<std::uint16_t>(static_cast<unsigned char>(c) << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<std::uint16_t>(crc << 1);
    }
  }
  return crc;
}

bool equals_ignoring_case(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return (x >= 'a' && x <= 'z' ? x - 32 : x) == (y >= 'a' && y <= 'z' ? y - 32 : y);
         });
}

std::optional<int> parse_int(std::string_view text) noexcept {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

std::uint16_t key_slot(std::string_view key) noexcept {
  const std::size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const std::size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return static_cast<std::uint16_t>(crc16(key) % kClusterSlots);
}

std::optional<std::string_view> routing_key(std::span<const std::string_view> args) noexcept {
  if (args.empty()) return std::nullopt;
  const std::string_view name = args[0];
  if (equals_ignoring_case(name, "EVALSHA") || equals_ignoring_case(name, "EVAL")) {
    if (args.size() < 4) return std::nullopt;
    const auto keys = parse_int(args[2]);
    if (!keys || *keys < 1) return std::nullopt;
    return args[3];
  }
  for (const std::string_view keyless : {"PING", "SCRIPT", "SCAN", "INFO", "DBSIZE", "CLUSTER",
                                         "AUTH", "SELECT", "ASKING", "WAIT", "ROLE"}) {
    if (equals_ignoring_case(name, keyless)) return std::nullopt;
  }
  if (args.size() < 2) return std::nullopt;
  return args[1];
}

std::optional<Redirection> parse_redirection(std::string_view error) {
  Redirection out;
  if (error.substr(0, 6) == "MOVED ") {
    error.remove_prefix(6);
  } else if (error.substr(0, 4) == "ASK ") {
    out.ask = true;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const std::size_t space = error.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const auto slot = parse_int(error.substr(0, space));
  const std::string_view address = error.substr(space + 1);
  const std::size_t colon = address.rfind(':');
  if (!slot || *slot < 0 || *slot >= static_cast<int>(kClusterSlots) ||
      colon == std::string_view::npos) {
    return std::nullopt;
  }
  const auto port = parse_int(address.substr(colon + 1));
  if (!port || *port < 1 || *port > 65535) return std::nullopt;
  std::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  out.slot = static_cast<std::uint16_t>(*slot);
  out.host = std::string(host);
  out.port = *port;
  return out;
}

std::string node_name(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// ---- CLUSTER SHARDS ---------------------------------------------------------------------------

namespace {

// A RESP2 map: a flat array of name, value, name, value ...
const RedisReply* field(const RedisReply& map, std::string_view name) {
  if (map.type != RedisReply::Type::array) return nullptr;
  for (std::size_t i = 0; i + 1 < map.elements.size(); i += 2) {
    const RedisReply& key = map.elements[i];
    if ((key.type == RedisReply::Type::string || key.type == RedisReply::Type::status) &&
        key.str == name) {
      return &map.elements[i + 1];
    }
  }
  return nullptr;
}

std::string text_of(const RedisReply* value) {
  if (value == nullptr) return {};
  if (value->type == RedisReply::Type::integer) return std::to_string(value->integer);
  return value->type == RedisReply::Type::string || value->type == RedisReply::Type::status
             ? value->str
             : std::string();
}

std::optional<long long> integer_of(const RedisReply* value) {
  if (value == nullptr) return std::nullopt;
  if (value->type == RedisReply::Type::integer) return value->integer;
  if (value->type != RedisReply::Type::string) return std::nullopt;
  long long n = 0;
  const auto [end, ec] =
      std::from_chars(value->str.data(), value->str.data() + value->str.size(), n);
  if (ec != std::errc() || end != value->str.data() + value->str.size()) return std::nullopt;
  return n;
}

[[noreturn]] void bad_shards(const std::string& endpoint, const std::string& why) {
  throw RedisError(RedisFailure::protocol,
                   "idem redis: CLUSTER SHARDS on " + endpoint + ": " + why +
                       " (is this a Redis Cluster node of Redis 7.0 or newer?)",
                   /*retryable=*/false, /*in_doubt=*/false);
}

}  // namespace

std::shared_ptr<ClusterLayout> parse_shards(const RedisReply& reply, bool tls,
                                            const std::string& endpoint) {
  if (reply.is_error()) {
    // "ERR This instance has cluster support disabled": a standalone server under a cluster URL.
    throw RedisError(
        RedisFailure::reply,
        "idem redis: CLUSTER SHARDS on " + endpoint + ": the server answered: " + reply.str +
            " (a redis+cluster:// URL needs a Redis Cluster node)",
        /*retryable=*/false, /*in_doubt=*/false, /*timed_out=*/false, ErrorCode::store_open_failed);
  }
  if (reply.type != RedisReply::Type::array) bad_shards(endpoint, "the reply is not an array");
  auto layout = std::make_shared<ClusterLayout>();
  layout->slots.fill(ClusterLayout::kNone);
  for (const RedisReply& shard : reply.elements) {
    const RedisReply* slots = field(shard, "slots");
    const RedisReply* nodes = field(shard, "nodes");
    if (slots == nullptr || nodes == nullptr || slots->type != RedisReply::Type::array ||
        nodes->type != RedisReply::Type::array || slots->elements.size() % 2 != 0) {
      bad_shards(endpoint, "a shard has no slots or nodes");
    }
    if (slots->elements.empty()) continue;  // a shard that serves nothing (yet)
    const RedisReply* primary = nullptr;
    for (const RedisReply& node : nodes->elements) {
      if (text_of(field(node, "role")) == "master") primary = &node;
    }
    if (primary == nullptr) continue;  // no primary now (a failover in progress): unserved
    std::string host = text_of(field(*primary, "endpoint"));
    if (host.empty() || host == "?") host = text_of(field(*primary, "ip"));
    std::optional<long long> port = integer_of(field(*primary, tls ? "tls-port" : "port"));
    if (!port && tls) port = integer_of(field(*primary, "port"));
    if (host.empty() || !port || *port < 1 || *port > 65535) {
      bad_shards(endpoint, "a primary has no usable address");
    }
    ClusterNode node{host, static_cast<int>(*port), node_name(host, static_cast<int>(*port))};
    const auto index = static_cast<std::uint16_t>(layout->primaries.size());
    layout->primaries.push_back(std::move(node));
    for (std::size_t i = 0; i < slots->elements.size(); i += 2) {
      const auto first = integer_of(&slots->elements[i]);
      const auto last = integer_of(&slots->elements[i + 1]);
      if (!first || !last || *first < 0 || *last < *first ||
          *last >= static_cast<long long>(kClusterSlots)) {
        bad_shards(endpoint, "a slot range is malformed");
      }
      std::fill(layout->slots.begin() + *first, layout->slots.begin() + *last + 1, index);
    }
  }
  if (layout->primaries.empty()) bad_shards(endpoint, "no primary serves any slot");
  // Primaries in name order: each node lists the shards in an order of its own, and a layout read
  // from another node must number the same primaries the same way (a list() cursor names a
  // primary by its index).
  std::vector<std::uint16_t> order(layout->primaries.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = static_cast<std::uint16_t>(i);
  std::sort(order.begin(), order.end(), [&](std::uint16_t a, std::uint16_t b) {
    return layout->primaries[a].name < layout->primaries[b].name;
  });
  std::vector<std::uint16_t> index_of(order.size());
  std::vector<ClusterNode> sorted;
  sorted.reserve(order.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    index_of[order[i]] = static_cast<std::uint16_t>(i);
    sorted.push_back(std::move(layout->primaries[order[i]]));
  }
  layout->primaries = std::move(sorted);
  for (std::uint16_t& slot : layout->slots) {
    if (slot != ClusterLayout::kNone) slot = index_of[slot];
  }
  layout->loaded = std::chrono::steady_clock::now();
  return layout;
}

// ---- ClusterMap -------------------------------------------------------------------------------

namespace {
// Reloads closer together than this share one (many callers meeting one dead node).
constexpr auto kReloadInterval = std::chrono::milliseconds(50);
// After a MOVED, the whole layout is read again when the last read is this old.
constexpr auto kReloadAfterMoved = std::chrono::milliseconds(200);
}  // namespace

ClusterMap::ClusterMap(const RedisOptions& options, std::shared_ptr<const net::TlsContext> tls)
    : options_(options), tls_(std::move(tls)) {}

std::shared_ptr<const ClusterLayout> ClusterMap::current() const {
  std::lock_guard lock(mutex_);
  return current_;
}

void ClusterMap::publish(std::shared_ptr<const ClusterLayout> layout) {
  std::lock_guard lock(mutex_);
  current_ = std::move(layout);
}

std::unique_ptr<RedisConnection> ClusterMap::connect(const std::string& host, int port) const {
  RedisOptions node = options_;
  node.cluster_nodes.clear();
  node.host = host;
  node.port = port;
  return std::unique_ptr<RedisConnection>(new RedisConnection(node, tls_));
}

std::shared_ptr<const ClusterLayout> ClusterMap::layout() {
  if (auto layout = current()) return layout;
  return reload(nullptr);
}

std::shared_ptr<const ClusterLayout> ClusterMap::reload(
    const std::shared_ptr<const ClusterLayout>& seen) {
  std::lock_guard reloading(reload_mutex_);
  auto known = current();
  if (known &&
      (known != seen || std::chrono::steady_clock::now() - known->loaded < kReloadInterval)) {
    return known;
  }
  auto loaded = load(known);
  publish(loaded);
  return loaded;
}

std::shared_ptr<const ClusterLayout> ClusterMap::load(
    const std::shared_ptr<const ClusterLayout>& known) {
  std::optional<RedisError> first_failure;
  for (const auto& [host, port] : layout_sources(known.get(), options_)) {
    try {
      auto connection = connect(host, port);
      const RedisReply reply =
          connection->command({"CLUSTER", "SHARDS"}, CommandKind::read, "CLUSTER SHARDS");
      return parse_shards(reply, options_.tls.has_value(), connection->endpoint());
    } catch (const RedisError& e) {
      // Said at once rather than hidden behind a later node's failure.
      if (!known && is_layout_refusal(e)) throw;
      if (!first_failure) first_failure = e;
    }
  }
  if (known) return known;  // nobody answered: keep what we had, the caller's deadline decides
  throw_no_layout(first_failure, options_.endpoint());
}

std::shared_ptr<const ClusterLayout> ClusterMap::moved(
    const std::shared_ptr<const ClusterLayout>& seen, std::uint16_t slot, const std::string& host,
    int port) {
  const auto now = std::chrono::steady_clock::now();
  if (seen && now - seen->loaded >= kReloadAfterMoved) {
    auto layout = reload(seen);
    const ClusterNode* node = layout->node_for(slot);
    if (node != nullptr && node->host == host && node->port == port) return layout;
  }
  std::lock_guard lock(mutex_);
  current_ = with_slot_moved(current_.get(), slot, host, port);
  return current_;
}

// ---- shared by both faces' routing ------------------------------------------------------------

bool is_retry_later(const RedisReply& reply) {
  if (!reply.is_error()) return false;
  const std::string_view code = std::string_view(reply.str).substr(0, reply.str.find(' '));
  return code == "TRYAGAIN" || code == "CLUSTERDOWN";
}

std::optional<Redirection> redirection_to_follow(const RedisReply& reply, const ClusterNode& node,
                                                 int& redirections) {
  if (!reply.is_error()) return std::nullopt;
  std::optional<Redirection> redirection = parse_redirection(reply.str);
  if (!redirection || ++redirections > kMaxRedirections) return std::nullopt;
  if (redirection->host.empty()) redirection->host = node.host;
  return redirection;
}

std::vector<std::pair<std::string, int>> layout_sources(const ClusterLayout* known,
                                                        const RedisOptions& options) {
  std::vector<std::pair<std::string, int>> sources;
  if (known != nullptr) {
    for (const ClusterNode& node : known->primaries)
      sources.emplace_back(node.host, node.port);
  }
  for (const RedisNode& node : options.cluster_nodes) {
    std::pair<std::string, int> source(node.host, node.port);
    if (std::find(sources.begin(), sources.end(), source) == sources.end())
      sources.push_back(std::move(source));
  }
  return sources;
}

bool is_layout_refusal(const RedisError& error) noexcept {
  return error.failure() == RedisFailure::reply || error.failure() == RedisFailure::auth ||
         error.failure() == RedisFailure::tls;
}

void throw_no_layout(const std::optional<RedisError>& first_failure, const std::string& endpoint) {
  if (first_failure) {
    throw RedisError(first_failure->failure(),
                     "idem redis: no node of the cluster answered (" + endpoint +
                         "); the first failure: " + first_failure->what(),
                     first_failure->retryable(), /*in_doubt=*/false, first_failure->timed_out(),
                     first_failure->code());
  }
  throw RedisError(RedisFailure::connect, "idem redis: no cluster node is configured",
                   /*retryable=*/false, /*in_doubt=*/false);
}

std::shared_ptr<ClusterLayout> with_slot_moved(const ClusterLayout* base, std::uint16_t slot,
                                               const std::string& host, int port) {
  auto layout = std::make_shared<ClusterLayout>(base != nullptr ? *base : ClusterLayout{});
  if (base == nullptr) layout->slots.fill(ClusterLayout::kNone);
  const std::string name = node_name(host, port);
  auto it = std::find_if(layout->primaries.begin(), layout->primaries.end(),
                         [&](const ClusterNode& node) { return node.name == name; });
  if (it == layout->primaries.end()) {
    layout->primaries.push_back(ClusterNode{host, port, name});
    it = layout->primaries.end() - 1;
  }
  layout->slots[slot] = static_cast<std::uint16_t>(it - layout->primaries.begin());
  return layout;
}

// ---- ClusterRouting ---------------------------------------------------------------------------

namespace {

// Sleeps `pause` or until `deadline`, whichever comes first; false when the deadline has passed.
bool pause_until(std::chrono::milliseconds& pause, std::chrono::steady_clock::time_point deadline) {
  const auto now = std::chrono::steady_clock::now();
  if (now >= deadline) return false;
  std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
  pause = std::min(pause * 2, std::chrono::milliseconds(100));
  return true;
}

}  // namespace

ClusterRouting::ClusterRouting(std::shared_ptr<ClusterMap> map)
    : map_(std::move(map)), layout_(map_->layout()) {}

ClusterRouting::~ClusterRouting() = default;

RedisConnection& ClusterRouting::link(const ClusterNode& node) {
  auto it = links_.find(node.name);
  // An idle link is checked for a hang-up once per lease, when first used: a command is never
  // put in doubt by a socket that was dead before it was sent.
  if (it != links_.end() && checked_.insert(node.name).second && it->second->looks_dead()) {
    drop(node.name);
    it = links_.end();
  }
  if (it == links_.end()) {
    it = links_.emplace(node.name, map_->connect(node.host, node.port)).first;
    checked_.insert(node.name);
  }
  return *it->second;
}

void ClusterRouting::drop(const std::string& name) noexcept {
  const auto link = links_.find(name);
  if (link != links_.end() && link->second.get() == last_) last_ = nullptr;
  if (link != links_.end()) links_.erase(link);
}

std::size_t ClusterRouting::pending() const noexcept {
  std::size_t n = queued_.size();
  for (const auto& [name, connection] : links_)
    n += connection->pending();
  return n;
}

bool ClusterRouting::looks_dead() noexcept {
  // Called when the pool hands this set out again: each link is checked when the lease first
  // uses it (link()), not all of them now — a call uses one or two of them.
  checked_.clear();
  return broken_;
}

RedisReply ClusterRouting::command(std::span<const std::string_view> args, CommandKind kind,
                                   std::string_view what) {
  if (!queued_.empty()) {
    throw InvalidArgument("idem redis: command() with " + std::to_string(queued_.size()) +
                          " pipelined commands still queued; call read_replies() first");
  }
  const auto key = routing_key(args);
  if (!key) return keyless(args, kind, what);
  const std::uint16_t slot = key_slot(*key);
  const auto deadline = Clock::now() + map_->options().command_timeout;
  std::chrono::milliseconds pause(5);
  std::optional<ClusterNode> ask;  // ASK: the next attempt goes there, after ASKING
  std::optional<RedisReply> last;  // the last error reply, returned when time runs out
  for (int redirections = 0;;) {
    const ClusterNode* node = ask ? &*ask : layout_->node_for(slot);
    if (node == nullptr) {
      // No primary serves the slot in this layout (a failover is under way): read it again.
      if (!pause_until(pause, deadline)) {
        if (last) return *last;
        throw RedisError(RedisFailure::reply,
                         "idem redis: " + std::string(what) + " on " + map_->options().endpoint() +
                             ": no primary serves slot " + std::to_string(slot) +
                             " (CLUSTERDOWN: the cluster is failing over or incomplete)",
                         /*retryable=*/true, /*in_doubt=*/false);
      }
      layout_ = map_->reload(layout_);
      continue;
    }
    const std::string name = node->name;
    RedisReply reply;
    try {
      RedisConnection& connection = link(*node);
      if (ask) {
        RedisReply asking = connection.command({"ASKING"}, CommandKind::read, what);
        if (asking.is_error()) return asking;
      }
      reply = connection.command(args, kind, what);
      endpoint_ = connection.endpoint();
      last_ = &connection;
    } catch (const RedisError& e) {
      drop(name);
      // A command that may have run is never sent again; nor after the deadline.
      if (e.in_doubt() || !e.retryable() || !pause_until(pause, deadline)) throw;
      ask.reset();
      layout_ = map_->reload(layout_);
      continue;
    }
    ask.reset();
    if (!reply.is_error()) return reply;
    if (auto redirection = redirection_to_follow(reply, *node, redirections)) {
      if (redirection->ask) {
        ask = ClusterNode{redirection->host, redirection->port,
                          node_name(redirection->host, redirection->port)};
      } else {
        layout_ = map_->moved(layout_, redirection->slot, redirection->host, redirection->port);
      }
      continue;
    }
    if (!is_retry_later(reply) || redirections > kMaxRedirections) return reply;
    last = reply;
    if (!pause_until(pause, deadline)) return reply;
    // The cap is on redirections in a row (a loop between nodes that disagree). While a slot
    // migrates, a two-key script bounces source -ASK-> target -TRYAGAIN-> for as long as the
    // move lasts: each round waits, and the deadline bounds them all.
    redirections = 0;
    layout_ = map_->reload(layout_);
  }
}

RedisReply ClusterRouting::keyless(std::span<const std::string_view> args, CommandKind kind,
                                   std::string_view what) {
  // SCRIPT (LOAD, FLUSH): every primary runs scripts of its own slots.
  if (!args.empty() && equals_ignoring_case(args[0], "SCRIPT")) {
    RedisReply reply;
    const std::vector<ClusterNode> nodes = primaries();
    for (const ClusterNode& node : nodes) {
      RedisConnection& connection = link(node);
      try {
        reply = connection.command(args, kind, what);
      } catch (const RedisError&) {
        drop(node.name);
        throw;
      }
      endpoint_ = connection.endpoint();
      if (reply.is_error()) break;
    }
    return reply;
  }
  // Anything else (PING): any node that answers.
  const auto deadline = Clock::now() + map_->options().command_timeout;
  std::chrono::milliseconds pause(5);
  for (std::size_t attempt = 0;; ++attempt) {
    const ClusterNode& node = layout_->primaries[attempt % layout_->primaries.size()];
    try {
      RedisConnection& connection = link(node);
      RedisReply reply = connection.command(args, kind, what);
      endpoint_ = connection.endpoint();
      return reply;
    } catch (const RedisError& e) {
      drop(node.name);
      if (e.in_doubt() || !e.retryable() || !pause_until(pause, deadline)) throw;
      layout_ = map_->reload(layout_);
    }
  }
}

void ClusterRouting::append(std::span<const std::string_view> args) {
  queued_.emplace_back(args.begin(), args.end());
}

std::vector<RedisReply> ClusterRouting::read_replies(CommandKind kind, std::string_view what) {
  std::vector<std::vector<std::string>> queued = std::move(queued_);
  queued_.clear();
  std::vector<RedisReply> replies(queued.size());
  std::vector<bool> again(queued.size(), false);  // sent on its own after the batch
  // The batch per node: its connection and which commands (by index) it carries, in order.
  struct Batch {
    std::string name;
    RedisConnection* connection = nullptr;
    std::vector<std::size_t> commands;
  };
  std::vector<Batch> batches;
  std::vector<std::vector<std::string_view>> views(queued.size());
  for (std::size_t i = 0; i < queued.size(); ++i) {
    views[i].assign(queued[i].begin(), queued[i].end());
    const auto key = routing_key(views[i]);
    const ClusterNode* node = key ? layout_->node_for(key_slot(*key)) : nullptr;
    if (node == nullptr) {
      again[i] = true;
      continue;
    }
    auto batch = std::find_if(batches.begin(), batches.end(),
                              [&](const Batch& b) { return b.name == node->name; });
    if (batch == batches.end()) {
      RedisConnection* connection = nullptr;
      try {
        connection = &link(*node);
      } catch (const RedisError&) {
        // Not reachable now: these go on their own below, where the layout is read again.
        again[i] = true;
        continue;
      }
      batches.push_back(Batch{node->name, connection, {}});
      batch = batches.end() - 1;
    }
    batch->connection->append(views[i]);
    batch->commands.push_back(i);
  }
  // Every node's batch is written before any reply is read: one round trip for all of them.
  bool any_sent = false;
  try {
    for (Batch& batch : batches) {
      ConnectionAccess::send(*batch.connection, kind, what);
      any_sent = true;
    }
    for (Batch& batch : batches) {
      std::vector<RedisReply> got = batch.connection->read_replies(kind, what);
      endpoint_ = batch.connection->endpoint();
      for (std::size_t j = 0; j < got.size() && j < batch.commands.size(); ++j) {
        replies[batch.commands[j]] = std::move(got[j]);
      }
    }
  } catch (const RedisError& e) {
    // Other nodes' replies may be unread: this set of connections cannot be reused.
    broken_ = true;
    if (any_sent && kind != CommandKind::read && !e.in_doubt()) {
      throw RedisError(e.failure(),
                       std::string(e.what()) +
                           "; commands of this pipeline had been sent to other nodes: they may "
                           "or may not have been applied",
                       kind == CommandKind::idempotent_write, /*in_doubt=*/true, e.timed_out(),
                       e.code());
    }
    throw;
  }
  for (std::size_t i = 0; i < queued.size(); ++i) {
    if (again[i] || (replies[i].is_error() &&
                     (parse_redirection(replies[i].str) || is_retry_later(replies[i])))) {
      replies[i] = command(views[i], kind, what);
    }
  }
  return replies;
}

const std::vector<ClusterNode>& ClusterRouting::primaries() {
  layout_ = map_->reload(layout_);
  primaries_ = layout_->primaries;
  return primaries_;
}

// ---- ConnectionAccess -------------------------------------------------------------------------

void ConnectionAccess::send(RedisConnection& connection, CommandKind kind, std::string_view what) {
  connection.send_pending(kind, what);
}

std::size_t ConnectionAccess::node_count(RedisConnection& connection) {
  return connection.routing_ ? connection.routing_->primaries().size() : 1;
}

RedisConnection& ConnectionAccess::node(RedisConnection& connection, std::size_t i) {
  if (!connection.routing_) return connection;
  return connection.routing_->link(connection.routing_->primaries_.at(i));
}

}  // namespace idem::redis::detail
