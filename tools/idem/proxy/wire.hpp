// The HTTP/1.1 wire format of `idem proxy`, parsed and written by Boost.Beast (sans-I/O: bytes in,
// bytes out; the sockets are standalone Asio's). Nothing here includes Beast or Boost.Asio, so
// only wire.cpp pays for them.
//
//   RequestReader   the client's request: header first (limits, Expect: 100-continue, framing
//                   checks), then the body, de-chunked, up to a cap
//   ResponseReader  the upstream's response: the header, then the body in pieces (so a large
//                   one can be streamed), 1xx interim responses skipped
//   serialize_*     requests to the upstream (framing of our own: Content-Length) and responses
//                   to the client (Content-Length, chunked, or close-delimited)
//
// Framing is never copied from one side to the other: the proxy reads a whole request body and
// sends it with a Content-Length of its own, and drops every connection and framing field
// (idem::http::is_connection_field and the fields Connection names), so a request that two
// parsers could frame differently never reaches the upstream as such.
//
// Thread-safety: one reader per connection, used by one coroutine at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/http/message.hpp"

namespace idem::cli::proxy {

// A request the proxy answers itself because it cannot be parsed or is not allowed.
struct WireError {
  int status = 400;    // 400, 413, 431, 501 or 505
  std::string code;    // "bad-request", "body-too-large", "header-too-large", ...
  std::string detail;  // for the problem's detail
};

class RequestReader {
 public:
  enum class Step {
    need_more,  // feed more bytes
    header,     // the header is complete (once per request): inspect it, then feed the body
    complete,   // the whole request is read: take() it
    error,      // error() says why; answer it and close the connection
  };

  RequestReader(std::size_t max_header, std::size_t max_body);
  ~RequestReader();
  RequestReader(const RequestReader&) = delete;
  RequestReader& operator=(const RequestReader&) = delete;

  // Parses as much of `data` as it can; `used` says how many bytes it consumed (keep the rest for
  // the next call). Never throws.
  Step feed(std::string_view data, std::size_t& used);

  // After Step::header:
  bool expects_continue() const noexcept;               // Expect: 100-continue
  std::optional<std::uint64_t> content_length() const;  // nullopt: chunked or none
  bool keep_alive() const noexcept;  // what the client asked (version and Connection)
  int version() const noexcept;      // 10 or 11
  bool head() const noexcept;        // a HEAD request (its response has no body)

  // After Step::complete: the request (the reader is then ready for the next one).
  idem::http::Request take();
  // After Step::error.
  const WireError& error() const noexcept { return error_; }
  // The client closed the connection: error() is then set when a request was partly read.
  Step eof();
  // Whether any byte of a request has been consumed since the last take().
  bool started() const noexcept { return started_; }

 private:
  struct Parser;
  Step fail(int status, std::string code, std::string detail);
  Step check_header();

  std::size_t max_header_;
  std::size_t max_body_;
  std::unique_ptr<Parser> parser_;
  WireError error_;
  bool started_ = false;
  bool header_seen_ = false;
  std::size_t retry_at_ = 0;  // feed the parser again only with this many bytes (wire.cpp)
};

class ResponseReader {
 public:
  enum class Step {
    need_more,  // feed more bytes (or eof())
    header,     // the final response's header is complete (once): status(), headers()
    body,       // body bytes were appended (more may follow)
    complete,   // the response is complete
    error,      // the upstream's response is malformed: error()
  };

  // `head_request`: the request was HEAD (no body follows whatever the header says).
  ResponseReader(bool head_request, std::size_t max_header);
  ~ResponseReader();
  ResponseReader(const ResponseReader&) = delete;
  ResponseReader& operator=(const ResponseReader&) = delete;

  // Ready for the next response (of a HEAD request or not), as a reader just constructed.
  void reset(bool head_request);

  // Parses `data`; body bytes are appended to `body`. `used` as for RequestReader::feed.
  Step feed(std::string_view data, std::size_t& used, std::string& body);
  // The upstream closed the connection: complete for a close-delimited body, error otherwise.
  Step eof();

  int status() const noexcept { return status_; }
  const idem::http::Headers& headers() const noexcept { return headers_; }
  // The header's fields, moved out (headers() is then empty until reset()).
  idem::http::Headers take_headers() noexcept {
    idem::http::Headers out = std::move(headers_);
    headers_.clear();
    return out;
  }
  std::optional<std::uint64_t> content_length() const noexcept { return content_length_; }
  bool keep_alive() const noexcept;  // the upstream connection may be reused after this response
  bool header_done() const noexcept { return header_done_; }
  const std::string& error() const noexcept { return error_; }

 private:
  struct Parser;
  void restart();

  bool head_request_;
  std::size_t max_header_;
  std::unique_ptr<Parser> parser_;
  int status_ = 0;
  idem::http::Headers headers_;
  std::optional<std::uint64_t> content_length_;
  bool header_done_ = false;
  std::string error_;
  std::size_t retry_at_ = 0;
};

// The request to the upstream: `request` with its connection and framing fields dropped (and
// those its Connection field names, and Expect), Content-Length set from the body, and
// `extra` fields added. HTTP/1.1, keep-alive.
std::string serialize_request(const idem::http::Request& request, const idem::http::Headers& extra);

// How a response to the client is framed.
enum class Framing { length, chunked, close };

// A whole response: Content-Length framing (for a HEAD request `length` is announced and no body
// written), Connection: close unless keep_alive. HTTP/1.1.
std::string serialize_response(const idem::http::Response& response, bool keep_alive,
                               bool head_request = false);
// Only the header of a streamed response (its body follows in chunk() pieces, or raw).
std::string serialize_response_head(int status, const idem::http::Headers& headers, Framing framing,
                                    std::optional<std::uint64_t> length, bool keep_alive);
// One chunk of a chunked body (nothing for empty data), and the last chunk.
std::string chunk(std::string_view data);
std::string last_chunk();

// A problem+json response of the proxy's own (an upstream failure, a malformed request):
// {"type":"about:blank","title":<phrase>,"status":..,"detail":..,"code":..}.
idem::http::Response proxy_problem(int status, std::string_view code, std::string_view detail);

}  // namespace idem::cli::proxy
