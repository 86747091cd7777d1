// The async recorder and store protocols check their arguments once, before the backend.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <string>
#include <vector>

#include "../async_test_support.hpp"
#include "idem/async/recorder.hpp"
#include "idem/async/store.hpp"
#include "idem/error.hpp"

namespace {

using idem::async::Task;

// Counts what reaches the backend.
class CountingRecorder final : public idem::async::AsyncRecorder {
 public:
  int calls = 0;

 private:
  Task<bool> do_is_processed(std::string_view, std::string_view) override {
    ++calls;
    co_return false;
  }
  Task<void> do_mark_processed(std::string_view, std::string_view) override {
    ++calls;
    co_return;
  }
};

using idem::test::run;

TEST(AsyncRecorderContract, BadArgumentsNeverReachTheBackend) {
  asio::io_context io;
  CountingRecorder recorder;
  EXPECT_THROW(run(io, recorder.is_processed("", "e1")), idem::InvalidKey);
  EXPECT_THROW(run(io, recorder.mark_processed("billing", std::string(300, 'x'))),
               idem::InvalidKey);
  std::vector<std::string> ids{"a", "b\n"};
  EXPECT_THROW(run(io, recorder.mark_processed_many("billing", ids)), idem::InvalidKey);
  EXPECT_THROW(run(io, recorder.claim("billing", "e1", idem::Millis(0))), idem::InvalidArgument);
  EXPECT_EQ(recorder.calls, 0);
}

TEST(AsyncRecorderContract, DefaultsAreOneCallPerIdAndNotSupported) {
  asio::io_context io;
  CountingRecorder recorder;
  std::vector<std::string> ids{"a", "b", "c"};
  auto seen = run(io, recorder.is_processed_many("billing", ids));
  EXPECT_EQ(seen, (std::vector<bool>{false, false, false}));
  EXPECT_EQ(recorder.calls, 3);
  EXPECT_FALSE(recorder.capabilities().claims);
  EXPECT_THROW(run(io, recorder.claim("billing", "e1", idem::Millis(10))), idem::NotSupported);
}

}  // namespace
