#include "idem/event.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.hpp"
#include "idem/key.hpp"

namespace {

TEST(NewEventId, IsUuid4AsLowercaseHex) {
  for (int i = 0; i < 1000; ++i) {
    const std::string id = idem::new_event_id();
    ASSERT_EQ(id.size(), 32u);
    ASSERT_TRUE(idem::is_uuid4_hex(id)) << id;
  }
}

TEST(NewEventId, UniqueAcrossThreads) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
  std::vector<std::vector<std::string>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i)
        ids[t].push_back(idem::new_event_id());
    });
  }
  for (auto& th : threads)
    th.join();
  std::set<std::string> all;
  for (auto& v : ids)
    all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), static_cast<std::size_t>(kThreads * kPerThread));
}

TEST(IsUuid4Hex, RejectsOtherShapes) {
  EXPECT_FALSE(idem::is_uuid4_hex(""));
  EXPECT_FALSE(idem::is_uuid4_hex("3F2B8C0E9D4A4F6B8E1C2D3A4B5C6D7E"));  // uppercase
  EXPECT_FALSE(idem::is_uuid4_hex("3f2b8c0e-9d4a-4f6b-8e1c-2d3a4b5c6d7e"));
  EXPECT_FALSE(idem::is_uuid4_hex("3f2b8c0e9d4a1f6b8e1c2d3a4b5c6d7e"));  // version 1
  EXPECT_TRUE(idem::is_uuid4_hex("3f2b8c0e9d4a4f6b8e1c2d3a4b5c6d7e"));
}

TEST(Event, MakeFillsIdAndTimestamp) {
  const auto event = idem::Event::make("order.created", R"({"id":1})", {{"trace", "t1"}});
  EXPECT_TRUE(idem::is_uuid4_hex(event.id));
  EXPECT_EQ(event.type, "order.created");
  EXPECT_EQ(event.headers.at("trace"), "t1");
  EXPECT_NE(event.timestamp.time_since_epoch().count(), 0);
}

TEST(ValidateKey, RejectsBadKeysWithClearMessages) {
  try {
    idem::validate_key("consumer", "");
    FAIL();
  } catch (const idem::InvalidKey& e) {
    EXPECT_EQ(e.code(), idem::ErrorCode::invalid_key);
    EXPECT_NE(std::string(e.what()).find("consumer is empty"), std::string::npos) << e.what();
  }
  EXPECT_THROW(idem::validate_key("event id", "   "), idem::InvalidKey);
  EXPECT_THROW(idem::validate_key("event id", std::string("a\0b", 3)), idem::InvalidKey);
  EXPECT_THROW(idem::validate_key("event id", "a\nb"), idem::InvalidKey);
  EXPECT_THROW(idem::validate_key("event id", std::string(256, 'x')), idem::InvalidKey);
  EXPECT_NO_THROW(idem::validate_key("event id", std::string(255, 'x')));
  EXPECT_NO_THROW(idem::validate_key("key", "payment:'; DROP TABLE x;--"));
  EXPECT_NO_THROW(idem::validate_key("key", "zahlung:\xc3\xbc"));
}

// The scan reads 16 bytes at a time with an overlapping tail: every length, and a bad byte at
// every position of it, must be found, as must a key of spaces of any length.
TEST(ValidateKey, FindsABadByteAtEveryPositionOfEveryLength) {
  const unsigned char bad_bytes[] = {0x00, 0x01, 0x09, 0x0a, 0x1f, 0x7f};
  for (std::size_t length = 1; length <= idem::kMaxKeyLength; ++length) {
    std::string key(length, 'k');
    ASSERT_TRUE(idem::is_valid_key(key)) << length;
    ASSERT_FALSE(idem::is_valid_key(std::string(length, ' '))) << length;
    std::string one_letter(length, ' ');
    one_letter[length - 1] = 'k';
    ASSERT_TRUE(idem::is_valid_key(one_letter)) << length;
    one_letter[length - 1] = ' ';
    one_letter[0] = 'k';
    ASSERT_TRUE(idem::is_valid_key(one_letter)) << length;
    for (std::size_t at = 0; at < length; ++at) {
      for (const unsigned char bad : bad_bytes) {
        key[at] = static_cast<char>(bad);
        ASSERT_FALSE(idem::is_valid_key(key))
            << "length " << length << ", byte " << int{bad} << " at " << at;
      }
      key[at] = static_cast<char>(0x20 + at % 0x5f);  // every printable byte, some of them spaces
      ASSERT_TRUE(idem::is_valid_key(key) || key.find_first_not_of(' ') == std::string::npos);
      key[at] = static_cast<char>(0x80 | at);  // UTF-8 bytes are allowed
      ASSERT_TRUE(idem::is_valid_key(key)) << length << " " << at;
      key[at] = 'k';
    }
  }
}

TEST(Error, CarriesCodeAndFlags) {
  const idem::AlreadyInProgress e("busy");
  EXPECT_TRUE(e.retryable());
  EXPECT_FALSE(e.in_doubt());
  EXPECT_EQ(e.code_name(), "already_in_progress");
  const idem::StoreError s("commit outcome unknown", true, true);
  EXPECT_TRUE(s.in_doubt());
}

}  // namespace
