// Internal: the URL schemes idem::open knows, one entry each, and what a scheme's parser hands
// back.
//
// Every scheme is one entry of the table in schemes.cpp (its names, the backend's title, and how
// to get it built) and one file in the backend's own folder, backends/<part>/open/<part>_url.cpp,
// that parses its URLs. The file is compiled into idem::open only when the backend is built
// (open/CMakeLists.txt), and the table finds its parser through the generated list of built
// parts, so open.cpp names no backend and nothing here has an #ifdef.
//
// Thread-safety: everything here is pure or reads constants.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "idem/error.hpp"
#include "idem/open.hpp"
#include "url.hpp"

namespace idem::detail {

// Upper bounds of counts given in URLs (see count_value).
inline constexpr std::size_t kMaxShards = 65'536;
inline constexpr std::size_t kMaxExpectedMarkers = std::size_t{1} << 36;
inline constexpr std::size_t kMaxPoolSize = 10'000;
inline constexpr std::size_t kMaxCount = 1'000'000'000;
inline constexpr std::size_t kMaxSeconds = 86'400'000;  // 1000 days, as durations (url.cpp)

// What a URL asks for, parsed and checked before anything is opened: how to construct the
// recorder, the store and the outbox it names. A parser fills the face it was asked for (all
// when parsing does not depend on the face); a backend without an outbox leaves `outbox` empty.
struct OpenPlan {
  std::function<std::shared_ptr<IdempotencyRecorder>()> recorder;
  std::function<std::shared_ptr<IdempotencyStore>()> store;
  std::function<std::shared_ptr<Outbox>()> outbox;
};

// Parses one scheme's URL (`split.rest` is what follows "scheme:"). Throws ConfigError naming the
// wrong part.
using SchemeParser = OpenPlan (*)(const UrlContext& context, const SplitUrl& split, OpenFace face,
                                  const OpenOptions& options);

struct Scheme {
  std::string_view part;                    // the CMake part: IDEM_WITH_<PART>, <part>_url.cpp
  std::span<const std::string_view> names;  // lower case, e.g. "postgresql", "postgres"
  std::string_view title;                   // for messages: "PostgreSQL"
  std::string_view package;                 // the Debian package the backend needs: "libpq-dev"
  SchemeParser parse;                       // null: the backend was not built
};

// Every scheme idem knows, built or not.
std::span<const Scheme> schemes();

// Their names, for the messages about a missing or unknown one: "memory, sqlite, redis, rediss,
// postgresql or postgres".
std::string known_schemes();

// Splits "//authority/path?query" / "path?query" at the '?'.
inline std::pair<std::string_view, std::string_view> split_query(std::string_view rest) {
  const std::size_t question = rest.find('?');
  if (question == std::string_view::npos) return {rest, {}};
  return {rest.substr(0, question), rest.substr(question + 1)};
}

// Runs `open` (a backend constructor or parser); a ConfigError it throws gets the URL context
// (and loses any secret it might quote). Other errors pass unchanged: they never contain the URL.
template <class Open>
auto with_context(const UrlContext& context, Open&& open) {
  try {
    return open();
  } catch (const ConfigError& e) {
    context.rethrow_backend_config_error(e.what());
  }
}

// Each built part's parser, defined in its <part>_url.cpp.
OpenPlan memory_url(const UrlContext&, const SplitUrl&, OpenFace, const OpenOptions&);
#define IDEM_OPEN_PART(part) \
  OpenPlan part##_url(const UrlContext&, const SplitUrl&, OpenFace, const OpenOptions&);
#include "idem_open_parts.inc"
#undef IDEM_OPEN_PART

}  // namespace idem::detail
