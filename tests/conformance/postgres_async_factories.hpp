// The factories of the async PostgreSQL recorder and store suites, written once: each test in a
// schema of its own (dropped afterwards) on a pool of PoolSize connections.
#pragma once

#include <memory>
#include <utility>

#include "../postgres_test_support.hpp"
#include "blocking_over_async_backend.hpp"
#include "idem/testing/async_support.hpp"
#include "idem/testing/manual_clock.hpp"

namespace idem::test::pg {

// For the async suites: `Async` (AsyncPostgresRecorder or AsyncPostgresStore) with its
// connections on an io_context of the factory's own thread, so every call also checks that the
// caller resumes on its own executor.
template <class Async, int PoolSize>
struct AsyncFactory {
  std::shared_ptr<Async> make() {
    if (!server_url()) return nullptr;
    auto options = schema.options();
    options.pool_size = PoolSize;
    return std::make_shared<Async>(io.executor(), options);
  }
  TempSchema schema;  // dropped after the I/O thread has stopped
  idem::testing::IoThread io;
};

// For the blocking suites through `Adapter` (BlockingOverAsyncRecorder or BlockingOverAsyncStore):
// `Async` on the adapter's executor, its time from the suite's ManualClock, and the operator calls
// answered by `Blocking` on the same schema.
template <class Adapter, class Async, class Blocking, int PoolSize>
struct BlockingOverAsyncFactory {
  std::shared_ptr<Adapter> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    if (!server_url()) return nullptr;
    auto options = schema.options();
    options.clock = std::move(clock);
    options.pool_size = PoolSize;
    return blocking_over_async<Adapter, Async, Blocking>(options);
  }
  TempSchema schema;  // dropped after the backend (and the adapter's thread)
};

}  // namespace idem::test::pg
