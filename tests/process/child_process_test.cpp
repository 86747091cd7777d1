// ChildProcess (worker/child_process.hpp) waits within a bound: a child that never writes its
// line, never closes its stdout or never exits fails the call (std::runtime_error) and is killed
// and reaped, instead of hanging the test; a child that does finish is read and reaped as before.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <stdexcept>
#include <string>

#include "worker/child_process.hpp"

namespace {

using idem::test::ChildProcess;
using namespace std::chrono_literals;

// True once `pid` no longer names a process (reaped: not even a zombie is left).
bool gone(pid_t pid) {
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

// Calls `call` on a child that prints "started" and then sleeps: it must throw within a few
// seconds, and leave the child killed and reaped.
template <class Call>
void expect_gives_up(Call call) {
  ChildProcess child({"/bin/sh", "-c", "echo started; exec sleep 60"});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(call(child), std::runtime_error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s) << "the bound did not hold";
  EXPECT_TRUE(gone(child.pid())) << "the child was not killed and reaped";
}

TEST(ChildProcess, ReadLineGivesUpOnASilentChild) {
  expect_gives_up([](ChildProcess& child) {
    EXPECT_EQ(child.read_line(), "started");
    (void)child.read_line(200ms);
  });
}

TEST(ChildProcess, ReadAllGivesUpOnAChildThatKeepsItsOutputOpen) {
  expect_gives_up([](ChildProcess& child) { (void)child.read_all(200ms); });
}

TEST(ChildProcess, WaitGivesUpOnAChildThatNeverExits) {
  expect_gives_up([](ChildProcess& child) { (void)child.wait(200ms); });
}

TEST(ChildProcess, AFinishedChildIsReadAndReaped) {
  ChildProcess child({"/bin/sh", "-c", "echo one; echo two; exit 3"});
  EXPECT_EQ(child.read_line(), "one");
  EXPECT_EQ(child.read_all(), "two\n");
  const int status = child.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << "status " << status;
  EXPECT_EQ(child.wait(), status) << "a second wait() returns the same status";
}

}  // namespace
