// fork() awareness for objects that own threads or connections.
//
// After fork() the child has one thread — the one that called fork() — and a copy of everything
// else: the parent's idem objects, with their mutexes and condition variables as they were, and
// the handles of threads that do not exist in the child. Joining such a thread waits forever (or
// for whichever of the child's threads reuses its descriptor), destroying a condition variable a
// parent thread waited on waits for that waiter, and closing a connection the parent still uses
// can end the parent's session. So idem's rule (docs/guarantees.md, "fork()"): objects alive at
// fork() belong to the parent; the child makes its own.
//
// ForkOwner remembers the process an object was made in; use() checks it at the object's entry
// points and throws ConfigError in a child, so misuse is a clear error rather than a hang.
// Process-wide state (the coordinator registry, the default store) compares generations to start
// afresh in a child, and abandon() keeps what a child must not destroy out of reach of every
// destructor.
//
// Thread-safety: everything here may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

namespace idem::detail {

// 0 in the process that loaded idem, one more in each child made by fork() (counted by a
// pthread_atfork child handler): two values differ exactly when a fork() happened in between.
std::uint64_t fork_generation() noexcept;

// The process an object was made in.
class ForkOwner {
 public:
  ForkOwner() noexcept : generation_(fork_generation()) {}

  // True in a child made by fork() after this object was made.
  bool forked() const noexcept { return generation_ != fork_generation(); }

  // Throws ConfigError in such a child: "`what` was made before fork() and belongs to the
  // parent process; make new idem objects in the child".
  void use(std::string_view what) const {
    if (forked()) throw_forked(what);
  }

 private:
  [[noreturn]] static void throw_forked(std::string_view what);
  std::uint64_t generation_;
};

// Keeps `state` alive for the rest of the process and never destroys it: for the parent's
// threads, mutexes and condition variables that a child finds in its copy of memory. (Kept
// reachable, so leak checkers do not report it.)
void abandon(std::shared_ptr<const void> state) noexcept;

}  // namespace idem::detail
