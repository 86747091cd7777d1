// What the demo and its relay process (relay_process.cpp, `idem demo-relay`) share.
#pragma once

#include <cstddef>

namespace idem::cli::demo {

// Rows per relay pass in the demo: small, so the relay killed after a pass publishes only a few
// rows again.
inline constexpr std::size_t kRelayBatch = 32;

}  // namespace idem::cli::demo
