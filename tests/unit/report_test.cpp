#include "idem/report.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "idem/error.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;
using idem::AttemptRecord;
using idem::AttemptStatus;
using idem::ExecutionReport;
using idem::OperationStatus;
using nlohmann::json;

ExecutionReport sample() {
  ExecutionReport report;
  report.operation = "create_payment";
  report.status = OperationStatus::succeeded;
  // 2030-01-02T03:04:05.123456789Z
  report.started_at = idem::WallTime(std::chrono::seconds(1893553445) + 123456789ns);
  report.duration = 1234567890ns;
  report.attempts.push_back(
      AttemptRecord{.number = 1,
                    .source = "primary",
                    .status = AttemptStatus::timed_out,
                    .started_at = report.started_at,
                    .duration = 1000000000ns,
                    .error_type = "idem::TimeoutError",
                    .error_message = "attempt 1 exceeded \"10s\"\n",
                    .retryable = true,
                    .metadata = {{"timeout_seconds", "10"}, {"attempt_stopped", "false"}}});
  report.attempts.push_back(AttemptRecord{.number = 2,
                                          .source = "fallback:cache",
                                          .status = AttemptStatus::succeeded,
                                          .duration = 5ns,
                                          .error_type = "",
                                          .error_message = "",
                                          .retryable = false,
                                          .metadata = {}});
  report.fallback_used = true;
  report.fallback_source = "fallback:cache";
  report.metadata = {{"idempotency_key", "pay:ü€"}, {"idempotency_status", "executed"}};
  return report;
}

void expect_equal(const ExecutionReport& a, const ExecutionReport& b) {
  EXPECT_EQ(a.operation, b.operation);
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.started_at, b.started_at);
  EXPECT_EQ(a.duration, b.duration);
  ASSERT_EQ(a.attempts.size(), b.attempts.size());
  for (std::size_t i = 0; i < a.attempts.size(); ++i) {
    EXPECT_EQ(a.attempts[i].number, b.attempts[i].number);
    EXPECT_EQ(a.attempts[i].source, b.attempts[i].source);
    EXPECT_EQ(a.attempts[i].status, b.attempts[i].status);
    EXPECT_EQ(a.attempts[i].duration, b.attempts[i].duration);
    EXPECT_EQ(a.attempts[i].error_type, b.attempts[i].error_type);
    EXPECT_EQ(a.attempts[i].error_message, b.attempts[i].error_message);
    EXPECT_EQ(a.attempts[i].retryable, b.attempts[i].retryable);
    EXPECT_EQ(a.attempts[i].started_at, b.attempts[i].started_at);
    EXPECT_EQ(a.attempts[i].metadata, b.attempts[i].metadata);
  }
  EXPECT_EQ(a.fallback_used, b.fallback_used);
  EXPECT_EQ(a.fallback_source, b.fallback_source);
  EXPECT_EQ(a.metadata, b.metadata);
}

TEST(ExecutionReport, ToJsonHasEveryField) {
  const json out = json::parse(sample().to_json());
  EXPECT_EQ(out["operation"], "create_payment");
  EXPECT_EQ(out["status"], "succeeded");
  EXPECT_EQ(out["started_at"], "2030-01-02T03:04:05.123456789Z");
  EXPECT_EQ(out["duration_ns"], 1234567890);
  ASSERT_EQ(out["attempts"].size(), 2u);
  const auto& first = out["attempts"][0];
  EXPECT_EQ(first["number"], 1);
  EXPECT_EQ(first["source"], "primary");
  EXPECT_EQ(first["status"], "timed_out");
  EXPECT_EQ(first["duration_ns"], 1000000000);
  EXPECT_EQ(first["error_type"], "idem::TimeoutError");
  EXPECT_EQ(first["error_message"], "attempt 1 exceeded \"10s\"\n");
  EXPECT_EQ(first["retryable"], true);
  EXPECT_EQ(first["started_at"], "2030-01-02T03:04:05.123456789Z");
  EXPECT_EQ(first["metadata"]["timeout_seconds"], "10");
  EXPECT_EQ(out["fallback_used"], true);
  EXPECT_EQ(out["fallback_source"], "fallback:cache");
  EXPECT_EQ(out["metadata"]["idempotency_status"], "executed");
}

TEST(ExecutionReport, ReportsStoredBeforeAttemptDetailsStillDecode) {
  json doc = json::parse(sample().to_json());
  for (auto& attempt : doc["attempts"]) {
    attempt.erase("started_at");
    attempt.erase("metadata");
  }
  const auto parsed = ExecutionReport::from_json(doc.dump());
  EXPECT_EQ(parsed.attempts[0].started_at, idem::WallTime{});
  EXPECT_TRUE(parsed.attempts[0].metadata.empty());
}

TEST(ExecutionReport, NewStatusesAndHelpers) {
  for (auto status : {OperationStatus::timed_out, OperationStatus::cancelled}) {
    ExecutionReport report;
    report.status = status;
    EXPECT_EQ(ExecutionReport::from_json(report.to_json()).status, status);
  }
  ExecutionReport report = sample();
  EXPECT_EQ(report.attempt_count(), 2);
  EXPECT_EQ(report.retry_count(), 0) << "the second attempt is a fallback";
  EXPECT_FALSE(report.retried());
  ASSERT_NE(report.last_error(), nullptr);
  EXPECT_EQ(report.last_error()->number, 1);
  EXPECT_EQ(idem::to_string(AttemptStatus::cancelled), "cancelled");
}

TEST(ExecutionReport, RoundTripIsExact) {
  const auto original = sample();
  const auto parsed = ExecutionReport::from_json(original.to_json());
  expect_equal(original, parsed);
  EXPECT_EQ(parsed.to_json(), original.to_json());
}

TEST(ExecutionReport, RoundTripOfAnEmptyReportAndOldTimes) {
  ExecutionReport report;  // epoch, no attempts, no fallback
  auto parsed = ExecutionReport::from_json(report.to_json());
  expect_equal(report, parsed);
  EXPECT_EQ(json::parse(report.to_json())["started_at"], "1970-01-01T00:00:00.000000000Z");
  EXPECT_TRUE(json::parse(report.to_json())["fallback_source"].is_null());
  report.started_at = idem::WallTime(-1ns);  // just before the epoch
  EXPECT_EQ(json::parse(report.to_json())["started_at"], "1969-12-31T23:59:59.999999999Z");
  parsed = ExecutionReport::from_json(report.to_json());
  EXPECT_EQ(parsed.started_at, report.started_at);
}

TEST(ExecutionReport, FromJsonAcceptsShortFractionsAndOffsetZero) {
  json doc = json::parse(sample().to_json());
  doc["started_at"] = "2030-01-02T03:04:05.5+00:00";
  auto parsed = ExecutionReport::from_json(doc.dump());
  EXPECT_EQ(parsed.started_at, idem::WallTime(std::chrono::seconds(1893553445) + 500ms));
  doc["started_at"] = "2030-01-02T03:04:05Z";
  parsed = ExecutionReport::from_json(doc.dump());
  EXPECT_EQ(parsed.started_at, idem::WallTime(std::chrono::seconds(1893553445)));
}

TEST(ExecutionReport, FromJsonRejectsBadInputWithAClearError) {
  const json good = json::parse(sample().to_json());
  auto expect_decode_error = [](const std::string& text, const std::string& mention) {
    try {
      (void)ExecutionReport::from_json(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const idem::DecodeError& e) {
      EXPECT_NE(std::string(e.what()).find(mention), std::string::npos)
          << e.what() << " should mention " << mention;
    }
  };
  expect_decode_error("", "not valid JSON");
  expect_decode_error("{\"operation\":", "not valid JSON");
  expect_decode_error("[1,2]", "expected a JSON object");
  auto without = [&](const char* field) {
    json doc = good;
    doc.erase(field);
    return doc.dump();
  };
  expect_decode_error(without("operation"), "operation");
  expect_decode_error(without("attempts"), "attempts");
  expect_decode_error(without("metadata"), "metadata");
  auto with = [&](const char* field, json value) {
    json doc = good;
    doc[field] = std::move(value);
    return doc.dump();
  };
  expect_decode_error(with("status", "maybe"), "maybe");
  expect_decode_error(with("status", 3), "status");
  expect_decode_error(with("duration_ns", "12"), "duration_ns");
  expect_decode_error(with("duration_ns", 18446744073709551615ull), "out of range");
  expect_decode_error(with("started_at", "yesterday"), "started_at");
  expect_decode_error(with("started_at", "2030-02-30T00:00:00Z"), "started_at");
  expect_decode_error(with("started_at", "2030-01-01T24:00:00Z"), "started_at");
  expect_decode_error(with("started_at", "2030-01-01T00:00:00.1234567891Z"), "started_at");
  expect_decode_error(with("started_at", "2030-01-01T00:00:00+01:00"), "started_at");
  expect_decode_error(with("started_at", "9999-01-01T00:00:00Z"), "started_at");
  expect_decode_error(with("metadata", json{{"k", 1}}), "metadata 'k'");
  expect_decode_error(with("fallback_source", 5), "fallback_source");
  json bad_attempt = good;
  bad_attempt["attempts"][0]["status"] = "exploded";
  expect_decode_error(bad_attempt.dump(), "exploded");
  bad_attempt = good;
  bad_attempt["attempts"][1] = 5;
  expect_decode_error(bad_attempt.dump(), "not an object");
  bad_attempt = good;
  bad_attempt["attempts"][0].erase("retryable");
  expect_decode_error(bad_attempt.dump(), "retryable");
}

TEST(ExecutionReport, InvalidUtf8InMessagesDoesNotThrow) {
  auto report = sample();
  report.attempts[0].error_message = std::string("bad \xff\xfe bytes");
  const auto text = report.to_json();
  const auto parsed = ExecutionReport::from_json(text);
  EXPECT_NE(parsed.attempts[0].error_message.find("bad"), std::string::npos);
}

// from_json reads a report idem wrote itself (plain_json's bytes) without nlohmann; anything else
// goes through nlohmann. Both must return the same report: the same text indented (which only
// nlohmann reads) decodes to the same values.
ExecutionReport decoded_by_nlohmann(const std::string& text) {
  return ExecutionReport::from_json(json::parse(text).dump(1));
}

TEST(ExecutionReport, ThePlainReaderAndNlohmannAgree) {
  std::vector<ExecutionReport> reports;
  reports.emplace_back();  // the defaults: no attempts, empty maps
  auto plain = sample();
  plain.attempts[0].error_message = "attempt 1 exceeded 10s";
  plain.metadata = {{"", "empty name"}, {"idempotency_key", "pay:1"}, {"z", ""}};
  reports.push_back(plain);
  auto negative = plain;
  negative.duration = -5ns;
  negative.started_at = idem::WallTime(-1ns);
  negative.attempts[1].number = -2147483647 - 1;
  negative.attempts[1].duration =
      std::chrono::nanoseconds(std::numeric_limits<std::int64_t>::min());
  negative.fallback_source.reset();
  negative.status = OperationStatus::cancelled;
  negative.attempts[0].status = AttemptStatus::rejected;
  reports.push_back(negative);
  auto large = plain;
  large.duration = std::chrono::nanoseconds(std::numeric_limits<std::int64_t>::max());
  large.attempts[0].number = 2147483647;
  reports.push_back(large);
  for (const auto& report : reports) {
    const std::string text = report.to_json();
    SCOPED_TRACE(text);
    expect_equal(ExecutionReport::from_json(text), report);
    expect_equal(ExecutionReport::from_json(text), decoded_by_nlohmann(text));
  }
}

TEST(ExecutionReport, TextIdemWouldNotWriteIsLeftToNlohmann) {
  auto report = sample();
  report.attempts[0].error_message = "plain";
  report.metadata = {{"a", "1"}, {"b", "2"}};
  const std::string text = report.to_json();
  const auto replaced = [&](const std::string& from, const std::string& to) {
    std::string out = text;
    const auto at = out.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    out.replace(at, from.size(), to);
    return out;
  };
  // Accepted by nlohmann, each decodes as nlohmann decodes it.
  for (const std::string& variant :
       {replaced("\"duration_ns\":1234567890", "\"duration_ns\":-0"),
        replaced("\"metadata\":{\"a\":\"1\",\"b\":\"2\"}",
                 "\"metadata\":{\"b\":\"2\",\"a\":\"1\"}"),
        replaced("\"metadata\":{\"a\":\"1\",\"b\":\"2\"}",
                 "\"metadata\":{\"a\":\"1\",\"a\":\"2\"}"),
        replaced("\"operation\":\"create_payment\"", "\"operation\":\"create\\u005fpayment\""),
        replaced("\"operation\":\"create_payment\"", "\"operation\" : \"create_payment\""),
        "\n" + text + "\n"}) {
    SCOPED_TRACE(variant);
    expect_equal(ExecutionReport::from_json(variant), decoded_by_nlohmann(variant));
  }
  EXPECT_EQ(
      ExecutionReport::from_json(replaced("create_payment", "create\\u005fpayment")).operation,
      "create_payment");
  // Refused by nlohmann: still a DecodeError, not a value the plain reader made up.
  for (const std::string& variant :
       {replaced("\"duration_ns\":1234567890", "\"duration_ns\":01234567890"),
        replaced("\"duration_ns\":1234567890", "\"duration_ns\":1234567890."),
        replaced("\"duration_ns\":1234567890", "\"duration_ns\":12345678901234567890123"),
        replaced("\"status\":\"succeeded\"}", "\"status\":\"succeeded\""),
        replaced("\"status\":\"succeeded\"}", "\"status\":\"succeeded\"}}"),
        replaced("\"status\":\"succeeded\"}", "\"status\":\"done\"}"),
        text.substr(0, text.size() / 2)}) {
    SCOPED_TRACE(variant);
    EXPECT_THROW((void)ExecutionReport::from_json(variant), idem::DecodeError);
  }
}

TEST(ExecutionReport, StatusNames) {
  EXPECT_EQ(idem::to_string(AttemptStatus::succeeded), "succeeded");
  EXPECT_EQ(idem::to_string(AttemptStatus::failed), "failed");
  EXPECT_EQ(idem::to_string(AttemptStatus::timed_out), "timed_out");
  EXPECT_EQ(idem::to_string(AttemptStatus::rejected), "rejected");
  EXPECT_EQ(idem::to_string(OperationStatus::succeeded), "succeeded");
  EXPECT_EQ(idem::to_string(OperationStatus::failed), "failed");
}

// What a resilient operation records.
TEST(ExecutionReport, OperationFillsTheReport) {
  auto clock = std::make_shared<idem::testing::ManualClock>();
  int calls = 0;
  auto op = idem::resilient(
      [&](int x) {
        clock->advance(3ms);  // the attempt "takes" 3 ms on the manual clock
        if (++calls == 1) throw std::runtime_error("flaky");
        return x;
      },
      {.name = "echo", .retries = 1, .backoff = {.base = 10ms, .jitter = 0.0}, .clock = clock});
  const auto start = clock->wall_now();
  const auto result = op(5);
  const auto& report = result.report;
  EXPECT_EQ(report.operation, "echo");
  EXPECT_EQ(report.status, OperationStatus::succeeded);
  EXPECT_EQ(report.started_at, start);
  EXPECT_EQ(report.duration, 16ms);
  ASSERT_EQ(report.attempts.size(), 2u);
  EXPECT_EQ(report.attempts[0].number, 1);
  EXPECT_EQ(report.attempts[0].source, "primary");
  EXPECT_EQ(report.attempts[0].duration, 3ms);
  EXPECT_EQ(report.attempts[0].error_message, "flaky");
  EXPECT_TRUE(report.attempts[0].retryable);
  EXPECT_EQ(report.attempts[1].number, 2);
  EXPECT_EQ(report.attempts[1].duration, 3ms);
  EXPECT_TRUE(report.attempts[1].error_type.empty());
  // Only the always-present keys: no validation, no breaker rejection, no fallback, no rate
  // limit, no key.
  EXPECT_EQ(report.metadata,
            (std::map<std::string, std::string>{{"circuit_breaker_open", "false"},
                                                {"fallback_used", "false"},
                                                {"rate_limit_encountered", "false"},
                                                {"rate_limit_wait_exceeded", "false"},
                                                {"rate_limit_wait_seconds", "0"},
                                                {"rate_limited", "false"},
                                                {"validation_performed", "false"}}));
  expect_equal(report, ExecutionReport::from_json(report.to_json()));
}

}  // namespace
