// Stored records as the Redis store reads them back: a string of arbitrary bytes (the layout the
// store writes, RecordText: decode_record_text and the header counts() reads), or a reply of
// arbitrary shape and contents (the hash of an older idem that HGETALL returns, with fields idem
// knows, fields it does not, values of any bytes) decoded by RecordDecoder. A hash idem did not
// write must give a classified StoreError (store_corrupt_record), never a crash, and never a
// completed record without the report it is replayed with.
#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"
#include "record_decoder.hpp"

namespace {

using idem::redis::RedisReply;

constexpr std::array<const char*, 9> kFields{"state",       "token",        "fingerprint",
                                             "lease_until", "completed_at", "expires_at",
                                             "value",       "report",       "took_over"};
constexpr std::array<const char*, 6> kValues{
    "in_progress",
    "completed",
    "1",
    "1764504000000",
    "-9223372036854775808",
    R"({"operation":"op","status":"succeeded","started_at":"2026-11-30T12:00:00Z",)"
    R"("duration_ns":1,"attempts":[],"fallback_used":false,"fallback_source":null,"metadata":{}})"};

RedisReply element(FuzzedDataProvider& in, int depth) {
  RedisReply reply;
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0:
      reply.type = RedisReply::Type::nil;
      break;
    case 1:
      reply.type = RedisReply::Type::integer;
      reply.integer = in.ConsumeIntegral<long long>();
      break;
    case 2:
      if (depth < 2) {
        reply.type = RedisReply::Type::array;
        const int n = in.ConsumeIntegralInRange<int>(0, 4);
        for (int i = 0; i < n; ++i)
          reply.elements.push_back(element(in, depth + 1));
        break;
      }
      [[fallthrough]];
    case 3:
    case 4:
      reply.type = RedisReply::Type::string;
      reply.str = kFields[in.ConsumeIntegralInRange<std::size_t>(0, kFields.size() - 1)];
      break;
    case 5:
    case 6:
      reply.type = RedisReply::Type::string;
      reply.str = kValues[in.ConsumeIntegralInRange<std::size_t>(0, kValues.size() - 1)];
      break;
    default:
      reply.type = RedisReply::Type::string;
      reply.str = in.ConsumeRandomLengthString(128);
      break;
  }
  return reply;
}

// A string record: mostly well-formed pieces in the layout's order, some of any bytes.
std::string record_text(FuzzedDataProvider& in) {
  std::string text = in.ConsumeBool() ? "1c " : "1i ";
  const int parts = in.ConsumeIntegralInRange<int>(0, 8);
  for (int i = 0; i < parts; ++i) {
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        text += std::to_string(in.ConsumeIntegral<long long>()) + ' ';
        break;
      case 1:
        text += std::to_string(in.ConsumeIntegralInRange<int>(0, 300)) + ' ';
        break;
      case 2:
        text += kValues[in.ConsumeIntegralInRange<std::size_t>(0, kValues.size() - 1)];
        break;
      default:
        text += in.ConsumeRandomLengthString(64);
        break;
    }
  }
  return text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeIntegralInRange<int>(0, 1) == 0) {
    const std::string text =
        in.ConsumeBool() ? record_text(in) : in.ConsumeRemainingBytesAsString();
    (void)idem::redis::detail::RecordText::header(text);
    idem::fuzz::expect_only_idem_errors("redis decode_record_text", [&] {
      const idem::IdempotencyRecord record =
          idem::redis::detail::decode_record_text("k", "idem:s:{k}", text);
      using State = idem::IdempotencyRecord::State;
      if (record.state == State::completed && !record.report) {
        idem::fuzz::fail("a completed record decoded without its report");
      }
    });
    return 0;
  }
  RedisReply hash;
  hash.type = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? RedisReply::Type::status
                                                         : RedisReply::Type::array;
  const int elements = in.ConsumeIntegralInRange<int>(0, 24);
  for (int i = 0; i < elements; ++i)
    hash.elements.push_back(element(in, 1));

  idem::fuzz::expect_only_idem_errors("redis RecordDecoder", [&] {
    const idem::IdempotencyRecord record =
        idem::redis::detail::RecordDecoder("k", "idem:rec:k", hash).decode();
    using State = idem::IdempotencyRecord::State;
    if (record.state == State::completed && !record.report) {
      idem::fuzz::fail("a completed record decoded without its report");
    }
  });
  return 0;
}
