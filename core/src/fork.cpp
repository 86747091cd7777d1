#include "idem/detail/fork.hpp"

#include <pthread.h>

#include <atomic>
#include <new>
#include <string>
#include <utility>

#include "idem/error.hpp"

namespace idem::detail {
namespace {

std::atomic<std::uint64_t> g_generation{0};

void on_fork_child() noexcept {
  g_generation.fetch_add(1, std::memory_order_relaxed);
}

// Registered when idem is loaded, before any idem object exists.
[[maybe_unused]] const bool g_registered = [] {
  ::pthread_atfork(nullptr, nullptr, &on_fork_child);
  return true;
}();

// What abandon() keeps: a list that only grows (one node per object a child gave up, so a few at
// most), pushed without a lock — a lock could itself have been held by a parent thread at fork.
struct Abandoned {
  std::shared_ptr<const void> state;
  Abandoned* next;
};
std::atomic<Abandoned*> g_abandoned{nullptr};

}  // namespace

std::uint64_t fork_generation() noexcept {
  return g_generation.load(std::memory_order_relaxed);
}

void ForkOwner::throw_forked(std::string_view what) {
  throw ConfigError(std::string(what) +
                    " was made before fork() and belongs to the parent process; a child must "
                    "not use it (make new idem objects in the child)");
}

void abandon(std::shared_ptr<const void> state) noexcept {
  if (!state) return;
  auto* node = new (std::nothrow) Abandoned{std::move(state), nullptr};
  if (node == nullptr) {
    // Out of memory: drop the last reference on the floor instead (a union member is not
    // destroyed with its union), so the object still never is.
    union Leak {
      std::shared_ptr<const void> reference;
      ~Leak() {}
    } leak{std::move(state)};
    return;
  }
  node->next = g_abandoned.load(std::memory_order_relaxed);
  while (!g_abandoned.compare_exchange_weak(node->next, node, std::memory_order_release,
                                            std::memory_order_relaxed)) {
  }
}

}  // namespace idem::detail
