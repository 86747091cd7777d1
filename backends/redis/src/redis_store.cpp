#include "idem/redis/redis_store.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "idem/detail/contract.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "internal.hpp"
#include "operations.hpp"
#include "record_decoder.hpp"

namespace idem::redis {
namespace {

using detail::flag_reply;

}  // namespace

RedisIdempotencyStore::RedisIdempotencyStore(RedisOptions options)
    : RedisIdempotencyStore(std::make_shared<ConnectionPool>(std::move(options))) {}

RedisIdempotencyStore::RedisIdempotencyStore(std::shared_ptr<ConnectionPool> pool)
    : pool_(std::move(pool)) {
  if (!pool_) throw InvalidArgument("RedisIdempotencyStore: the connection pool is null");
  clock_ = pool_->options().clock ? pool_->options().clock : system_clock();
  wait_clock_ = clock_;
  auto connection = pool_->lease();
  const RedisReply reply = connection->command({"PING"}, CommandKind::read, "PING");
  if (reply.type != RedisReply::Type::status) {
    detail::throw_unexpected_reply(reply, "PING", connection->endpoint());
  }
}

RedisIdempotencyStore::~RedisIdempotencyStore() = default;

std::string RedisIdempotencyStore::record_key(std::string_view key) const {
  return detail::record_key(pool_->options().key_prefix, key);
}

namespace {

RedisReply run(ConnectionPool& pool, const detail::ScriptInvocation& call, std::string_view what,
               std::string& endpoint) {
  auto connection = pool.lease();
  endpoint = connection->endpoint();
  return detail::run_script(*connection, *call.script, call.key_views(), call.arg_views(),
                            CommandKind::write, what);
}

RedisReply send(RedisConnection& connection, const detail::Request& request,
                std::string_view what) {
  if (request.is_script()) {
    return detail::run_script(connection, *request.script.script, request.script.key_views(),
                              request.script.arg_views(), request.kind, what);
  }
  const std::vector<std::string_view> argv = request.command_views();
  return connection.command(argv, request.kind, what);
}

}  // namespace

ClaimOutcome RedisIdempotencyStore::do_claim(std::string_view key,
                                             std::optional<std::string_view> fingerprint,
                                             Millis lease) {
  detail::StoreClaim claim(pool_->options(), detail::to_ms(clock_->wall_now()), key, fingerprint,
                           lease, claim_reads_first_.load(std::memory_order_relaxed));
  auto connection = pool_->lease();
  while (!claim.read(send(*connection, claim.request(), "claim"), connection->endpoint())) {
  }
  claim_reads_first_.store(detail::next_claim_reads_first(claim.outcome()),
                           std::memory_order_relaxed);
  return std::move(claim.outcome());
}

bool RedisIdempotencyStore::do_complete(std::string_view key, std::uint64_t token,
                                        StoredValue value, const ExecutionReport& report,
                                        Millis ttl) {
  const auto call = detail::store_complete_call(pool_->options(), detail::to_ms(clock_->wall_now()),
                                                key, token, value, report, ttl);
  std::string endpoint;
  const RedisReply reply = run(*pool_, call, "complete", endpoint);
  return flag_reply(reply, "complete", endpoint);
}

bool RedisIdempotencyStore::do_release(std::string_view key, std::uint64_t token) {
  const auto call = detail::store_release_call(pool_->options(), key, token);
  std::string endpoint;
  const RedisReply reply = run(*pool_, call, "release", endpoint);
  return flag_reply(reply, "release", endpoint);
}

bool RedisIdempotencyStore::do_renew(std::string_view key, std::uint64_t token, Millis lease) {
  const auto call = detail::store_renew_call(pool_->options(), detail::to_ms(clock_->wall_now()),
                                             key, token, lease);
  std::string endpoint;
  const RedisReply reply = run(*pool_, call, "renew", endpoint);
  return flag_reply(reply, "renew", endpoint);
}

std::optional<IdempotencyRecord> RedisIdempotencyStore::do_lookup(std::string_view key) {
  detail::StoreLookup lookup(pool_->options(), clock_->wall_now(), key);
  auto connection = pool_->lease();
  while (!lookup.read(send(*connection, lookup.request(), "lookup"), connection->endpoint())) {
  }
  return std::move(lookup.outcome());
}

std::size_t RedisIdempotencyStore::do_purge_expired(const PurgeProgress& progress) {
  const RedisOptions& options = pool_->options();
  const std::string pattern = detail::glob_escape(options.key_prefix) + "s:{*";
  const std::string now = std::to_string(detail::to_ms(clock_->wall_now()));
  auto connection = pool_->lease();
  detail::load_script(*connection, detail::store_purge_script(), "purge_expired");
  std::size_t purged = 0;
  // One SCAN page is one chunk: a pipeline of compare-and-delete scripts, each atomic alone.
  detail::scan_keys(*connection, pattern, options.scan_count, "purge_expired",
                    [&](const std::vector<RedisReply>& keys) {
                      std::vector<detail::ScriptCall> calls;
                      calls.reserve(keys.size());
                      for (const RedisReply& key : keys)
                        calls.push_back({{key.str}, {now}});
                      // A key SCAN returned twice is found gone the second time: counted once.
                      const std::size_t before = purged;
                      for (const RedisReply& reply : detail::run_script_pipelined(
                               *connection, detail::store_purge_script(), calls, CommandKind::write,
                               "purge_expired")) {
                        if (flag_reply(reply, "purge_expired", connection->endpoint())) ++purged;
                      }
                      if (purged > before && progress) progress(purged);
                    });
  return purged;
}

StoreCounts RedisIdempotencyStore::do_counts() {
  const RedisOptions& options = pool_->options();
  const std::string pattern = detail::glob_escape(options.key_prefix) + "s:{*";
  const std::int64_t now = detail::to_ms(clock_->wall_now());
  auto connection = pool_->lease();
  const auto number = [](const RedisReply& field) -> std::optional<std::int64_t> {
    std::int64_t value = 0;
    if (field.type != RedisReply::Type::string) return std::nullopt;
    const char* end = field.str.data() + field.str.size();
    const auto [ptr, ec] = std::from_chars(field.str.data(), end, value);
    if (ec != std::errc() || ptr != end) return std::nullopt;
    return value;
  };
  StoreCounts counts;
  const auto count = [&](bool completed, std::int64_t deadline) {
    if (completed) {
      ++(deadline > now ? counts.completed : counts.expired);
    } else {
      ++(deadline > now ? counts.in_progress : counts.abandoned);
    }
  };
  std::unordered_set<std::string> seen;  // SCAN may return a key more than once
  detail::scan_keys(
      *connection, pattern, options.scan_count, "counts", [&](const std::vector<RedisReply>& keys) {
        std::vector<const std::string*> sent;
        for (const RedisReply& key : keys) {
          if (!seen.insert(key.str).second) continue;
          // The record's start: its state and deadline, without the value.
          connection->append({"GETRANGE", key.str, "0", "95"});
          sent.push_back(&key.str);
        }
        if (sent.empty()) return;
        std::vector<const std::string*> hashes;  // written by an older idem
        const std::vector<RedisReply> replies =
            connection->read_replies(CommandKind::read, "counts");
        for (std::size_t i = 0; i < replies.size() && i < sent.size(); ++i) {
          const RedisReply& reply = replies[i];
          if (reply.is_error()) {
            if (reply.str.find("WRONGTYPE") != std::string::npos) hashes.push_back(sent[i]);
            continue;
          }
          // A value idem cannot read is counted nowhere, as lookup() of it would fail; the key
          // was deleted between SCAN and GETRANGE: "".
          if (reply.type != RedisReply::Type::string) continue;
          if (const auto header = detail::RecordText::header(reply.str)) {
            count(header->completed, header->deadline);
          }
        }
        if (hashes.empty()) return;
        for (const std::string* key : hashes)
          connection->append({"HMGET", *key, "state", "lease_until", "expires_at"});
        for (const RedisReply& reply : connection->read_replies(CommandKind::read, "counts")) {
          if (reply.is_error() || reply.type != RedisReply::Type::array ||
              reply.elements.size() != 3) {
            continue;
          }
          const RedisReply& state = reply.elements[0];
          if (state.str == "in_progress") {
            if (auto lease_until = number(reply.elements[1])) count(false, *lease_until);
          } else if (state.str == "completed") {
            if (auto expires_at = number(reply.elements[2])) count(true, *expires_at);
          }
        }
      });
  return counts;
}

namespace {

// SCAN calls one list() page makes at most: the work of a page is bounded even when few keys
// match (the page then ends early, with a cursor to continue).
constexpr int kListScanCalls = 64;

// A list() cursor: "<scan cursor>" or "<scan cursor> <last key returned>"; on a cluster the scan
// cursor is "<primary>/<scan cursor>", the primary an index into the cluster's layout.
struct ListCursor {
  std::size_t node = 0;
  std::string scan = "0";
  std::optional<std::string> after;

  std::string scan_text(bool cluster) const {
    return cluster ? std::to_string(node) + "/" + scan : scan;
  }
};

ListCursor parse_list_cursor(std::string_view text, bool cluster) {
  ListCursor cursor;
  if (text.empty()) return cursor;
  const std::size_t space = text.find(' ');
  std::string_view number = text.substr(0, space);
  const auto bad = [&] {
    throw InvalidArgument("list: '" + std::string(text.substr(0, 40)) +
                          "' is not a cursor of this store (pass a page's `next` as it is)");
  };
  const std::size_t slash = number.find('/');
  if (cluster != (slash != std::string_view::npos)) bad();
  if (cluster) {
    const std::string_view node = number.substr(0, slash);
    const auto [end, ec] = std::from_chars(node.data(), node.data() + node.size(), cursor.node);
    if (node.empty() || ec != std::errc() || end != node.data() + node.size()) bad();
    number = number.substr(slash + 1);
  }
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || ec != std::errc() || end != number.data() + number.size()) bad();
  cursor.scan = std::string(number);
  if (space != std::string_view::npos) cursor.after = std::string(text.substr(space + 1));
  return cursor;
}

}  // namespace

RecordPage RedisIdempotencyStore::do_list(std::string_view prefix, std::size_t limit,
                                          std::string_view cursor_text) {
  const RedisOptions& options = pool_->options();
  const bool cluster = options.is_cluster();
  ListCursor cursor = parse_list_cursor(cursor_text, cluster);
  const std::string head = options.key_prefix + "s:{";
  const std::string pattern =
      detail::glob_escape(options.key_prefix) + "s:{" + detail::glob_escape(prefix) + "*";
  const std::string count = std::to_string(options.scan_count);
  auto connection = pool_->lease();
  std::vector<std::string> keys;  // Redis keys of the page
  RecordPage page;
  // Every primary of a cluster in turn (the connection itself on one server).
  const std::size_t nodes = detail::ConnectionAccess::node_count(*connection);
  if (cursor.node >= nodes) {
    throw InvalidArgument("list: the cursor names primary " + std::to_string(cursor.node) +
                          " of a cluster that has " + std::to_string(nodes) +
                          " (pass a page's `next` as it is)");
  }
  for (int call = 0; call < kListScanCalls; ++call) {
    RedisConnection& node = detail::ConnectionAccess::node(*connection, cursor.node);
    const RedisReply reply = node.command({"SCAN", cursor.scan, "MATCH", pattern, "COUNT", count},
                                          CommandKind::read, "list");
    if (reply.type != RedisReply::Type::array || reply.elements.size() != 2 ||
        reply.elements[1].type != RedisReply::Type::array) {
      detail::throw_unexpected_reply(reply, "list", connection->endpoint());
    }
    // A batch is taken in byte order, so a page that ends inside it can continue after its last
    // key when the batch is read again.
    std::vector<std::string> batch;
    for (const RedisReply& key : reply.elements[1].elements) {
      if (cursor.after && key.str <= *cursor.after) continue;
      batch.push_back(key.str);
    }
    std::sort(batch.begin(), batch.end());
    batch.erase(std::unique(batch.begin(), batch.end()), batch.end());
    const std::size_t room = limit - keys.size();
    if (batch.size() > room) {
      batch.resize(room);
      keys.insert(keys.end(), batch.begin(), batch.end());
      page.next = cursor.scan_text(cluster) + " " + keys.back();
      break;
    }
    keys.insert(keys.end(), batch.begin(), batch.end());
    cursor.scan = reply.elements[0].str;
    cursor.after.reset();
    if (cursor.scan == "0") {
      if (cursor.node + 1 >= nodes) break;
      ++cursor.node;  // the next primary, from its start
    }
    if (keys.size() == limit || call + 1 == kListScanCalls) {
      page.next = cursor.scan_text(cluster);
      break;
    }
  }
  // The records: one pipelined GET; an older idem's hash is read with HGETALL after it. A key
  // deleted since the SCAN is left out.
  const auto user_key = [&](const std::string& redis_key) {
    return std::string_view(redis_key).substr(head.size(), redis_key.size() - head.size() - 1);
  };
  for (const std::string& key : keys)
    connection->append({"GET", key});
  const std::vector<RedisReply> replies = connection->read_replies(CommandKind::read, "list");
  std::vector<std::optional<IdempotencyRecord>> found(keys.size());
  std::vector<std::size_t> hashes;
  for (std::size_t i = 0; i < keys.size() && i < replies.size(); ++i) {
    const RedisReply& reply = replies[i];
    if (reply.is_error() && reply.str.find("WRONGTYPE") != std::string::npos) {
      hashes.push_back(i);
      continue;
    }
    if (reply.is_error()) detail::throw_reply_error(reply, "list", connection->endpoint());
    if (reply.is_nil()) continue;
    if (reply.type != RedisReply::Type::string) {
      detail::throw_unexpected_reply(reply, "list", connection->endpoint());
    }
    found[i] = detail::decode_record_text(user_key(keys[i]), keys[i], reply.str);
  }
  if (!hashes.empty()) {
    for (const std::size_t i : hashes)
      connection->append({"HGETALL", keys[i]});
    const std::vector<RedisReply> fields = connection->read_replies(CommandKind::read, "list");
    for (std::size_t j = 0; j < hashes.size() && j < fields.size(); ++j) {
      const std::size_t i = hashes[j];
      if (fields[j].is_error())
        detail::throw_reply_error(fields[j], "list", connection->endpoint());
      if (fields[j].type == RedisReply::Type::array && fields[j].elements.empty()) continue;
      found[i] = detail::RecordDecoder(user_key(keys[i]), keys[i], fields[j]).decode();
    }
  }
  for (auto& record : found) {
    if (!record) continue;
    record->value = {};
    record->report.reset();
    page.records.push_back(std::move(*record));
  }
  return page;
}

bool RedisIdempotencyStore::do_remove(std::string_view key, std::uint64_t token) {
  detail::ScriptInvocation call;
  call.script = &detail::store_remove_script();
  call.keys = {record_key(key)};
  call.args = {std::to_string(token)};
  detail::add_done_notice(call, pool_->options());
  std::string endpoint;
  const RedisReply reply = run(*pool_, call, "remove", endpoint);
  return flag_reply(reply, "remove", endpoint);
}

std::size_t RedisIdempotencyStore::do_entry_count() {
  const RedisOptions& options = pool_->options();
  const std::string pattern = detail::glob_escape(options.key_prefix) + "s:{*";
  auto connection = pool_->lease();
  std::unordered_set<std::string> seen;  // SCAN may return a key more than once
  detail::scan_keys(*connection, pattern, options.scan_count, "entry_count",
                    [&](const std::vector<RedisReply>& keys) {
                      for (const RedisReply& key : keys)
                        seen.insert(key.str);
                    });
  return seen.size();
}

std::optional<IdempotencyRecord> RedisIdempotencyStore::do_wait(std::string_view key,
                                                                SteadyTime deadline,
                                                                std::stop_token stop) {
  // A test clock's time is its own: the socket cannot wait on it. Poll as the base class does.
  if (pool_->options().clock) return IdempotencyStore::do_wait(key, deadline, stop);
  // Subscribed before the first read, so a completion between the read and the wait is heard.
  std::unique_ptr<RedisConnection> subscriber;
  try {
    subscriber = pool_->open_dedicated();
    const std::string channel = detail::done_channel(record_key(key));
    const RedisReply reply =
        subscriber->command({pool_->options().is_cluster() ? "SSUBSCRIBE" : "SUBSCRIBE", channel},
                            CommandKind::read, "wait");
    if (reply.is_error()) subscriber.reset();  // e.g. an ACL without pub/sub: poll
  } catch (const RedisError&) {
    subscriber.reset();
  }
  if (!subscriber) return IdempotencyStore::do_wait(key, deadline, stop);
  // Read again at least this often: a safety net for a message lost with its connection.
  constexpr std::chrono::milliseconds kReread{1000};
  // How often a wait for a message looks at `stop`.
  constexpr std::chrono::milliseconds kStopCheck{50};
  for (;;) {
    auto record = do_lookup(key);
    const WallTime now_wall = wait_clock_->wall_now();
    if (!idem::detail::held_at(record, now_wall)) return record;
    const SteadyTime now = wait_clock_->steady_now();
    if (now >= deadline || stop.stop_requested()) return record;
    // An owner that dies publishes nothing: its lease's end is the next moment to look.
    const auto lease_left =
        std::chrono::duration_cast<std::chrono::milliseconds>(record->lease_until - now_wall);
    const SteadyTime until = std::min({deadline, now + lease_left, now + kReread});
    for (;;) {
      const SteadyTime slice = std::min(until, wait_clock_->steady_now() + kStopCheck);
      try {
        if (subscriber->next_push(slice)) break;
      } catch (const RedisError&) {
        return IdempotencyStore::do_wait(key, deadline, stop);  // the subscription is gone: poll
      }
      if (stop.stop_requested() || wait_clock_->steady_now() >= until) break;
    }
  }
}

}  // namespace idem::redis
