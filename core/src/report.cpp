#include "idem/report.hpp"

#include <nlohmann/json.hpp>

#include <charconv>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "idem/error.hpp"
#include "iso_time.hpp"

namespace idem {

std::string_view to_string(AttemptStatus status) noexcept {
  switch (status) {
    case AttemptStatus::succeeded:
      return "succeeded";
    case AttemptStatus::failed:
      return "failed";
    case AttemptStatus::timed_out:
      return "timed_out";
    case AttemptStatus::rejected:
      return "rejected";
    case AttemptStatus::cancelled:
      return "cancelled";
  }
  return "unknown";
}

std::string_view to_string(OperationStatus status) noexcept {
  switch (status) {
    case OperationStatus::succeeded:
      return "succeeded";
    case OperationStatus::failed:
      return "failed";
    case OperationStatus::timed_out:
      return "timed_out";
    case OperationStatus::cancelled:
      return "cancelled";
  }
  return "unknown";
}

namespace {

using nlohmann::json;

// The status named `text`, or nullopt; both report readers use these.
std::optional<AttemptStatus> attempt_status_named(std::string_view text) noexcept {
  for (auto status : {AttemptStatus::succeeded, AttemptStatus::failed, AttemptStatus::timed_out,
                      AttemptStatus::rejected, AttemptStatus::cancelled}) {
    if (to_string(status) == text) return status;
  }
  return std::nullopt;
}

std::optional<OperationStatus> operation_status_named(std::string_view text) noexcept {
  for (auto status : {OperationStatus::succeeded, OperationStatus::failed,
                      OperationStatus::timed_out, OperationStatus::cancelled}) {
    if (to_string(status) == text) return status;
  }
  return std::nullopt;
}

AttemptStatus attempt_status_from(const std::string& text) {
  if (const auto status = attempt_status_named(text)) return *status;
  throw DecodeError("execution report: unknown attempt status '" + text + "'");
}

OperationStatus operation_status_from(const std::string& text) {
  if (const auto status = operation_status_named(text)) return *status;
  throw DecodeError("execution report: unknown operation status '" + text + "'");
}

const json& field(const json& object, const char* name, json::value_t type, const char* where) {
  const auto it = object.find(name);
  if (it == object.end()) {
    throw DecodeError(std::string("execution report: ") + where + " has no '" + name + "'");
  }
  const bool matches = it->type() == type || (type == json::value_t::number_integer &&
                                              it->type() == json::value_t::number_unsigned);
  if (!matches) {
    throw DecodeError(std::string("execution report: ") + where + "." + name +
                      " has the wrong type (" + it->type_name() + ")");
  }
  return *it;
}

std::chrono::nanoseconds nanos_from(const json& value, const char* name) {
  if (value.is_number_unsigned() &&
      value.get<std::uint64_t>() >
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    throw DecodeError(std::string("execution report: ") + name + " is out of range");
  }
  return std::chrono::nanoseconds(value.get<std::int64_t>());
}

std::map<std::string, std::string> string_map(const json& object, const char* where) {
  std::map<std::string, std::string> out;
  for (const auto& [name, value] : object.items()) {
    if (!value.is_string()) {
      throw DecodeError(std::string("execution report: ") + where + " metadata '" + name +
                        "' is not a string");
    }
    out.emplace(name, value.get<std::string>());
  }
  return out;
}

}  // namespace

int ExecutionReport::retry_count() const noexcept {
  int primary = 0;
  for (const auto& attempt : attempts) {
    if (attempt.source == "primary") ++primary;
  }
  return primary > 0 ? primary - 1 : 0;
}

const AttemptRecord* ExecutionReport::last_error() const noexcept {
  for (auto it = attempts.rbegin(); it != attempts.rend(); ++it) {
    if (it->status != AttemptStatus::succeeded) return &*it;
  }
  return nullptr;
}

namespace {

// Text JSON writes as it is: printable ASCII without '"' and '\\' (no escape, no UTF-8 check).
bool plain(std::string_view text) noexcept {
  for (const char c : text) {
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') return false;
  }
  return true;
}

bool plain(const std::map<std::string, std::string>& map) noexcept {
  for (const auto& [name, value] : map) {
    if (!plain(name) || !plain(value)) return false;
  }
  return true;
}

void put_string(std::string& out, std::string_view text) {
  out.push_back('"');
  out.append(text);
  out.push_back('"');
}

void put_map(std::string& out, const std::map<std::string, std::string>& map) {
  out.push_back('{');
  bool first = true;
  for (const auto& [name, value] : map) {
    if (!first) out.push_back(',');
    first = false;
    put_string(out, name);
    out.push_back(':');
    put_string(out, value);
  }
  out.push_back('}');
}

// to_json() of a report whose text is all plain(): the same bytes as nlohmann's dump (keys in
// std::map order, no spaces), without building a json tree. Most reports are such (an HTTP
// completion stores one per request), so only the others pay for the tree.
std::optional<std::string> plain_json(const ExecutionReport& report) {
  if (!plain(report.operation) || !plain(report.metadata) ||
      (report.fallback_source && !plain(*report.fallback_source))) {
    return std::nullopt;
  }
  for (const auto& attempt : report.attempts) {
    if (!plain(attempt.source) || !plain(attempt.error_type) || !plain(attempt.error_message) ||
        !plain(attempt.metadata)) {
      return std::nullopt;
    }
  }
  std::string out;
  out.reserve(256 + 256 * report.attempts.size());
  out.append("{\"attempts\":[");
  bool first = true;
  for (const auto& attempt : report.attempts) {
    if (!first) out.push_back(',');
    first = false;
    out.append("{\"duration_ns\":");
    out.append(std::to_string(attempt.duration.count()));
    out.append(",\"error_message\":");
    put_string(out, attempt.error_message);
    out.append(",\"error_type\":");
    put_string(out, attempt.error_type);
    out.append(",\"metadata\":");
    put_map(out, attempt.metadata);
    out.append(",\"number\":");
    out.append(std::to_string(attempt.number));
    out.append(",\"retryable\":");
    out.append(attempt.retryable ? "true" : "false");
    out.append(",\"source\":");
    put_string(out, attempt.source);
    out.append(",\"started_at\":");
    put_string(out, detail::format_iso8601(attempt.started_at));
    out.append(",\"status\":");
    put_string(out, to_string(attempt.status));
    out.push_back('}');
  }
  out.append("],\"duration_ns\":");
  out.append(std::to_string(report.duration.count()));
  out.append(",\"fallback_source\":");
  if (report.fallback_source) {
    put_string(out, *report.fallback_source);
  } else {
    out.append("null");
  }
  out.append(",\"fallback_used\":");
  out.append(report.fallback_used ? "true" : "false");
  out.append(",\"metadata\":");
  put_map(out, report.metadata);
  out.append(",\"operation\":");
  put_string(out, report.operation);
  out.append(",\"started_at\":");
  put_string(out, detail::format_iso8601(report.started_at));
  out.append(",\"status\":");
  put_string(out, to_string(report.status));
  out.push_back('}');
  return out;
}

// The reader of plain_json()'s exact bytes: a report idem wrote itself, with nothing to unescape,
// decodes without building a json tree (a replay decodes the stored report on every call). Any
// byte the writer would not have produced (whitespace, an escape, another key order, a
// duplicate or unsorted metadata key, a non-canonical number) makes it give up, and from_json()
// parses the text with nlohmann, which also phrases every error. So both paths accept the same
// reports and return the same values: the unit tests and the report fuzzer compare them.
class PlainReader {
 public:
  explicit PlainReader(std::string_view text) noexcept : text_(text) {}

  std::optional<ExecutionReport> report() {
    ExecutionReport report;
    if (!literal("{\"attempts\":[")) return std::nullopt;
    if (!literal("]")) {
      do {
        AttemptRecord attempt;
        if (!this->attempt(attempt)) return std::nullopt;
        report.attempts.push_back(std::move(attempt));
      } while (literal(","));
      if (!literal("]")) return std::nullopt;
    }
    if (!literal(",\"duration_ns\":") || !nanos(report.duration)) return std::nullopt;
    if (!literal(",\"fallback_source\":")) return std::nullopt;
    if (!literal("null")) {
      std::string source;
      if (!quoted_copy(source)) return std::nullopt;
      report.fallback_source = std::move(source);
    }
    if (!literal(",\"fallback_used\":") || !boolean(report.fallback_used) ||
        !literal(",\"metadata\":") || !map(report.metadata) || !literal(",\"operation\":") ||
        !quoted_copy(report.operation) || !literal(",\"started_at\":") ||
        !time(report.started_at) || !literal(",\"status\":") || !operation_status(report.status) ||
        !literal("}") || !text_.empty()) {
      return std::nullopt;
    }
    return report;
  }

 private:
  bool attempt(AttemptRecord& attempt) {
    return literal("{\"duration_ns\":") && nanos(attempt.duration) &&
           literal(",\"error_message\":") && quoted_copy(attempt.error_message) &&
           literal(",\"error_type\":") && quoted_copy(attempt.error_type) &&
           literal(",\"metadata\":") && map(attempt.metadata) && literal(",\"number\":") &&
           integer(attempt.number) && literal(",\"retryable\":") && boolean(attempt.retryable) &&
           literal(",\"source\":") && quoted_copy(attempt.source) && literal(",\"started_at\":") &&
           time(attempt.started_at) && literal(",\"status\":") && attempt_status(attempt.status) &&
           literal("}");
  }

  bool literal(std::string_view expected) noexcept {
    if (!text_.starts_with(expected)) return false;
    text_.remove_prefix(expected.size());
    return true;
  }

  // A string of plain() text: no escape to undo, nothing to check for UTF-8.
  bool quoted(std::string_view& out) noexcept {
    if (!literal("\"")) return false;
    for (std::size_t i = 0; i < text_.size(); ++i) {
      const char c = text_[i];
      if (c == '"') {
        out = text_.substr(0, i);
        text_.remove_prefix(i + 1);
        return true;
      }
      if (c < 0x20 || c > 0x7e || c == '\\') return false;
    }
    return false;
  }

  bool quoted_copy(std::string& out) {
    std::string_view view;
    if (!quoted(view)) return false;
    out.assign(view);
    return true;
  }

  // Keys strictly increasing, as std::map writes them (a JSON duplicate is left to nlohmann).
  bool map(std::map<std::string, std::string>& out) {
    if (!literal("{")) return false;
    if (literal("}")) return true;
    std::string_view previous;
    do {
      std::string_view name;
      std::string_view value;
      if (!quoted(name) || (!out.empty() && name <= previous) || !literal(":") || !quoted(value)) {
        return false;
      }
      out.emplace_hint(out.end(), std::string(name), std::string(value));
      previous = name;
    } while (literal(","));
    return literal("}");
  }

  // std::to_string's form only: no leading zero, no "-0" (a fraction or an exponent fails the
  // literal that follows).
  template <typename Int>
  bool integer(Int& out) noexcept {
    const std::size_t at = text_.starts_with('-') ? 1 : 0;
    if (text_.size() <= at || text_[at] < '0' || text_[at] > '9') return false;
    if (text_[at] == '0' && (at == 1 || (text_.size() > 1 && text_[1] >= '0' && text_[1] <= '9'))) {
      return false;
    }
    const auto [end, error] = std::from_chars(text_.data(), text_.data() + text_.size(), out);
    if (error != std::errc{}) return false;
    text_.remove_prefix(static_cast<std::size_t>(end - text_.data()));
    return true;
  }

  bool nanos(std::chrono::nanoseconds& out) noexcept {
    std::int64_t count = 0;
    if (!integer(count)) return false;
    out = std::chrono::nanoseconds(count);
    return true;
  }

  bool boolean(bool& out) noexcept {
    if (literal("true")) {
      out = true;
      return true;
    }
    if (literal("false")) {
      out = false;
      return true;
    }
    return false;
  }

  bool time(WallTime& out) {
    std::string_view text;
    if (!quoted(text)) return false;
    const auto parsed = detail::parse_iso8601(text);
    if (!parsed) return false;
    out = *parsed;
    return true;
  }

  bool operation_status(OperationStatus& out) noexcept {
    std::string_view text;
    if (!quoted(text)) return false;
    const auto status = operation_status_named(text);
    if (status) out = *status;
    return status.has_value();
  }

  bool attempt_status(AttemptStatus& out) noexcept {
    std::string_view text;
    if (!quoted(text)) return false;
    const auto status = attempt_status_named(text);
    if (status) out = *status;
    return status.has_value();
  }

  std::string_view text_;
};

}  // namespace

std::string ExecutionReport::to_json() const {
  if (std::optional<std::string> fast = plain_json(*this)) return std::move(*fast);
  json attempts_json = json::array();
  for (const auto& attempt : attempts) {
    attempts_json.push_back({{"number", attempt.number},
                             {"source", attempt.source},
                             {"status", to_string(attempt.status)},
                             {"started_at", detail::format_iso8601(attempt.started_at)},
                             {"duration_ns", attempt.duration.count()},
                             {"error_type", attempt.error_type},
                             {"error_message", attempt.error_message},
                             {"retryable", attempt.retryable},
                             {"metadata", attempt.metadata}});
  }
  json out = {{"operation", operation},
              {"status", to_string(status)},
              {"started_at", detail::format_iso8601(started_at)},
              {"duration_ns", duration.count()},
              {"attempts", std::move(attempts_json)},
              {"fallback_used", fallback_used},
              {"fallback_source", fallback_source ? json(*fallback_source) : json(nullptr)},
              {"metadata", metadata}};
  // Replace invalid UTF-8 (an exception message may carry any bytes) instead of throwing.
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

ExecutionReport ExecutionReport::from_json(std::string_view text) {
  if (std::optional<ExecutionReport> fast = PlainReader(text).report()) return std::move(*fast);
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    throw DecodeError(std::string("execution report is not valid JSON: ") + e.what());
  }
  if (!root.is_object()) throw DecodeError("execution report: expected a JSON object");
  using T = json::value_t;
  ExecutionReport report;
  report.operation = field(root, "operation", T::string, "report").get<std::string>();
  report.status =
      operation_status_from(field(root, "status", T::string, "report").get<std::string>());
  const auto started = field(root, "started_at", T::string, "report").get<std::string>();
  const auto parsed = detail::parse_iso8601(started);
  if (!parsed) {
    throw DecodeError("execution report: started_at '" + started + "' is not ISO-8601 UTC");
  }
  report.started_at = *parsed;
  report.duration =
      nanos_from(field(root, "duration_ns", T::number_integer, "report"), "duration_ns");
  for (const auto& item : field(root, "attempts", T::array, "report")) {
    if (!item.is_object()) throw DecodeError("execution report: an attempt is not an object");
    AttemptRecord attempt;
    attempt.number = field(item, "number", T::number_integer, "attempt").get<int>();
    attempt.source = field(item, "source", T::string, "attempt").get<std::string>();
    attempt.status =
        attempt_status_from(field(item, "status", T::string, "attempt").get<std::string>());
    attempt.duration =
        nanos_from(field(item, "duration_ns", T::number_integer, "attempt"), "duration_ns");
    attempt.error_type = field(item, "error_type", T::string, "attempt").get<std::string>();
    attempt.error_message = field(item, "error_message", T::string, "attempt").get<std::string>();
    attempt.retryable = field(item, "retryable", T::boolean, "attempt").get<bool>();
    // Reports stored before attempts had these carry neither; both stay optional.
    if (const auto at = item.find("started_at"); at != item.end()) {
      if (!at->is_string()) throw DecodeError("execution report: attempt started_at not a string");
      const auto when = detail::parse_iso8601(at->get<std::string>());
      if (!when) throw DecodeError("execution report: attempt started_at is not ISO-8601 UTC");
      attempt.started_at = *when;
    }
    if (const auto meta = item.find("metadata"); meta != item.end()) {
      if (!meta->is_object()) throw DecodeError("execution report: attempt metadata not an object");
      attempt.metadata = string_map(*meta, "attempt");
    }
    report.attempts.push_back(std::move(attempt));
  }
  report.fallback_used = field(root, "fallback_used", T::boolean, "report").get<bool>();
  const auto source = root.find("fallback_source");
  if (source != root.end() && !source->is_null()) {
    if (!source->is_string()) throw DecodeError("execution report: fallback_source not a string");
    report.fallback_source = source->get<std::string>();
  }
  report.metadata = string_map(field(root, "metadata", T::object, "report"), "report");
  return report;
}

}  // namespace idem
