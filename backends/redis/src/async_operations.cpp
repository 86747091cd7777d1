#include "async_operations.hpp"

#include <array>

namespace idem::redis::detail {

async::Task<RedisReply> run_script_async(AsyncConnection& connection, const ScriptInvocation& call,
                                         CommandKind kind, std::string_view what) {
  const std::string numkeys = std::to_string(call.keys.size());
  RedisReply reply =
      co_await connection.command(script_argv(call, numkeys, /*with_source=*/false), kind, what);
  if (!is_noscript(reply)) co_return reply;
  // Not run (the server does not know the script): send the source, which runs and caches it.
  co_return co_await connection.command(script_argv(call, numkeys, /*with_source=*/true), kind,
                                        what);
}

async::Task<RedisReply> send_async(AsyncConnection& connection, const Request& request,
                                   std::string_view what) {
  if (request.is_script())
    co_return co_await run_script_async(connection, request.script, request.kind, what);
  const std::vector<std::string_view> argv = request.command_views();
  co_return co_await connection.command(argv, request.kind, what);
}

async::Task<void> ping_async(AsyncConnection& connection) {
  const std::array<std::string_view, 1> ping = {"PING"};
  const RedisReply reply = co_await connection.command(ping, CommandKind::read, "PING");
  if (reply.type != RedisReply::Type::status) {
    throw_unexpected_reply(reply, "PING", connection.endpoint());
  }
}

}  // namespace idem::redis::detail
