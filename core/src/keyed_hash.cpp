#include "keyed_hash.hpp"

#include <chrono>
#include <cstdint>
#include <random>

namespace idem::detail {

std::uint64_t draw_hash_key() noexcept {
#if defined(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
  return kHashConstant[2];
#else
  std::uint64_t key = 0;
  try {
    std::random_device device;
    key = (std::uint64_t{device()} << 32) ^ device();
  } catch (...) {
    // No entropy source: where this stack is (ASLR) and the time still vary between processes.
    key = reinterpret_cast<std::uintptr_t>(&key) ^
          static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  return fold_multiply(key ^ kHashConstant[0], kHashConstant[1]);
#endif
}

}  // namespace idem::detail
