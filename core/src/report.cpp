#include "idem/report.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>

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
  }
  return "unknown";
}

std::string_view to_string(OperationStatus status) noexcept {
  switch (status) {
    case OperationStatus::succeeded:
      return "succeeded";
    case OperationStatus::failed:
      return "failed";
  }
  return "unknown";
}

namespace {

using nlohmann::json;

AttemptStatus attempt_status_from(const std::string& text) {
  for (auto status : {AttemptStatus::succeeded, AttemptStatus::failed, AttemptStatus::timed_out,
                      AttemptStatus::rejected}) {
    if (to_string(status) == text) return status;
  }
  throw DecodeError("execution report: unknown attempt status '" + text + "'");
}

OperationStatus operation_status_from(const std::string& text) {
  if (text == "succeeded") return OperationStatus::succeeded;
  if (text == "failed") return OperationStatus::failed;
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

}  // namespace

std::string ExecutionReport::to_json() const {
  json attempts_json = json::array();
  for (const auto& attempt : attempts) {
    attempts_json.push_back({{"number", attempt.number},
                             {"source", attempt.source},
                             {"status", to_string(attempt.status)},
                             {"duration_ns", attempt.duration.count()},
                             {"error_type", attempt.error_type},
                             {"error_message", attempt.error_message},
                             {"retryable", attempt.retryable}});
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
    report.attempts.push_back(std::move(attempt));
  }
  report.fallback_used = field(root, "fallback_used", T::boolean, "report").get<bool>();
  const auto source = root.find("fallback_source");
  if (source != root.end() && !source->is_null()) {
    if (!source->is_string()) throw DecodeError("execution report: fallback_source not a string");
    report.fallback_source = source->get<std::string>();
  }
  for (const auto& [name, value] : field(root, "metadata", T::object, "report").items()) {
    if (!value.is_string()) {
      throw DecodeError("execution report: metadata '" + name + "' is not a string");
    }
    report.metadata.emplace(name, value.get<std::string>());
  }
  return report;
}

}  // namespace idem
