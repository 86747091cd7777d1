// Shared by AsyncRedisRecorder and AsyncRedisStore (not installed): scripts over an
// AsyncConnection, with the blocking face's NOSCRIPT fallback.
#pragma once

#include <string>
#include <string_view>

#include "idem/async/task.hpp"
#include "idem/redis/async_connection.hpp"
#include "operations.hpp"

namespace idem::redis::detail {

// EVALSHA; when the server does not know the script (NOSCRIPT), EVAL with the source. Error
// replies are returned, not thrown.
async::Task<RedisReply> run_script_async(AsyncConnection& connection, const ScriptInvocation& call,
                                         CommandKind kind, std::string_view what);

// A store step's request (a plain command or a script). Error replies are returned, not thrown.
async::Task<RedisReply> send_async(AsyncConnection& connection, const Request& request,
                                   std::string_view what);

// PING: throws unless the server answers.
async::Task<void> ping_async(AsyncConnection& connection);

}  // namespace idem::redis::detail
