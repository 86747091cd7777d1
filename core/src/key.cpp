#include "idem/key.hpp"

#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "idem/error.hpp"

namespace idem {
namespace {

// True when `value` has no control character (below 0x20, or 0x7f) and is not only spaces.
bool plain_key(std::string_view value) noexcept {
  const char* p = value.data();
  const std::size_t n = value.size();
  std::size_t i = 0;
#if defined(__SSE2__)
  // 16 bytes per step, whatever the optimization level. The accumulators are bytes, as the input
  // is: a compiler vectorizing the scalar loop with wider ones widens every lane.
  if (n >= 16) {
    const __m128i below_space = _mm_set1_epi8(0x1f);
    const __m128i del = _mm_set1_epi8(0x7f);
    const __m128i space = _mm_set1_epi8(' ');
    __m128i bad = _mm_setzero_si128();
    __m128i spaces = _mm_set1_epi8(-1);  // lanes that have seen only spaces
    auto scan = [&](const char* at) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
      // v <= 0x1f, unsigned: min(v, 0x1f) == v.
      bad = _mm_or_si128(bad, _mm_cmpeq_epi8(_mm_min_epu8(v, below_space), v));
      bad = _mm_or_si128(bad, _mm_cmpeq_epi8(v, del));
      spaces = _mm_and_si128(spaces, _mm_cmpeq_epi8(v, space));
    };
    for (; i + 16 <= n; i += 16)
      scan(p + i);
    if (i < n) scan(p + n - 16);  // the tail, overlapping bytes already scanned
    return _mm_movemask_epi8(bad) == 0 && _mm_movemask_epi8(spaces) != 0xffff;
  }
#endif
  unsigned char bad = 0;
  unsigned char printable = 0;
  for (; i < n; ++i) {
    const auto c = static_cast<unsigned char>(p[i]);
    bad |= static_cast<unsigned char>((c < 0x20) | (c == 0x7f));
    printable |= static_cast<unsigned char>(c != ' ');
  }
  return bad == 0 && printable != 0;
}

// Returns nullptr when valid, else the reason.
const char* key_problem(std::string_view value, std::size_t max_length) noexcept {
  if (value.empty()) return "is empty";
  if (value.size() > max_length) return "is too long";
  // The common case in one branch-free pass (every call of every backend checks its keys here,
  // and a 255-byte id is scanned on each); the loop below runs only to name what is wrong.
  if (plain_key(value)) return nullptr;
  bool all_space = true;
  for (unsigned char c : value) {
    if (c == 0) return "contains a NUL byte";
    if (c < 0x20 || c == 0x7f) return "contains a control character";
    if (c != ' ') all_space = false;
  }
  if (all_space) return "is only whitespace";
  return nullptr;
}

}  // namespace

bool is_valid_key(std::string_view value, std::size_t max_length) noexcept {
  return key_problem(value, max_length) == nullptr;
}

void validate_key(std::string_view what, std::string_view value, std::size_t max_length) {
  const char* problem = key_problem(value, max_length);
  if (problem == nullptr) return;
  std::string message = std::string(what) + " " + problem;
  if (value.size() > max_length) {
    message +=
        " (" + std::to_string(value.size()) + " bytes, at most " + std::to_string(max_length) + ")";
  }
  throw InvalidKey(message);
}

}  // namespace idem
