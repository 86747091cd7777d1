// thrown_by<E>(call): the exception of type E that `call` throws, to look into (a report, a cause,
// a message), or nullopt when `call` returns; any other exception propagates. A test writes
//
//   const auto error = idem::test::thrown_by<idem::OperationError>([&] { run(io, op()); });
//   ASSERT_TRUE(error) << "expected OperationError";
//   EXPECT_EQ(error->report().status, idem::OperationStatus::failed);
//
// instead of a try / FAIL() / catch block.
#pragma once

#include <optional>
#include <utility>

namespace idem::test {

template <class E, class Call>
std::optional<E> thrown_by(Call&& call) {
  try {
    std::forward<Call>(call)();
  } catch (const E& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace idem::test
