// The in-memory backends' keyed hash (core/src/keyed_hash.hpp): every byte counts, equal bytes
// hash alike, the key is drawn at random, and no block of a key can make the hash forget what
// came before it, whatever the key (the collisions an unkeyed or "blinded" hash allows).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "keyed_hash.hpp"

namespace {

using idem::detail::hash_bytes;
using idem::detail::hash_finish;
using idem::detail::hash_key;
using idem::detail::kHashConstant;

// `text` with the 8 bytes of `word` written at `at` (little-endian, as the hash loads them).
std::string with_word(std::string text, std::size_t at, std::uint64_t word) {
  std::memcpy(text.data() + at, &word, 8);
  return text;
}

TEST(KeyedHash, EqualBytesHashAlikeWherever) {
  for (std::size_t n = 0; n <= 255; ++n) {
    const std::string a(n, 'k');
    const std::string b = " " + a;  // the same bytes at another address and alignment
    EXPECT_EQ(hash_bytes(a), hash_bytes(std::string_view(b).substr(1))) << n;
  }
}

TEST(KeyedHash, EveryByteOfEveryLengthCounts) {
  for (std::size_t n = 1; n <= 255; ++n) {
    std::string text;
    for (std::size_t i = 0; i < n; ++i)
      text += static_cast<char>('a' + i % 26);
    const std::uint64_t base = hash_bytes(text);
    for (std::size_t i = 0; i < n; ++i) {
      std::string changed = text;
      changed[i] = '#';
      ASSERT_NE(hash_bytes(changed), base) << "length " << n << ", byte " << i;
    }
  }
}

TEST(KeyedHash, LengthCounts) {
  // Keys hold no NUL, but the hash must not rely on it: a shorter prefix is another key.
  const std::string text(64, 'x');
  std::vector<std::uint64_t> seen;
  for (std::size_t n = 0; n <= text.size(); ++n)
    seen.push_back(hash_bytes(std::string_view(text).substr(0, n)));
  for (std::size_t i = 0; i < seen.size(); ++i) {
    for (std::size_t j = i + 1; j < seen.size(); ++j)
      EXPECT_NE(seen[i], seen[j]) << i << " and " << j;
  }
}

TEST(KeyedHash, TheKeyIsDrawnOnceAtRandom) {
  EXPECT_EQ(hash_key(), hash_key());
  // Two draws agreeing would take a broken entropy source (or 2^-64 luck).
  EXPECT_NE(idem::detail::draw_hash_key(), idem::detail::draw_hash_key());
}

// A block equal to the constant it is combined with multiplies to zero. If the product alone
// were kept, the state before that block would be lost: keys differing only before it would
// collide under every hash key. Each case differs in byte 0 only.
TEST(KeyedHash, ABlockThatCancelsItsConstantForgetsNothing) {
  struct Case {
    std::size_t length;
    std::vector<std::pair<std::size_t, std::uint64_t>> words;
  };
  const std::vector<Case> cases = {
      // 17..48 bytes: 16-byte steps (state = f(block ^ constant 1, next ^ state)).
      {40, {{16, kHashConstant[1]}}},
      // More than 48 bytes: three lanes, each block against its own constant.
      {100, {{48, kHashConstant[1]}, {64, kHashConstant[2]}, {80, kHashConstant[3]}}},
      {255, {{48, kHashConstant[1]}, {64, kHashConstant[2]}, {80, kHashConstant[3]}}},
      // The finish: the last 16 bytes start with constant 1.
      {20, {{4, kHashConstant[1]}}},
      {255, {{239, kHashConstant[1]}}},
  };
  for (const Case& c : cases) {
    std::string a(c.length, 'q');
    for (const auto& [at, word] : c.words)
      a = with_word(a, at, word);
    std::string b = a;
    b[0] = 'r';
    EXPECT_NE(hash_bytes(a), hash_bytes(b)) << "length " << c.length;
  }
}

TEST(KeyedHash, PackedIdsWithAHighWordThatCancelsStayApart) {
  // The memory recorder hashes a packed id (32-hex or UUID: 16 bytes the caller chooses) as
  // hash_finish(high, low, key, shape).
  EXPECT_NE(hash_finish(kHashConstant[1], 1, hash_key(), 0),
            hash_finish(kHashConstant[1], 2, hash_key(), 0));
  EXPECT_NE(hash_finish(1, 7, hash_key(), 0), hash_finish(1, 7, hash_key(), 1));
}

}  // namespace
