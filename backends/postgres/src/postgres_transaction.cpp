#include "idem/postgres/postgres_transaction.hpp"

#include <charconv>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <variant>

#include "connection.hpp"

namespace idem::postgres {

namespace {

constexpr std::string_view kCall = "PostgresTransaction";

detail::Params to_params(std::span<const PgParam> params) {
  return detail::to_params(params);
}

}  // namespace

PGconn* PostgresTransaction::connection() const noexcept {
  return connection_->raw();
}

std::int64_t PostgresTransaction::do_exec(std::string_view sql, std::span<const PgParam> params) {
  return connection_->exec_params(sql, to_params(params), kCall, StatementKind::read)
      .changed_or_returned();
}

std::optional<std::string> PostgresTransaction::do_query_text(std::string_view sql,
                                                              std::span<const PgParam> params) {
  const detail::Result result =
      connection_->exec_params(sql, to_params(params), kCall, StatementKind::read);
  if (result.rows() == 0 || PQnfields(result.get()) == 0 || result.is_null(0, 0)) {
    return std::nullopt;
  }
  return std::string(result.bytes(0, 0));
}

std::optional<std::int64_t> PostgresTransaction::do_query_int64(std::string_view sql,
                                                                std::span<const PgParam> params) {
  const std::optional<std::string> text = do_query_text(sql, params);
  if (!text) return std::nullopt;
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size()) {
    throw PostgresError(ErrorCode::store_error,
                        std::string(kCall) + "::query_int64 on " + connection_->target() +
                            ": the value '" + text->substr(0, 32) + "' is not an integer",
                        "", false, false);
  }
  return value;
}

}  // namespace idem::postgres

namespace idem::postgres::detail {

// Handler parameters go in text format without a type, so the server infers each from the
// statement ($1 compared with an integer column is an integer), as it would for a literal.
Params to_params(std::span<const SqlParam> params) {
  Params out;
  int index = 0;
  for (const SqlParam& param : params) {
    ++index;
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::nullptr_t>) {
            out.null(0);
          } else if constexpr (std::is_same_v<V, bool>) {
            out.untyped(v ? "true" : "false");
          } else if constexpr (std::is_same_v<V, std::int64_t>) {
            out.untyped(std::to_string(v));
          } else if constexpr (std::is_same_v<V, double>) {
            char buffer[64];
            const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v);
            if (ec != std::errc()) throw InvalidArgument("SQL parameter: cannot format a double");
            out.untyped(std::string_view(buffer, static_cast<std::size_t>(end - buffer)));
          } else if constexpr (std::is_same_v<V, std::string_view>) {
            if (v.find('\0') != std::string_view::npos) {
              throw InvalidArgument("SQL parameter $" + std::to_string(index) +
                                    " is text with a NUL byte, which PostgreSQL text cannot hold "
                                    "(pass it with PgParam::bytea)");
            }
            out.untyped(v);
          } else {
            out.bytea(v.bytes);
          }
        },
        param.value());
  }
  return out;
}

}  // namespace idem::postgres::detail
