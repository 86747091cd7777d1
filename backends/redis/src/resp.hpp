// RESP for both faces of the Redis backend (not installed): commands are encoded here, replies
// are parsed by hiredis's redisReader and copied into RedisReply. hiredis does no I/O for idem:
// the bytes travel over idem::net::Stream.
//
// Thread safety: a ReplyReader belongs to one connection (one thread or strand at a time).
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "idem/redis/connection_pool.hpp"

struct redisReader;  // hiredis

namespace idem::redis::detail {

// Appends one command (a RESP array of bulk strings) to `out`.
void append_command(std::string& out, std::span<const std::string_view> args);

// The parser of one connection's reply stream.
class ReplyReader {
 public:
  ReplyReader();
  ~ReplyReader();
  ReplyReader(const ReplyReader&) = delete;
  ReplyReader& operator=(const ReplyReader&) = delete;

  // Hands bytes read from the stream to the parser. Throws ProtocolError when it cannot take
  // them.
  void feed(const char* data, std::size_t size);
  // The next complete reply, or nullopt when more bytes are needed. Throws ProtocolError on
  // bytes that are not RESP (the connection must be dropped: it is out of sync).
  std::optional<RedisReply> next();

 private:
  redisReader* reader_ = nullptr;
};

// A reply stream that is not RESP; what() is hiredis's text.
struct ProtocolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace idem::redis::detail
