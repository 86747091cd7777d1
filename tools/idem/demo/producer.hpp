// The demo's producer: the first hop's stream of `order.paid` events, with duplicates.
//
// `events` distinct events (fresh ids, an order number and an amount each), plus
// events x duplicate_ratio extra copies, each placed somewhere after its original — what a
// producer that retries its publish (or a broker that redelivers) produces. The pattern comes
// from --seed. The stream is written to the hop's queue file with its delivery positions ("seq").
//
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>

#include "../demo.hpp"

namespace idem::cli::demo {

// Writes the stream to `queue`, calling `progress` with the count written every few thousand
// events (and check_interrupted() with it); returns the stream's length.
std::uint64_t produce(
    const std::filesystem::path& queue, const DemoOptions& options,
    const std::function<void(std::uint64_t written, std::uint64_t total)>& progress);

}  // namespace idem::cli::demo
