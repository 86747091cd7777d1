// An async backend behind the blocking face the blocking conformance suites test, written once
// for the Redis and PostgreSQL factories of tests/conformance.
#pragma once

#include <memory>
#include <utility>

#include <asio/any_io_executor.hpp>

namespace idem::test {

// `Adapter` (idem::testing::BlockingOverAsyncRecorder or BlockingOverAsyncStore) over an `Async`
// backend made with `options` on the adapter's executor; the operator calls are answered by the
// blocking `Blocking` backend on the same options (the same prefix or schema).
template <class Adapter, class Async, class Blocking, class Options>
std::shared_ptr<Adapter> blocking_over_async(const Options& options) {
  return std::make_shared<Adapter>(
      [options](asio::any_io_executor executor) {
        return std::make_shared<Async>(std::move(executor), options);
      },
      std::make_shared<Blocking>(options));
}

}  // namespace idem::test
