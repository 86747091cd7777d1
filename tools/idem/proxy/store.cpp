#include "store.hpp"

#include <string>

#include "idem/async/memory_store.hpp"
#include "idem/error.hpp"
#include "idem/memory_store.hpp"
#include "idem/open.hpp"
#if IDEM_HAVE_SQLITE_ASYNC
#include "idem/sqlite/async_store.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#endif
#if IDEM_HAVE_REDIS_ASYNC
#include "idem/redis/async_redis_store.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_store.hpp"
#endif
#if IDEM_HAVE_POSTGRES_ASYNC
#include "idem/postgres/async_postgres.hpp"
#include "idem/postgres/connection_pool.hpp"
#include "idem/postgres/postgres_store.hpp"
#endif

namespace idem::cli::proxy {

std::shared_ptr<idem::async::AsyncStore> open_async_store(std::string_view url,
                                                          const asio::any_io_executor& executor) {
  (void)executor;
  std::shared_ptr<IdempotencyStore> blocking = open_store(url);
  if (auto memory = std::dynamic_pointer_cast<InMemoryIdempotencyStore>(blocking)) {
    return std::make_shared<idem::async::AsyncMemoryStore>(std::move(memory));
  }
#if IDEM_HAVE_SQLITE_ASYNC
  if (auto sqlite = std::dynamic_pointer_cast<sqlite::SqliteIdempotencyStore>(blocking)) {
    return std::make_shared<sqlite::AsyncSqliteStore>(std::move(sqlite));
  }
#endif
#if IDEM_HAVE_REDIS_ASYNC
  if (auto redis = std::dynamic_pointer_cast<redis::RedisIdempotencyStore>(blocking)) {
    // The blocking store reached the server; the coroutine face gets a pool of its own.
    return std::make_shared<redis::AsyncRedisStore>(executor, redis->pool()->options());
  }
#endif
#if IDEM_HAVE_POSTGRES_ASYNC
  if (auto postgres = std::dynamic_pointer_cast<postgres::PostgresIdempotencyStore>(blocking)) {
    auto pool =
        std::make_shared<postgres::AsyncConnectionPool>(executor, postgres->pool()->options());
    return std::make_shared<postgres::AsyncPostgresStore>(std::move(pool));
  }
#endif
  throw NotSupported("idem proxy: the store at " + redact_url(url) +
                     " has no coroutine face in this build");
}

}  // namespace idem::cli::proxy
