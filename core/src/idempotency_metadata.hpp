// Internal: writing the idempotency_* entries of an ExecutionReport's metadata.
//
// Both the coordinator (idempotency.cpp) and the operation wrapper (operation_support.cpp)
// write a handful of these keys on every keyed call, replays included, so the keys are built
// once and written in key order with hinted inserts.
//
// Thread-safety: metadata_keys() is safe from any thread; set_metadata_after() writes the map
// it is given and nothing else.
#pragma once

#include <iterator>
#include <map>
#include <string>
#include <string_view>

namespace idem::detail {

using Metadata = std::map<std::string, std::string>;

// Every idempotency_* key idem writes, in ascending order. A lookup by a string literal would
// build (and for most of these, allocate) a std::string each time.
struct MetadataKeys {
  const std::string cache_hit = "idempotency_cache_hit";
  const std::string enabled = "idempotency_enabled";
  const std::string key = "idempotency_key";
  const std::string recorded = "idempotency_recorded";
  const std::string scope = "idempotency_scope";
  const std::string status = "idempotency_status";
  const std::string stored_key = "idempotency_stored_key";
};

inline const MetadataKeys& metadata_keys() {
  // Never destroyed: calls may still run while static objects are torn down.
  static const MetadataKeys* const keys = new MetadataKeys();
  return *keys;
}

// Sets metadata[key] = value, `hint` being where `key` goes when it is new, and returns the
// position after it. Keys that share the "idempotency_" prefix sit next to each other, so keys
// written in ascending order from one search each insert with a hint that holds (two
// comparisons, no search per key); a hint that does not hold only costs a search.
inline Metadata::iterator set_metadata_after(Metadata& metadata, Metadata::iterator hint,
                                             const std::string& key, std::string_view value) {
  const std::size_t size = metadata.size();
  const auto at = metadata.emplace_hint(hint, key, value);
  if (metadata.size() == size) at->second.assign(value);  // the key was there already
  return std::next(at);
}

}  // namespace idem::detail
