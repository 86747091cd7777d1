// The request path of `idem proxy`: bytes from a client, in pieces of varying size, through the
// Beast-based RequestReader (tools/idem/proxy/wire.cpp) exactly as a connection feeds it, each
// request it yields through idem::http::inspect() (route, key, principal, fingerprint) and
// serialize_request(), each refusal through serialize_response(). With the first byte's high
// bit set, the same bytes go through the upstream's ResponseReader instead.
//
// Invariants: nothing throws; a malformed request gets a 4xx/5xx answer of the proxy's own
// (400, 413, 431, 501 or 505) and ends the connection; a request inspect() guards has a store key
// of the prefix and 64 hex digits and a 64-digit fingerprint; every refusal is a 400.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "idem/http/options.hpp"
#include "idem/http/rules.hpp"
#include "wire.hpp"

namespace {

using idem::cli::proxy::RequestReader;
using idem::cli::proxy::ResponseReader;

const idem::http::GuardOptions& options() {
  static const idem::http::GuardOptions guard = [] {
    idem::http::GuardOptions o;
    o.principal.headers = {"Authorization"};
    idem::http::Route payments;
    payments.name = "payments";
    payments.path = "/v1/payments/*";
    payments.required = true;
    payments.fingerprint.body = idem::http::BodyFingerprint::json;
    payments.fingerprint.headers = {"Content-Type"};
    o.routes.push_back(payments);
    idem::http::Route orders;
    orders.name = "refunds";
    orders.path = "/orders/{id}/refunds";
    orders.fingerprint.body = idem::http::BodyFingerprint::json;
    orders.fingerprint.json_pointers = {"/amount", "/reason"};
    o.routes.push_back(orders);
    o.routes.emplace_back();  // everything else: optional key, raw body
    return idem::http::normalized(o);
  }();
  return guard;
}

bool is_hex(std::string_view text) {
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

void check_request(const idem::http::Request& request) {
  const idem::http::Inspection inspection = idem::http::inspect(options(), request);
  switch (inspection.kind) {
    case idem::http::Inspection::Kind::guarded: {
      const auto& guarded = inspection.guarded;
      if (guarded.store_key.size() != 5 + 64 || guarded.store_key.rfind("http:", 0) != 0 ||
          !is_hex(std::string_view(guarded.store_key).substr(5))) {
        idem::fuzz::fail("a store key is not the prefix and 64 hex digits");
      }
      if (guarded.fingerprint.size() != 64 || !is_hex(guarded.fingerprint)) {
        idem::fuzz::fail("a fingerprint is not 64 hex digits");
      }
      break;
    }
    case idem::http::Inspection::Kind::refuse: {
      const idem::http::Response problem =
          idem::http::problem(options(), inspection.refusal, inspection.detail);
      if (problem.status != 400) idem::fuzz::fail("a request was refused with a non-400");
      (void)idem::cli::proxy::serialize_response(problem, true);
      break;
    }
    case idem::http::Inspection::Kind::pass:
      break;
  }
  (void)idem::cli::proxy::serialize_request(request, {{"X-Forwarded-For", "127.0.0.1"}});
}

void check_error(const idem::cli::proxy::WireError& error) {
  if (error.status != 400 && error.status != 413 && error.status != 431 && error.status != 501 &&
      error.status != 505) {
    idem::fuzz::fail("a malformed request got status " + std::to_string(error.status));
  }
  const std::string bytes = idem::cli::proxy::serialize_response(
      idem::cli::proxy::proxy_problem(error.status, error.code, error.detail), false);
  if (bytes.rfind("HTTP/1.1 " + std::to_string(error.status), 0) != 0) {
    idem::fuzz::fail("the refusal does not start with its status line");
  }
}

void requests(std::string_view input, std::size_t piece) {
  RequestReader reader(4096, 16384);
  std::string buffer;
  std::size_t pos = 0;
  for (;;) {
    // What a connection does with the bytes it has (server.cpp, serve_one).
    std::size_t used = 0;
    RequestReader::Step step = reader.feed(buffer, used);
    buffer.erase(0, used);
    if (step == RequestReader::Step::header) {
      (void)reader.expects_continue();
      (void)reader.content_length();
      used = 0;
      step = reader.feed(buffer, used);
      buffer.erase(0, used);
    }
    if (step == RequestReader::Step::complete) {
      (void)reader.keep_alive();
      (void)reader.head();
      check_request(reader.take());
      continue;
    }
    if (step == RequestReader::Step::error) {
      check_error(reader.error());
      return;  // the connection ends
    }
    if (pos >= input.size()) {
      if (reader.eof() == RequestReader::Step::error) check_error(reader.error());
      return;
    }
    const std::size_t n = std::min(piece, input.size() - pos);
    buffer.append(input.substr(pos, n));
    pos += n;
  }
}

void responses(std::string_view input, std::size_t piece, bool head) {
  ResponseReader reader(head, 4096);
  std::string buffer;
  std::string body;
  std::size_t pos = 0;
  for (;;) {
    std::size_t used = 0;
    const ResponseReader::Step step = reader.feed(buffer, used, body);
    buffer.erase(0, used);
    if (step == ResponseReader::Step::complete || step == ResponseReader::Step::error) return;
    if (step == ResponseReader::Step::header) {
      if (reader.status() < 200 || reader.status() > 599) {
        idem::fuzz::fail("a final response has status " + std::to_string(reader.status()));
      }
      continue;
    }
    if (step == ResponseReader::Step::need_more && used > 0) continue;
    if (pos >= input.size()) {
      (void)reader.eof();
      return;
    }
    const std::size_t n = std::min(piece, input.size() - pos);
    buffer.append(input.substr(pos, n));
    pos += n;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::size_t piece = (data[0] & 0x3f) == 0 ? input.size() + 1 : (data[0] & 0x3f);
  try {
    if ((data[0] & 0x80) != 0) {
      responses(input, piece, (data[0] & 0x40) != 0);
    } else {
      requests(input, piece);
    }
  } catch (const std::exception& e) {
    idem::fuzz::fail(std::string("the request path threw: ") + e.what());
  }
  return 0;
}
