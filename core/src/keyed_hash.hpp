// Internal: the hash of the in-memory backends' keys (event ids, consumer names, idempotency
// keys), keyed with a value drawn at random once per process.
//
// Those keys come from outside (a producer, an HTTP client's Idempotency-Key). Against a fixed
// hash anyone can compute keys that share a hash and pile them up in one bucket or probe run, so
// that every lookup there walks all of them; without the key they cannot. The design is
// wyhash's: 16 bytes a folded 64 × 64 → 128-bit multiply, three independent lanes from 48 bytes
// on, and the last 16 bytes (overlapping what came before) in the finish, so no length needs a
// byte loop. A fuzzing build (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION) keeps the key fixed, so
// a crashing input reproduces in another process.
//
// Thread-safety: pure functions; the key is drawn once, thread-safely.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace idem::detail {

inline std::uint64_t load8(const char* p) noexcept {
  std::uint64_t word;
  std::memcpy(&word, p, 8);
  return word;
}
inline std::uint64_t load4(const char* p) noexcept {
  std::uint32_t word;
  std::memcpy(&word, p, 4);
  return word;
}

// a, b and their 128-bit product, folded to 64 bits: one multiply mixes every bit of both words,
// and keeping the inputs in the result means a word that cancels its constant (a zero factor)
// cannot wipe out the other word or the running state. Without that, a key whose block equals a
// constant below would reset the state and collide with every key that differs from it only
// before that block, whatever the hash key (wyhash's "blinding").
__extension__ typedef unsigned __int128 Uint128;
inline std::uint64_t fold_multiply(std::uint64_t a, std::uint64_t b) noexcept {
  const Uint128 product = static_cast<Uint128>(a) * b;
  return a ^ b ^ static_cast<std::uint64_t>(product) ^ static_cast<std::uint64_t>(product >> 64);
}

// Odd 64-bit constants with half their bits set (wyhash's).
inline constexpr std::uint64_t kHashConstant[4] = {0x2d358dccaa6c78a5ull, 0x8bb84b93962eacc9ull,
                                                   0x4b33a62ed433d4a3ull, 0x4d5a2da51de1aa47ull};

// A fresh random key (keyed_hash.cpp); hash_key() calls it once per process.
std::uint64_t draw_hash_key() noexcept;

inline std::uint64_t hash_key() noexcept {
  static const std::uint64_t key = draw_hash_key();
  return key;
}

// The last step: two words of input and the running state to 64 bits.
inline std::uint64_t hash_finish(std::uint64_t a, std::uint64_t b, std::uint64_t state,
                                 std::uint64_t length) noexcept {
  a ^= kHashConstant[1];
  b ^= state;
  const Uint128 product = static_cast<Uint128>(a) * b;
  // Both halves keep their input (as fold_multiply does), then go through one more multiply.
  return fold_multiply(a ^ static_cast<std::uint64_t>(product) ^ kHashConstant[0] ^ length,
                       b ^ static_cast<std::uint64_t>(product >> 64) ^ kHashConstant[1]);
}

// The keyed hash of any bytes (a 255-byte key is a chain of 5 multiplies).
inline std::uint64_t hash_bytes(std::string_view text) noexcept {
  const char* p = text.data();
  const std::size_t n = text.size();
  std::uint64_t state = hash_key();
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  if (n <= 16) {
    if (n >= 4) {
      // Two 4-byte reads from each end (overlapping when n < 8) cover every byte.
      const std::size_t step = (n >> 3) << 2;
      a = (load4(p) << 32) | load4(p + step);
      b = (load4(p + n - 4) << 32) | load4(p + n - 4 - step);
    } else if (n > 0) {
      const auto byte = [p](std::size_t i) {
        return std::uint64_t{static_cast<unsigned char>(p[i])};
      };
      a = (byte(0) << 16) | (byte(n >> 1) << 8) | byte(n - 1);
    }
  } else {
    std::size_t left = n;
    if (left > 48) {
      std::uint64_t lane1 = state;
      std::uint64_t lane2 = state;
      do {
        state = fold_multiply(load8(p) ^ kHashConstant[1], load8(p + 8) ^ state);
        lane1 = fold_multiply(load8(p + 16) ^ kHashConstant[2], load8(p + 24) ^ lane1);
        lane2 = fold_multiply(load8(p + 32) ^ kHashConstant[3], load8(p + 40) ^ lane2);
        p += 48;
        left -= 48;
      } while (left > 48);
      state ^= lane1 ^ lane2;
    }
    for (; left > 16; p += 16, left -= 16)
      state = fold_multiply(load8(p) ^ kHashConstant[1], load8(p + 8) ^ state);
    a = load8(p + left - 16);  // n > 16: these 16 bytes are inside the text
    b = load8(p + left - 8);
  }
  return hash_finish(a, b, state, n);
}

}  // namespace idem::detail
