// URLs: open_recorder / open_store parsing (every scheme, nothing opened), redact_url,
// parse_duration and RedisOptions::from_url.
//
// Invariants: only idem errors; redact_url never throws, never returns control characters,
// and never contains a password that the input's user info carried.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "idem/open.hpp"
#include "url.hpp"
#ifdef IDEM_FUZZ_HAVE_REDIS
#include "idem/redis/redis_options.hpp"
#endif

namespace {

// The redacted user info: from the first "://" to the next '@' (empty without both).
std::string_view userinfo_of(std::string_view redacted) {
  const std::size_t start = redacted.find("://");
  const std::size_t at = start == std::string_view::npos ? start : redacted.find('@', start);
  if (at == std::string_view::npos) return {};
  return redacted.substr(start, at - start);
}

std::size_t occurrences(std::string_view text, std::string_view part) {
  std::size_t count = 0;
  for (std::size_t at = text.find(part); at != std::string_view::npos; at = text.find(part, at + 1))
    ++count;
  return count;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  using idem::fuzz::expect_only_idem_errors;

  expect_only_idem_errors("check_open_url(recorder)", [&] {
    idem::detail::check_open_url(input, idem::detail::OpenFace::recorder);
  });
  expect_only_idem_errors("check_open_url(store)", [&] {
    idem::detail::check_open_url(input, idem::detail::OpenFace::store);
  });
  expect_only_idem_errors("parse_duration", [&] { (void)idem::parse_duration(input); });
#ifdef IDEM_FUZZ_HAVE_REDIS
  expect_only_idem_errors("RedisOptions::from_url",
                          [&] { (void)idem::redis::RedisOptions::from_url(std::string(input)); });
#endif

  std::string redacted;
  try {
    redacted = idem::redact_url(input);
  } catch (...) {
    idem::fuzz::fail("redact_url threw");
  }
  for (const char c : redacted) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      idem::fuzz::fail("redact_url returned a control character");
    }
  }
  // "scheme://user:secret@host/...": a password of 4+ letters and digits must not survive in the
  // redacted user info (the part before the first '@').
  // Only a real authority: "://" right after the scheme (not a "://" inside a query).
  const std::size_t authority = input.find(':');
  if (authority != std::string_view::npos && authority > 0 && input.substr(authority, 3) == "://" &&
      input.substr(0, authority).find_first_of("/?#@") == std::string_view::npos) {
    const std::string_view rest = input.substr(authority + 3);
    const std::string_view userinfo = rest.substr(0, rest.find_first_of("@/?#"));
    const std::size_t colon = userinfo.find(':');
    if (userinfo.size() < rest.size() && rest[userinfo.size()] == '@' &&
        colon != std::string_view::npos) {
      const std::string_view password = userinfo.substr(colon + 1);
      const bool plain = std::all_of(password.begin(), password.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      });
      // The password may also stand inside the user name or the scheme, which redact_url keeps
      // on purpose: compare with the same URL redacted without its password. Redaction kept the
      // password when the redacted user info holds it more often than that one does.
      std::string without_password(input);
      without_password.erase(authority + 3 + colon, password.size() + 1);
      const std::size_t kept = occurrences(userinfo_of(redacted), password);
      const std::size_t elsewhere =
          occurrences(userinfo_of(idem::redact_url(without_password)), password);
      if (password.size() >= 4 && plain && kept > elsewhere) {
        idem::fuzz::fail("redact_url kept the password of '" + redacted + "'");
      }
    }
  }
  return 0;
}
