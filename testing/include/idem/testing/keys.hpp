// The keys the conformance suites feed every backend: keys that idem::validate_key() refuses (each
// call of a recorder or store, blocking or async, must throw idem::InvalidKey for every one),
// valid keys a careless backend might mangle (SQL quoting, LIKE and glob wildcards, separators,
// encodings), which must come back exactly as they went in, and fresh event ids by the batch.
//
// Used by recorder_conformance.hpp, store_conformance.hpp and the async suites; a backend's own
// tests may use them too. Thread-safety: plain functions returning fresh vectors.
#pragma once

#include <string>
#include <vector>

#include "idem/event.hpp"
#include "idem/key.hpp"

namespace idem::testing {

// Keys that validate_key() rejects.
inline std::vector<std::string> invalid_keys() {
  return {
      std::string(),                              // empty
      std::string("   "),                         // only whitespace
      std::string("a\0b", 3),                     // NUL byte
      std::string("line\nbreak"),                 // control character
      std::string("tab\there"),                   // control character
      std::string("del\x7f"),                     // DEL
      std::string(idem::kMaxKeyLength + 1, 'x'),  // one byte too long
  };
}

// Valid keys that a careless backend might mangle.
inline std::vector<std::string> unusual_valid_keys() {
  return {
      "it's",
      "say \"hi\"",
      "x'; DROP TABLE processed_log; --",
      "x'; DROP TABLE idempotency; --",
      "a;b;c",
      "caf\xc3\xa9-\xc3\xbc-\xe6\x97\xa5\xe6\x9c\xac",  // café-ü-日本 in UTF-8
      "caf\xc3\xa9-\xe6\x97\xa5\xe6\x9c\xac",           // café-日本 in UTF-8
      "with spaces inside",
      "100%_match",
      "100%_match*?",
      "back\\slash",
      "colon:separated:key",
      "{curly}:[square]",
      "{\"json\": [1, 2]}",
      std::string(idem::kMaxKeyLength, 'k'),  // exactly the longest valid key
  };
}

// `count` fresh event ids (new_event_id()), for the cases that race or batch many ids.
inline std::vector<std::string> fresh_event_ids(int count) {
  std::vector<std::string> ids;
  for (int i = 0; i < count; ++i)
    ids.push_back(idem::new_event_id());
  return ids;
}

}  // namespace idem::testing
