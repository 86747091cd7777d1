#include "idem/http/rules.hpp"

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "idem/error.hpp"
#include "idem/fingerprint.hpp"

namespace idem::http {

namespace {

// JSON nested deeper than this is fingerprinted as raw bytes: idem's canonical form recurses.
constexpr int kMaxJsonDepth = 64;

bool is_unreserved(char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

char lower(char c) noexcept {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c;
}

std::string to_lower(std::string_view text) {
  std::string out(text);
  for (char& c : out)
    c = lower(c);
  return out;
}

bool starts_with_icase(std::string_view text, std::string_view prefix) noexcept {
  return text.size() >= prefix.size() && iequals(text.substr(0, prefix.size()), prefix);
}

// RFC 3986 §5.2.4.
std::string remove_dot_segments(std::string_view input) {
  std::vector<std::string_view> out;
  std::size_t pos = 0;
  bool trailing_slash = false;
  while (pos < input.size()) {
    std::size_t next = input.find('/', pos + 1);
    if (next == std::string_view::npos) next = input.size();
    const std::string_view segment = input.substr(pos + 1, next - pos - 1);  // after the '/'
    trailing_slash = false;
    if (segment == ".") {
      trailing_slash = true;
    } else if (segment == "..") {
      if (!out.empty()) out.pop_back();
      trailing_slash = true;
    } else {
      out.push_back(segment);
    }
    pos = next;
  }
  std::string path;
  for (std::string_view segment : out) {
    path += '/';
    path += segment;
  }
  if (trailing_slash || path.empty()) path += '/';
  return path;
}

std::string_view query_of(std::string_view target) noexcept {
  const std::size_t question = target.find('?');
  if (question == std::string_view::npos) return {};
  std::string_view query = target.substr(question + 1);
  const std::size_t hash = query.find('#');
  return hash == std::string_view::npos ? query : query.substr(0, hash);
}

std::string canonical_query(std::string_view query) {
  std::vector<std::string_view> parameters;
  std::size_t start = 0;
  while (start <= query.size()) {
    std::size_t end = query.find('&', start);
    if (end == std::string_view::npos) end = query.size();
    if (end > start) parameters.push_back(query.substr(start, end - start));
    start = end + 1;
  }
  std::sort(parameters.begin(), parameters.end());
  std::string out;
  for (std::string_view parameter : parameters) {
    if (!out.empty()) out += '&';
    out += parameter;
  }
  return out;
}

// Parses `body` as JSON no deeper than kMaxJsonDepth; nullopt otherwise.
std::optional<nlohmann::json> parse_json(std::string_view body) {
  struct TooDeep {};
  try {
    nlohmann::json::parser_callback_t limit = [](int depth, nlohmann::json::parse_event_t,
                                                 nlohmann::json&) {
      if (depth > kMaxJsonDepth) throw TooDeep{};
      return true;
    };
    nlohmann::json value = nlohmann::json::parse(body.begin(), body.end(), limit,
                                                 /*allow_exceptions=*/true);
    return value;
  } catch (const TooDeep&) {
    return std::nullopt;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::string request_fingerprint(const Route& route, const Request& request) {
  const FingerprintOptions& options = route.fingerprint;
  const std::string query =
      options.query ? canonical_query(query_of(request.target)) : std::string();
  std::vector<std::string> fields;
  for (const std::string& name : options.headers) {
    std::string values;
    for (const Header& header : request.headers) {
      if (!iequals(header.name, name)) continue;
      if (!values.empty()) values += '\n';
      values += header.value;
    }
    fields.push_back(to_lower(name));
    fields.push_back(std::move(values));
  }
  switch (options.body) {
    case BodyFingerprint::none:
      return fingerprint(std::string_view("idem.http.v1"), std::string_view("none"), query, fields);
    case BodyFingerprint::json:
      if (std::optional<nlohmann::json> document = parse_json(request.body)) {
        if (options.json_pointers.empty()) {
          return fingerprint(std::string_view("idem.http.v1"), std::string_view("json"), *document,
                             query, fields);
        }
        // The chosen members, by pointer: present ones with their value, absent ones left out.
        nlohmann::json chosen = nlohmann::json::object();
        for (const std::string& pointer : options.json_pointers) {
          try {
            const nlohmann::json::json_pointer where(pointer);
            if (document->contains(where)) chosen[pointer] = document->at(where);
          } catch (const nlohmann::json::exception&) {
            // Not addressable in this document (an array index that is not a number): absent.
          }
        }
        return fingerprint(std::string_view("idem.http.v1"), std::string_view("pointers"), chosen,
                           query, fields);
      }
      [[fallthrough]];  // not JSON: its bytes
    case BodyFingerprint::raw:
      break;
  }
  return fingerprint(std::string_view("idem.http.v1"), std::string_view("raw"),
                     std::string_view(request.body), query, fields);
}

// "h:<name>:<value>" of the first principal field present, "c:<subject>", or "" (anonymous).
std::optional<std::string> principal_of(const PrincipalOptions& options, const Request& request) {
  for (const std::string& name : options.headers) {
    std::string value;
    bool found = false;
    for (const Header& header : request.headers) {
      if (!iequals(header.name, name)) continue;
      if (found) value += '\n';
      value += header.value;
      found = true;
    }
    if (found) return "h:" + to_lower(name) + ":" + value;
  }
  if (options.client_certificate && request.client_subject) return "c:" + *request.client_subject;
  return std::nullopt;
}

const Route* match_route(const GuardOptions& options, std::string_view method,
                         std::string_view path) {
  for (const Route& route : options.routes) {
    if (std::find(route.methods.begin(), route.methods.end(), method) == route.methods.end()) {
      continue;
    }
    if (path_matches(route.path, path)) return &route;
  }
  return nullptr;
}

void put_u16(std::string& out, std::uint16_t v) {
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v & 0xff));
}
void put_u32(std::string& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((v >> shift) & 0xff));
}
void put_bytes(std::string& out, std::string_view bytes) {
  put_u32(out, static_cast<std::uint32_t>(bytes.size()));
  out.append(bytes);
}

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  std::uint32_t u(std::size_t width) {
    need(width);
    std::uint32_t v = 0;
    for (std::size_t i = 0; i < width; ++i) {
      v = (v << 8) | static_cast<unsigned char>(bytes_[pos_++]);
    }
    return v;
  }
  std::string_view bytes() {
    const std::uint32_t size = u(4);
    need(size);
    const std::string_view out = bytes_.substr(pos_, size);
    pos_ += size;
    return out;
  }
  bool done() const noexcept { return pos_ == bytes_.size(); }

 private:
  void need(std::size_t n) const {
    if (bytes_.size() - pos_ < n) throw DecodeError("stored HTTP response is truncated");
  }
  std::string_view bytes_;
  std::size_t pos_ = 0;
};

constexpr std::string_view kStoredMagic = "IDH1";

}  // namespace

std::string_view to_string(Refusal refusal) noexcept {
  switch (refusal) {
    case Refusal::key_missing:
      return "key-missing";
    case Refusal::key_invalid:
      return "key-invalid";
    case Refusal::key_repeated:
      return "key-repeated";
    case Refusal::principal_missing:
      return "principal-missing";
    case Refusal::fingerprint_mismatch:
      return "fingerprint-mismatch";
    case Refusal::in_progress:
      return "in-progress";
    case Refusal::key_spent:
      return "key-spent";
    case Refusal::store_unavailable:
      return "store-unavailable";
  }
  return "unknown";
}

int status_of(Refusal refusal) noexcept {
  switch (refusal) {
    case Refusal::key_missing:
    case Refusal::key_invalid:
    case Refusal::key_repeated:
    case Refusal::principal_missing:
      return 400;
    case Refusal::fingerprint_mismatch:
      return 422;
    case Refusal::in_progress:
    case Refusal::key_spent:
      return 409;
    case Refusal::store_unavailable:
      return 503;
  }
  return 500;
}

std::optional<std::string> normalize_path(std::string_view target) {
  if (starts_with_icase(target, "http://") || starts_with_icase(target, "https://")) {
    const std::size_t authority = target.find("//") + 2;
    const std::size_t slash = target.find_first_of("/?#", authority);
    if (slash == std::string_view::npos) return std::string("/");
    target = target[slash] == '/' ? target.substr(slash) : std::string_view("/");
  }
  if (target.empty() || target.front() != '/') return std::nullopt;
  const std::size_t end = target.find_first_of("?#");
  const std::string_view raw = target.substr(0, end);
  std::string path;
  path.reserve(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const char c = raw[i];
    if (c == '%') {
      if (i + 2 >= raw.size()) return std::nullopt;
      const int high = hex_value(raw[i + 1]);
      const int low = hex_value(raw[i + 2]);
      if (high < 0 || low < 0) return std::nullopt;
      const char decoded = static_cast<char>(high * 16 + low);
      if (is_unreserved(decoded)) {
        path += decoded;
      } else {
        static constexpr char kHex[] = "0123456789ABCDEF";
        path += '%';
        path += kHex[high];
        path += kHex[low];
      }
      i += 2;
    } else if (c <= 0x20 || c >= 0x7f) {
      return std::nullopt;
    } else {
      path += c;
    }
  }
  return remove_dot_segments(path);
}

bool path_matches(std::string_view pattern, std::string_view path) noexcept {
  std::size_t p = 1;  // after the leading '/'
  std::size_t s = 1;
  for (;;) {
    const bool pattern_done = p > pattern.size();
    const bool path_done = s > path.size();
    if (pattern_done) return path_done;
    std::size_t p_end = pattern.find('/', p);
    if (p_end == std::string_view::npos) p_end = pattern.size();
    const std::string_view want = pattern.substr(p, p_end - p);
    if (want == "*" && p_end == pattern.size()) return true;
    if (path_done) return false;
    std::size_t s_end = path.find('/', s);
    if (s_end == std::string_view::npos) s_end = path.size();
    const std::string_view got = path.substr(s, s_end - s);
    if (!want.empty() && want.front() == '{') {
      if (got.empty()) return false;
    } else if (want != got) {
      return false;
    }
    p = p_end + 1;
    s = s_end + 1;
  }
}

Inspection inspect(const GuardOptions& options, const Request& request) {
  Inspection result;
  const std::optional<std::string> path = normalize_path(request.target);
  if (!path) return result;  // "*" or a target no route can match: unguarded
  const Route* route = match_route(options, request.method, *path);
  if (route == nullptr) return result;
  result.route = route;
  KeyParse key = parse_key(request.headers, options.key);
  switch (key.status) {
    case KeyStatus::absent:
      if (route->required) {
        result.kind = Inspection::Kind::refuse;
        result.refusal = Refusal::key_missing;
        result.detail = request.method + " " + *path + " requires an " + options.key.field +
                        " field (" + describe(options.key) + ")";
      }
      return result;  // optional: pass
    case KeyStatus::repeated:
      result.kind = Inspection::Kind::refuse;
      result.refusal = Refusal::key_repeated;
      result.detail = std::move(key.detail);
      return result;
    case KeyStatus::malformed:
    case KeyStatus::length:
    case KeyStatus::charset:
      result.kind = Inspection::Kind::refuse;
      result.refusal = Refusal::key_invalid;
      result.detail = std::move(key.detail);
      return result;
    case KeyStatus::ok:
      break;
  }
  const std::optional<std::string> principal = principal_of(options.principal, request);
  if (!principal && options.principal.required) {
    result.kind = Inspection::Kind::refuse;
    result.refusal = Refusal::principal_missing;
    result.detail = "an idempotency key is scoped to its sender, and this request names none";
    return result;
  }
  const std::string digest = fingerprint(std::string_view("idem.http.key.v1"), route->name,
                                         request.method, *path, principal, key.key);
  result.kind = Inspection::Kind::guarded;
  result.guarded.route = route;
  result.guarded.store_key = options.key_prefix + digest;
  result.guarded.key_digest = digest.substr(0, 16);
  result.guarded.fingerprint = request_fingerprint(*route, request);
  return result;
}

Response problem(const GuardOptions& options, Refusal refusal, std::string_view detail) {
  const int status = status_of(refusal);
  std::string_view title;
  switch (refusal) {
    case Refusal::key_missing:
      title = "Idempotency-Key is missing";
      break;
    case Refusal::key_invalid:
      title = "Idempotency-Key is malformed";
      break;
    case Refusal::key_repeated:
      title = "Idempotency-Key is repeated";
      break;
    case Refusal::principal_missing:
      title = "The request names no client";
      break;
    case Refusal::fingerprint_mismatch:
      title = "Idempotency-Key is already used";
      break;
    case Refusal::in_progress:
      title = "A request is outstanding for this Idempotency-Key";
      break;
    case Refusal::key_spent:
      title = "Idempotency-Key was already used";
      break;
    case Refusal::store_unavailable:
      title = "The idempotency store is unavailable";
      break;
  }
  nlohmann::json body;
  if (options.problem_base.empty()) {
    body["type"] = "about:blank";
    body["title"] = std::string(reason_phrase(status));
    body["code"] = std::string(to_string(refusal));
  } else {
    body["type"] = options.problem_base + std::string(to_string(refusal));
    body["title"] = std::string(title);
  }
  body["status"] = status;
  body["detail"] = options.problem_base.empty() ? std::string(title) + ": " + std::string(detail)
                                                : std::string(detail);
  Response response;
  response.status = status;
  add_header(response.headers, "Content-Type", "application/problem+json");
  if (status == 409 || status == 503) add_header(response.headers, "Retry-After", "1");
  response.body =
      body.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  return response;
}

OutcomeKind outcome_of(const Route& route, int status) noexcept {
  if (route.transient_statuses.contains(status)) return OutcomeKind::transient;
  if (status >= 400) return OutcomeKind::failure;
  return OutcomeKind::success;
}

std::string encode_stored(const Route& route, const Response& response, OutcomeKind kind) {
  std::string out(kStoredMagic);
  out.reserve(out.size() + 16 + response.body.size());
  out.push_back(static_cast<char>(kind));
  put_u16(out, static_cast<std::uint16_t>(response.status));
  std::vector<const Header*> kept;
  for (const Header& header : response.headers) {
    if (is_connection_field(header.name)) continue;
    const bool listed =
        std::any_of(route.stored_headers.begin(), route.stored_headers.end(),
                    [&](const std::string& name) { return iequals(name, header.name); });
    if (listed) kept.push_back(&header);
  }
  put_u32(out, static_cast<std::uint32_t>(kept.size()));
  for (const Header* header : kept) {
    put_bytes(out, header->name);
    put_bytes(out, header->value);
  }
  put_bytes(out, response.body);
  return out;
}

StoredResponse decode_stored(std::string_view bytes) {
  if (bytes.substr(0, kStoredMagic.size()) != kStoredMagic) {
    throw DecodeError("stored value is not an HTTP response (no IDH1 header)");
  }
  Reader reader(bytes.substr(kStoredMagic.size()));
  StoredResponse stored;
  const std::uint32_t kind = reader.u(1);
  if (kind > static_cast<std::uint32_t>(OutcomeKind::transient)) {
    throw DecodeError("stored HTTP response has an unknown outcome kind");
  }
  stored.kind = static_cast<OutcomeKind>(kind);
  stored.response.status = static_cast<int>(reader.u(2));
  if (stored.response.status < 100 || stored.response.status > 599) {
    throw DecodeError("stored HTTP response has status " + std::to_string(stored.response.status));
  }
  const std::uint32_t count = reader.u(4);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::string_view name = reader.bytes();
    const std::string_view value = reader.bytes();
    add_header(stored.response.headers, std::string(name), std::string(value));
  }
  stored.response.body = std::string(reader.bytes());
  if (!reader.done()) throw DecodeError("stored HTTP response has trailing bytes");
  return stored;
}

std::string http_date(WallTime time) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm parts{};
  gmtime_r(&seconds, &parts);
  char text[40];
  const std::size_t size = std::strftime(text, sizeof text, "%a, %d %b %Y %H:%M:%S GMT", &parts);
  return std::string(text, size);
}

}  // namespace idem::http
