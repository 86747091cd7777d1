#include "idem/sqlite/sqlite_transaction.hpp"

#include <string>

#include "connection.hpp"

namespace idem::sqlite {

namespace {

void bind_all(detail::Statement& statement, std::string_view sql,
              std::span<const SqlParam> params) {
  const int expected = statement.parameter_count();
  if (static_cast<std::size_t>(expected) != params.size()) {
    throw InvalidArgument("the SQL statement \"" + std::string(sql.substr(0, 80)) + "\" takes " +
                          std::to_string(expected) + " parameter(s), " +
                          std::to_string(params.size()) + " given");
  }
  int index = 1;
  for (const auto& param : params)
    statement.bind(index++, param);
}

}  // namespace

sqlite3* SqliteTransaction::db() const noexcept {
  return connection_->db();
}

std::int64_t SqliteTransaction::do_exec(std::string_view sql, std::span<const SqlParam> params) {
  auto statement = connection_->prepare(sql);
  bind_all(statement, sql, params);
  return statement.run();
}

std::optional<std::int64_t> SqliteTransaction::do_query_int64(std::string_view sql,
                                                              std::span<const SqlParam> params) {
  auto statement = connection_->prepare(sql);
  bind_all(statement, sql, params);
  if (!statement.step() || statement.column_is_null(0)) return std::nullopt;
  return statement.column_int64(0);
}

std::optional<std::string> SqliteTransaction::do_query_text(std::string_view sql,
                                                            std::span<const SqlParam> params) {
  auto statement = connection_->prepare(sql);
  bind_all(statement, sql, params);
  if (!statement.step() || statement.column_is_null(0)) return std::nullopt;
  return statement.column_text(0);
}

}  // namespace idem::sqlite
