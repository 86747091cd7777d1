// Internal: a Redis idempotency record decoded back into an IdempotencyRecord — the one-string
// layout the store writes (RecordText; docs/redis.md §5) and the hash that idem wrote before it
// (RecordDecoder, read so that records of an older idem are still understood). Its own header so
// the record fuzzer (fuzz/redis_record_fuzzer.cpp) runs the very code the store runs on whatever
// bytes a key may hold.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "idem/error.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/redis/connection_pool.hpp"
#include "internal.hpp"

namespace idem::redis::detail {

inline constexpr std::string_view kInProgress = "in_progress";
inline constexpr std::string_view kCompleted = "completed";

// ---- the record as one string ------------------------------------------------------------
//
//   in progress  "1i <token> <lease_until> <fp>"
//   completed    "1c <token> <completed_at> <expires_at> <value size> <report size> "
//                "<value><report><lease_until> <fp>"
//
// Numbers are decimal (times in ms since the epoch, may be negative), <fp> is "-" when the claim
// had no fingerprint and "=" followed by the fingerprint's bytes otherwise; value and report are
// raw bytes of the sizes given. "1" is the layout's version. A completed record ends with the
// tail of the claim it completed ("<lease_until> <fp>"), which the complete script moves over
// unread, so only the fence "1i <token> " has to be known to change a claim.
struct RecordText {
  // "1i <token> ": what complete, release and renew compare the record's start with.
  static std::string fence(std::uint64_t token) { return "1i " + std::to_string(token) + ' '; }
  // The claim's text after its token: " <lease_until> <fp>" (the script writes
  // "1i " + token + this).
  static std::string claim_tail(std::int64_t lease_until, std::optional<std::string_view> fp) {
    std::string tail = ' ' + std::to_string(lease_until) + ' ';
    if (fp) {
      tail += '=';
      tail.append(*fp);
    } else {
      tail += '-';
    }
    return tail;
  }
  // A completed record up to the claim's tail.
  static std::string completed_head(std::uint64_t token, std::int64_t completed_at,
                                    std::int64_t expires_at, std::string_view value,
                                    std::string_view report) {
    std::string head = "1c " + std::to_string(token) + ' ' + std::to_string(completed_at) + ' ' +
                       std::to_string(expires_at) + ' ' + std::to_string(value.size()) + ' ' +
                       std::to_string(report.size()) + ' ';
    head.reserve(head.size() + value.size() + report.size());
    head.append(value);
    head.append(report);
    return head;
  }

  // What counts and the claim's first look need: the state and its deadline, without the value.
  struct Header {
    bool completed = false;
    std::uint64_t token = 0;
    std::int64_t deadline = 0;  // lease_until (in progress) or expires_at (completed)
  };
  // Parses the start of `text`; nullopt when it is not a record of this layout.
  static std::optional<Header> header(std::string_view text) {
    Header h;
    if (text.substr(0, 3) == "1i ") {
      text.remove_prefix(3);
      if (!take(text, h.token) || !take(text, h.deadline)) return std::nullopt;
      return h;
    }
    if (text.substr(0, 3) == "1c ") {
      text.remove_prefix(3);
      std::int64_t completed_at = 0;
      h.completed = true;
      if (!take(text, h.token) || !take(text, completed_at) || !take(text, h.deadline)) {
        return std::nullopt;
      }
      return h;
    }
    return std::nullopt;
  }

  // The number before the next ' ' of `text`, which is consumed with it.
  template <class T>
  static bool take(std::string_view& text, T& value) {
    const std::size_t end = text.find(' ');
    if (end == 0 || end == std::string_view::npos) return false;
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + end, value);
    if (ec != std::errc() || ptr != text.data() + end) return false;
    text.remove_prefix(end + 1);
    return true;
  }
};

// Decodes one string record (RecordText's layout), checking every part. Anything malformed is
// reported as store_corrupt_record naming the key, never guessed. `with_report` false leaves a
// completed record's report empty, unparsed (its size is still checked): a claim that replays
// only the value (AsyncStore::claim_without_report) saves the JSON parse.
inline IdempotencyRecord decode_record_text(std::string_view key, const std::string& redis_key,
                                            std::string_view text, bool with_report = true) {
  const auto corrupt = [&](const std::string& why) {
    throw StoreError(ErrorCode::store_corrupt_record,
                     "idem redis: the record of idempotency key '" + std::string(key) +
                         "' (redis key " + redis_key + ") is corrupt: " + why +
                         "; delete the key to reset it");
  };
  IdempotencyRecord record;
  record.key = std::string(key);
  std::string_view rest = text;
  const auto number = [&](auto& value, const char* name) {
    if (!RecordText::take(rest, value)) corrupt(std::string("its ") + name + " is not an integer");
  };
  std::int64_t lease_until = 0;
  if (rest.substr(0, 3) == "1i ") {
    rest.remove_prefix(3);
    record.state = IdempotencyRecord::State::in_progress;
    number(record.token, "token");
    number(lease_until, "lease_until");
  } else if (rest.substr(0, 3) == "1c ") {
    rest.remove_prefix(3);
    record.state = IdempotencyRecord::State::completed;
    std::int64_t completed_at = 0;
    std::int64_t expires_at = 0;
    std::size_t value_size = 0;
    std::size_t report_size = 0;
    number(record.token, "token");
    number(completed_at, "completed_at");
    number(expires_at, "expires_at");
    number(value_size, "value size");
    number(report_size, "report size");
    if (value_size > rest.size() || report_size > rest.size() - value_size) {
      corrupt("it is shorter than its value and report");
    }
    record.completed_at = from_ms(completed_at);
    record.expires_at = from_ms(expires_at);
    record.value.bytes = std::string(rest.substr(0, value_size));
    if (with_report) {
      try {
        record.report = ExecutionReport::from_json(rest.substr(value_size, report_size));
      } catch (const std::exception& e) {
        corrupt("its report is not a valid execution report (" + std::string(e.what()) + ")");
      }
    }
    rest.remove_prefix(value_size + report_size);
    number(lease_until, "lease_until");
  } else {
    corrupt("it is not an idem record (it starts with '" +
            std::string(text.substr(0, std::min<std::size_t>(text.size(), 8))) + "')");
  }
  record.lease_until = from_ms(lease_until);
  if (rest == "-") return record;
  if (rest.empty() || rest[0] != '=') corrupt("its fingerprint is neither '-' nor '=...'");
  record.fingerprint = std::string(rest.substr(1));
  return record;
}

// ---- the hash of an older idem -----------------------------------------------------------

// Turns a record hash (HGETALL's field/value list) back into an IdempotencyRecord, checking
// every field a state needs. Anything missing or malformed is reported, never guessed.
class RecordDecoder {
 public:
  RecordDecoder(std::string_view key, std::string redis_key, const RedisReply& fields)
      : key_(key), redis_key_(std::move(redis_key)) {
    if (fields.type != RedisReply::Type::array || fields.elements.size() % 2 != 0) {
      corrupt("it is not a hash of field/value pairs");
    }
    for (std::size_t i = 0; i + 1 < fields.elements.size(); i += 2)
      fields_[fields.elements[i].str] = &fields.elements[i + 1].str;
  }

  IdempotencyRecord decode() {
    IdempotencyRecord record;
    record.key = std::string(key_);
    const std::string& state = required("state");
    record.token = unsigned_field("token");
    if (const std::string* fingerprint = optional("fingerprint")) {
      record.fingerprint = *fingerprint;
    }
    if (state == kInProgress) {
      record.state = IdempotencyRecord::State::in_progress;
      record.lease_until = time_field("lease_until");
    } else if (state == kCompleted) {
      record.state = IdempotencyRecord::State::completed;
      if (optional("lease_until") != nullptr) record.lease_until = time_field("lease_until");
      record.completed_at = time_field("completed_at");
      record.expires_at = time_field("expires_at");
      record.value.bytes = required("value");
      const std::string& report = required("report");
      try {
        record.report = ExecutionReport::from_json(report);
      } catch (const std::exception& e) {
        corrupt("field 'report' is not a valid execution report (" + std::string(e.what()) + ")");
      }
    } else {
      corrupt("unknown state '" + state.substr(0, 40) + "'");
    }
    return record;
  }

 private:
  [[noreturn]] void corrupt(const std::string& why) const {
    throw StoreError(ErrorCode::store_corrupt_record,
                     "idem redis: the record of idempotency key '" + std::string(key_) +
                         "' (redis key " + redis_key_ + ") is corrupt: " + why +
                         "; delete the key to reset it");
  }
  const std::string* optional(const char* name) const {
    const auto it = fields_.find(name);
    return it == fields_.end() ? nullptr : it->second;
  }
  const std::string& required(const char* name) const {
    const std::string* value = optional(name);
    if (value == nullptr) corrupt("field '" + std::string(name) + "' is missing");
    return *value;
  }
  template <class T>
  T number(const char* name) const {
    const std::string& text = required(name);
    T value{};
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
      corrupt("field '" + std::string(name) + "' is not an integer ('" + text.substr(0, 40) + "')");
    }
    return value;
  }
  std::uint64_t unsigned_field(const char* name) const { return number<std::uint64_t>(name); }
  WallTime time_field(const char* name) const { return from_ms(number<std::int64_t>(name)); }

  std::string_view key_;
  std::string redis_key_;
  std::map<std::string, const std::string*, std::less<>> fields_;
};

}  // namespace idem::redis::detail
