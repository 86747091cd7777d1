// The AsyncStore behind `idem proxy`, from any idem store URL (docs/urls.md).
#pragma once

#include <memory>
#include <string_view>

#include <asio/any_io_executor.hpp>

#include "idem/async/store.hpp"

namespace idem::cli::proxy {

// Opens the store at `url` as idem::open_store does (checking the URL, reaching the server,
// creating the schema), then its coroutine face on `executor`: memory:// and sqlite: serve the
// opened store (SQLite on idem's own threads), redis:// and postgresql:// a non-blocking pool with
// the URL's settings. Throws what open_store throws, and NotSupported for a backend without a
// coroutine face in this build.
std::shared_ptr<idem::async::AsyncStore> open_async_store(std::string_view url,
                                                          const asio::any_io_executor& executor);

}  // namespace idem::cli::proxy
