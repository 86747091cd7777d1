// Internal: a Redis idempotency record (the hash HGETALL returns) decoded back into an
// IdempotencyRecord. Its own header so the record fuzzer (fuzz/redis_record_fuzzer.cpp) runs the
// very code the store runs on whatever bytes a hash may hold.
#pragma once

#include <charconv>
#include <cstdint>
#include <functional>
#include <map>
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
