#include "wire.hpp"

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/chunk_encode.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/optional.hpp>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace idem::cli::proxy {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

namespace {

// Boost 1.74's chunk parser, once it has seen the last chunk ("0\r\n") but not the end of the
// trailer, asserts that the next call brings at least 5 bytes (parse_chunk_header): a parser that
// consumed nothing of a non-empty input is called again only when at least this many wait (a
// chunked body that goes on always has them).
constexpr std::size_t kChunkRetryBytes = 5;

std::string_view view(beast::string_view text) noexcept {
  return {text.data(), text.size()};
}
beast::string_view bview(std::string_view text) noexcept {
  return {text.data(), text.size()};
}

// The comma-separated tokens of a field value (Connection: close, keep-alive, X-Foo).
std::vector<std::string_view> tokens(std::string_view value) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (start <= value.size()) {
    std::size_t end = value.find(',', start);
    if (end == std::string_view::npos) end = value.size();
    std::string_view token = value.substr(start, end - start);
    while (!token.empty() && (token.front() == ' ' || token.front() == '\t'))
      token.remove_prefix(1);
    while (!token.empty() && (token.back() == ' ' || token.back() == '\t'))
      token.remove_suffix(1);
    if (!token.empty()) out.push_back(token);
    start = end + 1;
  }
  return out;
}

// Serialises a message (sans-I/O: the serializer's buffers appended to a string).
template <bool IsRequest, class Body, class Fields>
std::string write_message(bhttp::message<IsRequest, Body, Fields>& message, bool header_only) {
  bhttp::serializer<IsRequest, Body, Fields> serializer(message);
  serializer.split(header_only);
  std::string out;
  beast::error_code ec;
  do {
    serializer.next(ec, [&](beast::error_code& next_ec, const auto& buffers) {
      next_ec = {};
      std::size_t size = 0;
      for (const auto buffer : beast::buffers_range_ref(buffers)) {
        out.append(static_cast<const char*>(buffer.data()), buffer.size());
        size += buffer.size();
      }
      serializer.consume(size);
    });
  } while (!ec && !(header_only ? serializer.is_header_done() : serializer.is_done()));
  return out;
}

template <class ConstBuffers>
std::string flatten(const ConstBuffers& buffers) {
  std::string out;
  for (const auto buffer : beast::buffers_range_ref(buffers)) {
    out.append(static_cast<const char*>(buffer.data()), buffer.size());
  }
  return out;
}

}  // namespace

// ---- requests ----------------------------------------------------------------------------------

struct RequestReader::Parser {
  std::optional<bhttp::request_parser<bhttp::string_body>> parser;
};

RequestReader::RequestReader(std::size_t max_header, std::size_t max_body)
    : max_header_(max_header), max_body_(max_body), parser_(std::make_unique<Parser>()) {
  parser_->parser.emplace();
  parser_->parser->header_limit(static_cast<std::uint32_t>(max_header_));
  parser_->parser->body_limit(max_body_);
}

RequestReader::~RequestReader() = default;

RequestReader::Step RequestReader::fail(int status, std::string code, std::string detail) {
  error_ = WireError{status, std::move(code), std::move(detail)};
  return Step::error;
}

RequestReader::Step RequestReader::check_header() {
  auto& parser = *parser_->parser;
  const auto& message = parser.get();
  if (message.version() != 11 && message.version() != 10) {
    return fail(505, "version-not-supported", "only HTTP/1.0 and HTTP/1.1 are served");
  }
  if (message.method() == bhttp::verb::connect) {
    return fail(501, "method-not-supported", "CONNECT is not supported by this reverse proxy");
  }
  std::size_t hosts = 0;
  for (const auto& field : message) {
    if (field.name() == bhttp::field::host) ++hosts;
  }
  if (hosts > 1 || (message.version() == 11 && hosts == 0)) {
    return fail(400, "bad-request", "an HTTP/1.1 request needs exactly one Host field");
  }
  if (message.count(bhttp::field::transfer_encoding) > 0 &&
      (message.version() == 10 || !parser.chunked())) {
    // RFC 9112 §6.3: without chunked as the final coding the body's length is unknown.
    return fail(400, "bad-request", "Transfer-Encoding must end with chunked");
  }
  return Step::header;
}

RequestReader::Step RequestReader::feed(std::string_view data, std::size_t& used) {
  used = 0;
  auto& parser = *parser_->parser;
  if (!data.empty()) started_ = true;
  beast::error_code ec;
  if (!header_seen_) {
    used = parser.put(boost::asio::buffer(data.data(), data.size()), ec);
    if (ec == bhttp::error::need_more) {
      if (!parser.is_header_done()) {
        if (data.size() >= max_header_) {
          return fail(431, "header-too-large", "the request header is too large");
        }
        return Step::need_more;
      }
      ec = {};
    }
    if (ec == bhttp::error::header_limit) {
      return fail(431, "header-too-large", "the request header is too large");
    }
    if (ec == bhttp::error::body_limit) {
      return fail(413, "body-too-large",
                  "the request body is larger than " + std::to_string(max_body_) + " bytes");
    }
    if (ec) return fail(400, "bad-request", "malformed request: " + ec.message());
    if (!parser.is_header_done()) return Step::need_more;
    header_seen_ = true;
    parser.eager(true);
    return check_header();
  }
  while (!parser.is_done() && used < data.size()) {
    const std::string_view rest = data.substr(used);
    if (rest.size() < retry_at_) break;
    const std::size_t n = parser.put(boost::asio::buffer(rest.data(), rest.size()), ec);
    used += n;
    retry_at_ = n == 0 ? std::max(kChunkRetryBytes, rest.size() + 1) : 0;
    if (ec == bhttp::error::need_more) break;
    if (ec == bhttp::error::body_limit) {
      return fail(413, "body-too-large",
                  "the request body is larger than " + std::to_string(max_body_) + " bytes");
    }
    if (ec) return fail(400, "bad-request", "malformed request body: " + ec.message());
    if (n == 0) break;
  }
  return parser.is_done() ? Step::complete : Step::need_more;
}

RequestReader::Step RequestReader::eof() {
  if (!started_) return Step::need_more;
  return fail(400, "bad-request", "the connection closed in the middle of a request");
}

bool RequestReader::expects_continue() const noexcept {
  const auto& message = parser_->parser->get();
  const auto expect = message.find(bhttp::field::expect);
  return expect != message.end() && beast::iequals(expect->value(), "100-continue");
}

std::optional<std::uint64_t> RequestReader::content_length() const {
  const boost::optional<std::uint64_t> length = parser_->parser->content_length();
  if (!length) return std::nullopt;
  return *length;
}

bool RequestReader::keep_alive() const noexcept {
  return parser_->parser->keep_alive();
}
int RequestReader::version() const noexcept {
  return static_cast<int>(parser_->parser->get().version());
}
bool RequestReader::head() const noexcept {
  return parser_->parser->get().method() == bhttp::verb::head;
}

idem::http::Request RequestReader::take() {
  auto& message = parser_->parser->get();
  idem::http::Request request;
  request.method = std::string(view(message.method_string()));
  request.target = std::string(view(message.target()));
  request.headers.reserve(16);
  for (const auto& field : message) {
    request.headers.push_back(
        {std::string(view(field.name_string())), std::string(view(field.value()))});
  }
  request.body = std::move(message.body());
  parser_->parser.emplace();
  parser_->parser->header_limit(static_cast<std::uint32_t>(max_header_));
  parser_->parser->body_limit(max_body_);
  header_seen_ = false;
  started_ = false;
  retry_at_ = 0;
  return request;
}

// ---- responses ---------------------------------------------------------------------------------

struct ResponseReader::Parser {
  std::optional<bhttp::response_parser<bhttp::buffer_body>> parser;
};

ResponseReader::ResponseReader(bool head_request, std::size_t max_header)
    : head_request_(head_request), max_header_(max_header), parser_(std::make_unique<Parser>()) {
  restart();
}

ResponseReader::~ResponseReader() = default;

void ResponseReader::reset(bool head_request) {
  head_request_ = head_request;
  status_ = 0;
  headers_.clear();
  content_length_.reset();
  header_done_ = false;
  error_.clear();
  restart();
}

void ResponseReader::restart() {
  parser_->parser.emplace();
  parser_->parser->header_limit(static_cast<std::uint32_t>(max_header_));
  // The proxy caps what it buffers itself. (Not boost::none: Boost 1.74 compares the length with
  // the empty optional and refuses every body.)
  parser_->parser->body_limit(std::numeric_limits<std::uint64_t>::max());
  parser_->parser->skip(head_request_);
  retry_at_ = 0;
}

ResponseReader::Step ResponseReader::feed(std::string_view data, std::size_t& used,
                                          std::string& body) {
  used = 0;
  beast::error_code ec;
  while (!header_done_) {
    auto& parser = *parser_->parser;
    const std::string_view rest = data.substr(used);
    used += parser.put(boost::asio::buffer(rest.data(), rest.size()), ec);
    if (ec == bhttp::error::need_more && !parser.is_header_done()) return Step::need_more;
    if (ec && ec != bhttp::error::need_more) {
      error_ = "malformed upstream response: " + ec.message();
      return Step::error;
    }
    const int status = static_cast<int>(parser.get().result_int());
    if (status < 100 || status > 599) {  // Beast takes any three digits; HTTP has 1xx-5xx
      error_ = "the upstream answered with status " + std::to_string(status);
      return Step::error;
    }
    if (status < 200) {
      if (status == 101) {
        error_ = "the upstream switched protocols, which the proxy does not relay";
        return Step::error;
      }
      restart();  // an interim response (100 Continue, 103 Early Hints): the final one follows
      if (used >= data.size()) return Step::need_more;
      continue;
    }
    header_done_ = true;
    status_ = status;
    for (const auto& field : parser.get()) {
      headers_.push_back(
          {std::string(view(field.name_string())), std::string(view(field.value()))});
    }
    if (const boost::optional<std::uint64_t> length = parser.content_length()) {
      content_length_ = *length;
    }
    parser.eager(true);
    return Step::header;
  }
  auto& parser = *parser_->parser;
  char buffer[16384];
  while (!parser.is_done()) {
    parser.get().body().data = buffer;
    parser.get().body().size = sizeof buffer;
    const std::string_view rest = data.substr(used);
    if (rest.empty() || rest.size() < retry_at_) break;
    const std::size_t n = parser.put(boost::asio::buffer(rest.data(), rest.size()), ec);
    used += n;
    const std::size_t written = sizeof buffer - parser.get().body().size;
    retry_at_ = n == 0 && written == 0 ? std::max(kChunkRetryBytes, rest.size() + 1) : 0;
    body.append(buffer, written);
    if (ec == bhttp::error::need_buffer) {
      ec = {};
      continue;
    }
    if (ec == bhttp::error::need_more) break;
    if (ec) {
      error_ = "malformed upstream response body: " + ec.message();
      return Step::error;
    }
    if (n == 0 && written == 0) break;
  }
  return parser.is_done() ? Step::complete : Step::need_more;
}

ResponseReader::Step ResponseReader::eof() {
  if (!parser_->parser->got_some()) {  // put_eof() needs at least one byte
    error_ = "the upstream closed the connection without a response";
    return Step::error;
  }
  beast::error_code ec;
  parser_->parser->put_eof(ec);
  if (ec) {
    error_ = "the upstream closed the connection before the response was complete";
    return Step::error;
  }
  return Step::complete;
}

bool ResponseReader::keep_alive() const noexcept {
  return parser_->parser->is_done() && parser_->parser->keep_alive();
}

// ---- writing -----------------------------------------------------------------------------------

std::string serialize_request(const idem::http::Request& request,
                              const idem::http::Headers& extra) {
  // Fields the client's Connection field names are this hop's too (RFC 9110 §7.6.1).
  std::vector<std::string_view> hop;
  for (const auto& header : request.headers) {
    if (idem::http::iequals(header.name, "connection")) {
      for (std::string_view token : tokens(header.value))
        hop.push_back(token);
    }
  }
  // Written directly, as serialize_response() is: the bytes a Beast request message and
  // prepare_payload() give (Content-Length when the body is not empty and for OPTIONS, PUT and
  // POST; a TRACE with a body refused).
  const std::string_view method = request.method;
  if (method == "TRACE" && !request.body.empty()) {
    throw std::invalid_argument("invalid request body");
  }
  std::size_t size = 64 + method.size() + request.target.size() + request.body.size();
  for (const auto& header : request.headers)
    size += header.name.size() + header.value.size() + 4;
  for (const auto& header : extra)
    size += header.name.size() + header.value.size() + 4;
  std::string out;
  out.reserve(size);
  out.append(method);
  out.push_back(' ');
  out.append(request.target);
  out.append(" HTTP/1.1\r\n");
  const auto field = [&](std::string_view name, std::string_view value) {
    out.append(name);
    out.append(": ");
    out.append(value);
    out.append("\r\n");
  };
  for (const auto& header : request.headers) {
    if (idem::http::is_connection_field(header.name) ||
        idem::http::iequals(header.name, "expect")) {
      continue;
    }
    bool named = false;
    for (std::string_view token : hop)
      named = named || idem::http::iequals(token, header.name);
    if (!named) field(header.name, header.value);
  }
  for (const auto& header : extra)
    field(header.name, header.value);
  if (!request.body.empty() || method == "OPTIONS" || method == "PUT" || method == "POST") {
    field("Content-Length", std::to_string(request.body.size()));
  }
  out.append("\r\n");
  out.append(request.body);
  return out;
}

std::string serialize_response(const idem::http::Response& response, bool keep_alive,
                               bool head_request) {
  // Written directly rather than through a Beast message and serializer (a node per field, a
  // copy of the body, a string grown piece by piece): every response the proxy sends, replays
  // above all, comes here. The bytes are those Beast writes for the same message: the status
  // line with Beast's reason phrase, the fields in order, Connection: close unless keep_alive,
  // then the Content-Length of prepare_payload() (which refuses a body on a 204 or 304).
  const unsigned status = static_cast<unsigned>(response.status);
  if (status > 999) throw std::invalid_argument("invalid status-code");
  if ((status == 204 || status == 304) && !head_request && !response.body.empty()) {
    throw std::invalid_argument("invalid response body");  // as prepare_payload() refuses it
  }
  const beast::string_view reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  std::size_t size = 64 + reason.size() + response.body.size();
  for (const auto& header : response.headers)
    size += header.name.size() + header.value.size() + 4;
  std::string out;
  out.reserve(size);
  out.append("HTTP/1.1 ");
  out.push_back(static_cast<char>('0' + status / 100));
  out.push_back(static_cast<char>('0' + status / 10 % 10));
  out.push_back(static_cast<char>('0' + status % 10));
  out.push_back(' ');
  out.append(reason.data(), reason.size());
  out.append("\r\n");
  for (const auto& header : response.headers) {
    if (idem::http::is_connection_field(header.name)) continue;
    out.append(header.name);
    out.append(": ");
    out.append(header.value);
    out.append("\r\n");
  }
  if (!keep_alive) out.append("Connection: close\r\n");
  out.append("Content-Length: ");
  out.append(std::to_string(response.body.size()));
  out.append("\r\n");
  out.append("\r\n");
  if (!head_request) out.append(response.body);
  return out;
}

std::string serialize_response_head(int status, const idem::http::Headers& headers, Framing framing,
                                    std::optional<std::uint64_t> length, bool keep_alive) {
  bhttp::response<bhttp::empty_body> message;
  message.result(static_cast<unsigned>(status));
  message.version(11);
  for (const auto& header : headers) {
    if (idem::http::is_connection_field(header.name)) continue;
    message.insert(bview(header.name), bview(header.value));
  }
  message.keep_alive(keep_alive && framing != Framing::close);
  switch (framing) {
    case Framing::length:
      message.content_length(length.value_or(0));
      break;
    case Framing::chunked:
      message.chunked(true);
      break;
    case Framing::close:
      break;
  }
  return write_message(message, true);
}

std::string chunk(std::string_view data) {
  if (data.empty()) return {};
  return flatten(bhttp::make_chunk(boost::asio::const_buffer(data.data(), data.size())));
}

std::string last_chunk() {
  return flatten(bhttp::make_chunk_last());
}

idem::http::Response proxy_problem(int status, std::string_view code, std::string_view detail) {
  nlohmann::json body;
  body["type"] = "about:blank";
  body["title"] = std::string(idem::http::reason_phrase(status));
  body["status"] = status;
  body["detail"] = std::string(detail);
  body["code"] = std::string(code);
  idem::http::Response response;
  response.status = status;
  response.headers.push_back({"Content-Type", "application/problem+json"});
  response.body = body.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  return response;
}

}  // namespace idem::cli::proxy
