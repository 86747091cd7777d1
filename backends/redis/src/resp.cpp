#include "resp.hpp"

#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include <charconv>
#include <new>

namespace idem::redis::detail {
namespace {

void append_decimal(std::string& out, std::size_t value) {
  char buffer[24];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, end);
}

RedisReply convert(const redisReply* raw) {
  RedisReply reply;
  switch (raw->type) {
    case REDIS_REPLY_STATUS:
      reply.type = RedisReply::Type::status;
      reply.str.assign(raw->str, raw->len);
      break;
    case REDIS_REPLY_ERROR:
      reply.type = RedisReply::Type::error;
      reply.str.assign(raw->str, raw->len);
      break;
    case REDIS_REPLY_STRING:
      reply.type = RedisReply::Type::string;
      reply.str.assign(raw->str, raw->len);
      break;
    case REDIS_REPLY_INTEGER:
      reply.type = RedisReply::Type::integer;
      reply.integer = raw->integer;
      break;
    case REDIS_REPLY_ARRAY:
      reply.type = RedisReply::Type::array;
      reply.elements.reserve(raw->elements);
      for (std::size_t i = 0; i < raw->elements; ++i)
        reply.elements.push_back(convert(raw->element[i]));
      break;
    default:  // REDIS_REPLY_NIL
      reply.type = RedisReply::Type::nil;
      break;
  }
  return reply;
}

}  // namespace

void append_command(std::string& out, std::span<const std::string_view> args) {
  out += '*';
  append_decimal(out, args.size());
  out += "\r\n";
  for (std::string_view arg : args) {
    out += '$';
    append_decimal(out, arg.size());
    out += "\r\n";
    out.append(arg);
    out += "\r\n";
  }
}

ReplyReader::ReplyReader() : reader_(redisReaderCreate()) {
  if (reader_ == nullptr) throw std::bad_alloc();
}

ReplyReader::~ReplyReader() {
  redisReaderFree(reader_);
}

void ReplyReader::feed(const char* data, std::size_t size) {
  if (redisReaderFeed(reader_, data, size) != REDIS_OK) {
    throw ProtocolError(reader_->errstr[0] != '\0' ? reader_->errstr : "cannot buffer the reply");
  }
}

std::optional<RedisReply> ReplyReader::next() {
  void* raw = nullptr;
  if (redisReaderGetReply(reader_, &raw) != REDIS_OK) {
    throw ProtocolError(reader_->errstr[0] != '\0' ? reader_->errstr : "protocol error");
  }
  if (raw == nullptr) return std::nullopt;
  RedisReply reply = convert(static_cast<const redisReply*>(raw));
  freeReplyObject(raw);
  return reply;
}

}  // namespace idem::redis::detail
