#include "async_cluster.hpp"

#include <algorithm>
#include <array>
#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <charconv>
#include <chrono>
#include <exception>
#include <optional>
#include <string_view>
#include <utility>

#include "idem/redis/redis_error.hpp"

namespace idem::redis::detail {
namespace {

using Clock = std::chrono::steady_clock;
using Replies = std::vector<RedisReply>;

bool is_redirection(const RedisReply& reply) {
  return reply.is_error() && parse_redirection(reply.str).has_value();
}

// Splits CommandBatch bytes ("*N\r\n$L\r\narg\r\n...", as append_command writes them) back into
// each command's arguments (views into `bytes`).
std::vector<std::vector<std::string_view>> split_commands(std::string_view bytes,
                                                          std::size_t count) {
  std::vector<std::vector<std::string_view>> commands;
  commands.reserve(count);
  std::size_t at = 0;
  const auto number = [&](char mark) {
    if (at >= bytes.size() || bytes[at] != mark) {
      throw RedisError(RedisFailure::protocol, "idem redis: a malformed command batch",
                       /*retryable=*/false, /*in_doubt=*/false);
    }
    const std::size_t end = bytes.find("\r\n", at);
    std::size_t value = 0;
    std::from_chars(bytes.data() + at + 1, bytes.data() + end, value);
    at = end + 2;
    return value;
  };
  for (std::size_t c = 0; c < count; ++c) {
    std::vector<std::string_view> args(number('*'));
    for (std::string_view& arg : args) {
      const std::size_t length = number('$');
      arg = bytes.substr(at, length);
      at += length + 2;
    }
    commands.push_back(std::move(args));
  }
  return commands;
}

// Waits `pause` (then doubles it, up to 100 ms) unless `deadline` comes first; false once it has
// passed. A pause also starts a new count of redirections.
async::Task<bool> wait_a_moment(const asio::any_io_executor& executor,
                                std::chrono::milliseconds& pause, int& redirections,
                                Clock::time_point deadline) {
  const auto now = Clock::now();
  if (now >= deadline) co_return false;
  asio::steady_timer timer(executor);
  timer.expires_after(std::min<Clock::duration>(pause, deadline - now));
  co_await timer.async_wait(asio::use_awaitable);
  pause = std::min(pause * 2, std::chrono::milliseconds(100));
  redirections = 0;
  co_return true;
}

// The outcome of each of several calls run at once.
struct Gathered {
  std::vector<Replies> replies;
  std::vector<std::exception_ptr> errors;
};

struct Gathering {
  explicit Gathering(const asio::strand<asio::any_io_executor>& strand, std::size_t n)
      : left(n), all_in(strand) {
    out.replies.resize(n);
    out.errors.resize(n);
    all_in.expires_at(asio::steady_timer::time_point::max());
  }
  Gathered out;
  std::size_t left;
  asio::steady_timer all_in;  // expires when the last call is in
};

// Runs on `strand`: starts every call, then waits until each has ended. The calls' ends run on
// the same strand, so counting them and waiting for the count need no lock.
async::Task<Gathered> gather_on(asio::strand<asio::any_io_executor> strand,
                                std::vector<async::Task<Replies>> calls) {
  auto gathering = std::make_shared<Gathering>(strand, calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    asio::co_spawn(
        strand, std::move(calls[i]),
        asio::bind_executor(strand, [gathering, i](std::exception_ptr error, Replies replies) {
          gathering->out.errors[i] = error;
          gathering->out.replies[i] = std::move(replies);
          // Expiring the timer ends the wait below (or a wait not begun yet).
          if (--gathering->left == 0)
            gathering->all_in.expires_at(asio::steady_timer::time_point::min());
        }));
  }
  if (gathering->left > 0) {
    asio::error_code ignored;
    co_await gathering->all_in.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
  co_return std::move(gathering->out);
}

// Every call at once (each node's part of a batch has its own connection), and each outcome.
async::Task<Gathered> gather(const asio::any_io_executor& executor,
                             std::vector<async::Task<Replies>> calls) {
  auto strand = asio::make_strand(executor);
  co_return co_await asio::co_spawn(strand, gather_on(strand, std::move(calls)),
                                    asio::use_awaitable);
}

}  // namespace

struct AsyncCluster::Command {
  std::vector<std::string_view> args;
  std::optional<std::uint16_t> slot;  // nullopt: no key (PING)
};

AsyncCluster::AsyncCluster(asio::any_io_executor executor, RedisOptions options,
                           std::shared_ptr<const net::TlsContext> tls)
    : executor_(std::move(executor)),
      options_(std::move(options)),
      tls_(std::move(tls)),
      endpoint_(options_.endpoint()) {}

void AsyncCluster::shut_down() {
  std::map<std::string, std::shared_ptr<AsyncConnection>, std::less<>> nodes;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    nodes.swap(nodes_);
  }
  // Each connection's destructor ends its calls with operation_aborted.
}

void add_stats(AsyncConnectionStats& total, const AsyncConnectionStats& more) noexcept {
  total.connects += more.connects;
  total.connect_failures += more.connect_failures;
  total.drops += more.drops;
  total.commands += more.commands;
  total.writes += more.writes;
  total.cancelled += more.cancelled;
}

AsyncConnectionStats AsyncCluster::stats() const {
  std::lock_guard lock(mutex_);
  AsyncConnectionStats sum;
  for (const auto& [name, connection] : nodes_)
    add_stats(sum, connection->stats());
  return sum;
}

std::shared_ptr<AsyncConnection> AsyncCluster::node(const std::string& host, int port) {
  const std::string name = node_name(host, port);
  std::lock_guard lock(mutex_);
  if (closed_) {
    throw RedisError(RedisFailure::io, "idem redis: " + endpoint_ + " is shut down",
                     /*retryable=*/false, /*in_doubt=*/false);
  }
  auto it = nodes_.find(name);
  if (it == nodes_.end()) {
    RedisOptions options = options_;
    options.cluster_nodes.clear();
    options.host = host;
    options.port = port;
    it =
        nodes_.emplace(name, std::make_shared<AsyncConnection>(executor_, std::move(options), tls_))
            .first;
  }
  return it->second;
}

std::shared_ptr<const ClusterLayout> AsyncCluster::current() const {
  std::lock_guard lock(mutex_);
  return layout_;
}

async::Task<std::shared_ptr<const ClusterLayout>> AsyncCluster::reload(
    std::shared_ptr<AsyncCluster> self, std::shared_ptr<const ClusterLayout> seen) {
  // Another call replaced the layout meanwhile: use that one.
  if (auto now = self->current(); now && now != seen) co_return now;
  std::optional<RedisError> first_failure;
  for (const auto& candidate : layout_sources(seen.get(), self->options_)) {
    try {
      // Held while awaiting: a concurrent shut_down() must not destroy it under this call.
      const std::shared_ptr<AsyncConnection> held = self->node(candidate.first, candidate.second);
      AsyncConnection& connection = *held;
      // (A named array: g++ 12 cannot take a braced list inside co_await.)
      const std::array<std::string_view, 2> shards{"CLUSTER", "SHARDS"};
      const RedisReply reply =
          co_await connection.command(shards, CommandKind::read, "CLUSTER SHARDS");
      std::shared_ptr<ClusterLayout> layout =
          parse_shards(reply, self->options_.tls.has_value(), connection.endpoint());
      layout->loaded = Clock::now();
      std::lock_guard lock(self->mutex_);
      self->layout_ = layout;
      co_return layout;
    } catch (const RedisError& e) {
      if (!seen && is_layout_refusal(e)) throw;  // said at once, not hidden behind another node
      if (!first_failure) first_failure = e;
    }
  }
  if (seen) co_return seen;
  throw_no_layout(first_failure, self->endpoint_);
}

std::shared_ptr<const ClusterLayout> AsyncCluster::moved(
    const std::shared_ptr<const ClusterLayout>& seen, std::uint16_t slot, const std::string& host,
    int port) {
  std::lock_guard lock(mutex_);
  layout_ = with_slot_moved(layout_ ? layout_.get() : seen.get(), slot, host, port);
  return layout_;
}

async::Task<RedisReply> AsyncCluster::single(std::shared_ptr<AsyncCluster> self,
                                             const Command& command, CommandKind kind,
                                             std::string what, Clock::time_point deadline,
                                             std::shared_ptr<AsyncConnection>* subscriber) {
  std::shared_ptr<const ClusterLayout> layout = self->current();
  if (!layout) layout = co_await reload(self, nullptr);
  std::optional<ClusterNode> ask;
  std::chrono::milliseconds pause(5);
  int redirections = 0;
  for (;;) {
    const ClusterNode* node = ask                         ? &*ask
                              : command.slot              ? layout->node_for(*command.slot)
                              : layout->primaries.empty() ? nullptr
                                                          : &layout->primaries.front();
    if (node == nullptr) {
      if (!co_await wait_a_moment(self->executor_, pause, redirections, deadline)) {
        throw RedisError(RedisFailure::reply,
                         "idem redis: " + what + " on " + self->endpoint_ +
                             ": no primary serves the slot (CLUSTERDOWN: the cluster is failing "
                             "over or incomplete)",
                         /*retryable=*/true, /*in_doubt=*/false);
      }
      layout = co_await reload(self, layout);
      continue;
    }
    RedisReply reply;
    std::optional<RedisError> failure;
    try {
      const std::shared_ptr<AsyncConnection> held = self->node(node->host, node->port);
      AsyncConnection& connection = *held;
      if (subscriber) {
        // The node's connection becomes a subscriber (this router serves nothing else).
        if (ask) {
          const std::array<std::string_view, 1> asking{"ASKING"};
          const RedisReply asked = co_await connection.command(asking, kind, what);
          if (asked.is_error()) co_return asked;
        }
        reply = co_await connection.send_subscribe(command.args[0], command.args[1]);
        *subscriber = held;
      } else if (ask) {
        CommandBatch batch;
        batch.add({"ASKING"});
        batch.add(command.args);
        Replies replies = co_await connection.pipeline(std::move(batch), kind, what);
        reply = std::move(replies.back());
        if (replies.front().is_error()) reply = std::move(replies.front());
      } else {
        reply = co_await connection.command(command.args, kind, what);
      }
    } catch (const RedisError& e) {
      // A command that may have run is never sent again.
      if (e.in_doubt() || !e.retryable()) throw;
      failure = e;
    }
    if (failure) {
      // Not sent, or only read: again after a pause and a fresh layout, until the deadline.
      if (!co_await wait_a_moment(self->executor_, pause, redirections, deadline)) throw *failure;
      ask.reset();
      layout = co_await reload(self, layout);
      continue;
    }
    ask.reset();
    if (!reply.is_error()) co_return reply;
    if (auto redirection = redirection_to_follow(reply, *node, redirections)) {
      if (redirection->ask) {
        ask = ClusterNode{redirection->host, redirection->port,
                          node_name(redirection->host, redirection->port)};
      } else {
        layout = self->moved(layout, redirection->slot, redirection->host, redirection->port);
      }
      continue;
    }
    if (!is_retry_later(reply) ||
        !co_await wait_a_moment(self->executor_, pause, redirections, deadline))
      co_return reply;
    layout = co_await reload(self, layout);
  }
}

async::Task<std::pair<RedisReply, std::shared_ptr<AsyncConnection>>> AsyncCluster::subscribe(
    std::shared_ptr<AsyncCluster> self, std::string channel) {
  Command command;
  command.args = {"SSUBSCRIBE", channel};
  command.slot = key_slot(channel);
  std::shared_ptr<AsyncConnection> node;
  const auto deadline = Clock::now() + self->options_.command_timeout;
  RedisReply reply =
      co_await single(self, command, CommandKind::read, "subscribe", deadline, &node);
  co_return std::make_pair(std::move(reply), std::move(node));
}

async::Task<Replies> AsyncCluster::run(std::shared_ptr<AsyncCluster> self, std::string bytes,
                                       std::size_t count, CommandKind kind, std::string what) {
  const auto deadline = Clock::now() + self->options_.command_timeout;
  std::vector<Command> commands;
  for (auto& args : split_commands(bytes, count)) {
    Command command;
    command.args = std::move(args);
    if (const auto key = routing_key(command.args)) command.slot = key_slot(*key);
    commands.push_back(std::move(command));
  }
  Replies replies(commands.size());
  std::vector<bool> again(commands.size(), false);  // sent on its own after the batch
  if (commands.size() == 1) {
    replies[0] = co_await single(self, commands[0], kind, what, deadline);
    co_return replies;
  }
  std::shared_ptr<const ClusterLayout> layout = self->current();
  if (!layout) layout = co_await reload(self, nullptr);
  // Each primary's part of the batch, in the caller's order within it.
  struct Part {
    const ClusterNode* node;
    CommandBatch batch;
    std::vector<std::size_t> commands;
  };
  std::vector<Part> parts;
  for (std::size_t i = 0; i < commands.size(); ++i) {
    const ClusterNode* node = commands[i].slot ? layout->node_for(*commands[i].slot) : nullptr;
    if (node == nullptr) {
      again[i] = true;
      continue;
    }
    auto part = std::find_if(parts.begin(), parts.end(),
                             [&](const Part& p) { return p.node->name == node->name; });
    if (part == parts.end()) {
      parts.push_back(Part{node, {}, {}});
      part = parts.end() - 1;
    }
    part->batch.add(commands[i].args);
    part->commands.push_back(i);
  }
  // Every primary's part at once: the round trips overlap.
  std::vector<async::Task<Replies>> calls;
  for (Part& part : parts) {
    calls.push_back(
        self->node(part.node->host, part.node->port)->pipeline(std::move(part.batch), kind, what));
  }
  Gathered gathered = co_await gather(self->executor_, std::move(calls));
  const bool any_ok = std::any_of(gathered.errors.begin(), gathered.errors.end(),
                                  [](const std::exception_ptr& e) { return e == nullptr; });
  for (std::size_t p = 0; p < parts.size(); ++p) {
    if (!gathered.errors[p]) {
      Replies& got = gathered.replies[p];
      for (std::size_t j = 0; j < got.size() && j < parts[p].commands.size(); ++j)
        replies[parts[p].commands[j]] = std::move(got[j]);
      continue;
    }
    try {
      std::rethrow_exception(gathered.errors[p]);
    } catch (const RedisError& e) {
      if (any_ok && kind != CommandKind::read && !e.in_doubt()) {
        throw RedisError(e.failure(),
                         std::string(e.what()) +
                             "; commands of this pipeline were applied on other nodes: the call "
                             "as a whole may or may not have been applied",
                         kind == CommandKind::idempotent_write, /*in_doubt=*/true, e.timed_out(),
                         e.code());
      }
      if (e.in_doubt() || !e.retryable()) throw;
      // This node is unreachable and nothing of its part ran: its commands go on their own.
      for (std::size_t i : parts[p].commands)
        again[i] = true;
    }
  }
  for (std::size_t i = 0; i < commands.size(); ++i) {
    if (again[i] || is_redirection(replies[i]) || is_retry_later(replies[i]))
      replies[i] = co_await single(self, commands[i], kind, what, deadline);
  }
  co_return replies;
}

}  // namespace idem::redis::detail
