// The table of URL schemes: one entry per backend (see scheme.hpp).
#include <array>
#include <string_view>

#include "scheme.hpp"

namespace idem::detail {
namespace {

// The parser of `part` when this build has it (idem_open_parts.inc lists the built parts).
constexpr SchemeParser built([[maybe_unused]] std::string_view part) {
#define IDEM_OPEN_PART(name) \
  if (part == #name) return &name##_url;
#include "idem_open_parts.inc"
#undef IDEM_OPEN_PART
  return nullptr;
}

constexpr std::array<std::string_view, 1> kMemory{"memory"};
constexpr std::array<std::string_view, 1> kSqlite{"sqlite"};
constexpr std::array<std::string_view, 6> kRedis{
    "redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel"};
constexpr std::array<std::string_view, 2> kPostgres{"postgresql", "postgres"};

constexpr std::array<Scheme, 4> kSchemes{{
    {"memory", kMemory, "memory", "", &memory_url},
    {"sqlite", kSqlite, "SQLite", "libsqlite3-dev", built("sqlite")},
    {"redis", kRedis, "Redis", "libhiredis-dev", built("redis")},
    {"postgres", kPostgres, "PostgreSQL", "libpq-dev", built("postgres")},
}};

}  // namespace

std::span<const Scheme> schemes() {
  return kSchemes;
}

std::string known_schemes() {
  std::string known;
  std::size_t left = 0;
  for (const Scheme& scheme : schemes())
    left += scheme.names.size();
  for (const Scheme& scheme : schemes()) {
    for (std::string_view name : scheme.names) {
      --left;
      known += name;
      known += left == 0 ? "" : left == 1 ? " or " : ", ";
    }
  }
  return known;
}

}  // namespace idem::detail
