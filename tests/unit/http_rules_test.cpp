// idem::http's store-free rules: the key field (RFC 8941 sf-string, the key rules), path
// normalisation and route patterns, the fingerprint's canonical subset, problem+json, the stored
// response layout, the options' checks, and the DuplicatePolicy matrix of core.
#include "idem/http/rules.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "idem/error.hpp"
#include "idem/http/key.hpp"
#include "idem/http/options.hpp"
#include "idem/idempotency_policy.hpp"

namespace {

using idem::http::GuardOptions;
using idem::http::Headers;
using idem::http::Inspection;
using idem::http::KeyCharset;
using idem::http::KeyRules;
using idem::http::KeyStatus;
using idem::http::Refusal;
using idem::http::Request;
using idem::http::Route;

Request post(std::string target, Headers headers, std::string body = "{}") {
  Request request;
  request.method = "POST";
  request.target = std::move(target);
  request.headers = std::move(headers);
  request.body = std::move(body);
  return request;
}

Headers keyed(std::string value) {
  return {{"Idempotency-Key", std::move(value)}};
}

// ---- sf-string -------------------------------------------------------------------------------

TEST(HttpSfString, ParsesStringItems) {
  using idem::http::parse_sf_string_item;
  EXPECT_EQ(parse_sf_string_item("\"8e03978e-40d5-43e8-bc93-6894a57f9324\""),
            "8e03978e-40d5-43e8-bc93-6894a57f9324");
  EXPECT_EQ(parse_sf_string_item("  \"a b\"  "), "a b");
  EXPECT_EQ(parse_sf_string_item(R"("q\"uote\\d")"), R"(q"uote\d)");
  EXPECT_EQ(parse_sf_string_item("\"\""), "");
  // Parameters of every bare item type are parsed and ignored.
  EXPECT_EQ(parse_sf_string_item(R"("k";a=1;b="x";c=?1;d=:aGk=:;e=tok/1;f=-1.5;g)"), "k");
  EXPECT_EQ(parse_sf_string_item(R"("k"; a=1)"), "k");
}

TEST(HttpSfString, RefusesEverythingElse) {
  using idem::http::parse_sf_string_item;
  for (const char* value :
       {"abc", "\"abc", "\"abc\" x", "\"abc\", \"def\"", R"("a\x")", "\"a\tb\"", "\"caf\xc3\xa9\"",
        "?1", "42", ":aGk=:", "", " ", "\"k\";A=1", "\"k\";a=\"x", "\"k\";a=1.2345", "\"k\";=1",
        "\"k\";a=?2", "\"k\";a=:*:", "\"k\";a=1234567890123456"}) {
    EXPECT_FALSE(parse_sf_string_item(value)) << value;
  }
}

// ---- key rules -------------------------------------------------------------------------------

TEST(HttpKey, AbsentOkRepeated) {
  KeyRules rules;
  EXPECT_EQ(idem::http::parse_key({}, rules).status, KeyStatus::absent);
  const auto ok = idem::http::parse_key({{"idempotency-key", "\"k-1\""}}, rules);
  EXPECT_EQ(ok.status, KeyStatus::ok);
  EXPECT_EQ(ok.key, "k-1");
  const auto twice =
      idem::http::parse_key({{"Idempotency-Key", "\"a\""}, {"IDEMPOTENCY-KEY", "\"a\""}}, rules);
  EXPECT_EQ(twice.status, KeyStatus::repeated);
}

TEST(HttpKey, LengthAndCharset) {
  KeyRules rules;
  rules.min_length = 4;
  rules.max_length = 8;
  EXPECT_EQ(idem::http::parse_key(keyed("\"abc\""), rules).status, KeyStatus::length);
  EXPECT_EQ(idem::http::parse_key(keyed("\"abcdefghi\""), rules).status, KeyStatus::length);
  EXPECT_EQ(idem::http::parse_key(keyed("\"abcd\""), rules).status, KeyStatus::ok);
  rules.charset = KeyCharset::token;
  EXPECT_EQ(idem::http::parse_key(keyed("\"ab cd\""), rules).status, KeyStatus::charset);
  EXPECT_EQ(idem::http::parse_key(keyed("\"a_b:c=\""), rules).status, KeyStatus::ok);
  // The detail never repeats the key's bytes.
  const auto refused = idem::http::parse_key(keyed("\"secret value\""), rules);
  EXPECT_EQ(refused.detail.find("secret"), std::string::npos) << refused.detail;
}

TEST(HttpKey, UuidFormats) {
  KeyRules rules;
  rules.charset = KeyCharset::uuid;
  EXPECT_EQ(idem::http::parse_key(keyed("\"8E03978E-40D5-43E8-BC93-6894A57F9324\""), rules).status,
            KeyStatus::ok);
  EXPECT_EQ(idem::http::parse_key(keyed("\"8e03978e40d543e8bc936894a57f9324\""), rules).status,
            KeyStatus::charset);
  rules.charset = KeyCharset::uuid_v4;
  EXPECT_EQ(idem::http::parse_key(keyed("\"8e03978e-40d5-43e8-bc93-6894a57f9324\""), rules).status,
            KeyStatus::ok);
  EXPECT_EQ(idem::http::parse_key(keyed("\"01890a5d-ac96-774b-bcce-b302099a8057\""), rules).status,
            KeyStatus::charset);
  rules.charset = KeyCharset::uuid_v7;
  EXPECT_EQ(idem::http::parse_key(keyed("\"01890a5d-ac96-774b-bcce-b302099a8057\""), rules).status,
            KeyStatus::ok);
  EXPECT_EQ(idem::http::parse_key(keyed("\"01890a5d-ac96-774b-7cce-b302099a8057\""), rules).status,
            KeyStatus::charset);  // variant bits 0111
}

TEST(HttpKey, BareKeysOnlyWhenAllowed) {
  KeyRules rules;
  EXPECT_EQ(idem::http::parse_key(keyed("abc-123"), rules).status, KeyStatus::malformed);
  rules.accept_bare = true;
  const auto bare = idem::http::parse_key(keyed("abc-123"), rules);
  EXPECT_EQ(bare.status, KeyStatus::ok);
  EXPECT_EQ(bare.key, "abc-123");
  EXPECT_EQ(idem::http::parse_key(keyed("\"quoted\""), rules).key, "quoted");
  EXPECT_EQ(idem::http::parse_key(keyed("a,b"), rules).status, KeyStatus::malformed);
  EXPECT_EQ(idem::http::parse_key(keyed("a b"), rules).status, KeyStatus::malformed);
}

// ---- paths and routes ------------------------------------------------------------------------

TEST(HttpPath, Normalises) {
  using idem::http::normalize_path;
  EXPECT_EQ(normalize_path("/a/b?x=1#f"), "/a/b");
  EXPECT_EQ(normalize_path("/a/%7Eb/../c"), "/a/c");
  EXPECT_EQ(normalize_path("/v1/payment%73"), "/v1/payments");
  EXPECT_EQ(normalize_path("/a/%2e%2E/b"), "/b");
  EXPECT_EQ(normalize_path("/a%2fb"), "/a%2Fb");  // a reserved character stays encoded
  EXPECT_EQ(normalize_path("/a/./b/."), "/a/b/");
  EXPECT_EQ(normalize_path("/../../x"), "/x");
  EXPECT_EQ(normalize_path("HTTP://host:8080/p?q"), "/p");
  EXPECT_EQ(normalize_path("http://host"), "/");
  EXPECT_EQ(normalize_path("/"), "/");
  EXPECT_FALSE(normalize_path("*"));
  EXPECT_FALSE(normalize_path(""));
  EXPECT_FALSE(normalize_path("relative"));
  EXPECT_FALSE(normalize_path("/a%4"));
  EXPECT_FALSE(normalize_path("/a%zz"));
  EXPECT_FALSE(normalize_path("/a b"));
  EXPECT_FALSE(normalize_path("/caf\xc3\xa9"));
}

TEST(HttpPath, Patterns) {
  using idem::http::path_matches;
  EXPECT_TRUE(path_matches("/*", "/"));
  EXPECT_TRUE(path_matches("/*", "/a/b/c"));
  EXPECT_TRUE(path_matches("/payments", "/payments"));
  EXPECT_FALSE(path_matches("/payments", "/payments/1"));
  EXPECT_FALSE(path_matches("/payments", "/payment"));
  EXPECT_TRUE(path_matches("/payments/*", "/payments"));
  EXPECT_TRUE(path_matches("/payments/*", "/payments/1/refunds"));
  EXPECT_FALSE(path_matches("/payments/*", "/paymentsx"));
  EXPECT_TRUE(path_matches("/orders/{id}/refunds", "/orders/42/refunds"));
  EXPECT_FALSE(path_matches("/orders/{id}/refunds", "/orders//refunds"));
  EXPECT_FALSE(path_matches("/orders/{id}/refunds", "/orders/42"));
  EXPECT_FALSE(path_matches("/orders/{id}", "/orders/42/refunds"));
}

TEST(HttpInspect, RoutesChooseMethodsAndPaths) {
  GuardOptions options;
  Route payments;
  payments.name = "payments";
  payments.path = "/v1/payments/*";
  payments.required = true;
  options.routes.push_back(payments);
  options = idem::http::normalized(options);

  Request get = post("/v1/payments", keyed("\"k\""));
  get.method = "GET";
  EXPECT_EQ(idem::http::inspect(options, get).kind, Inspection::Kind::pass);
  EXPECT_EQ(idem::http::inspect(options, post("/v2/other", {})).kind, Inspection::Kind::pass);
  // A percent-encoded path cannot slip past a required route.
  const Inspection missing = idem::http::inspect(options, post("/v1/payment%73", {}));
  EXPECT_EQ(missing.kind, Inspection::Kind::refuse);
  EXPECT_EQ(missing.refusal, Refusal::key_missing);
  const Inspection guarded = idem::http::inspect(options, post("/v1/payments", keyed("\"k\"")));
  ASSERT_EQ(guarded.kind, Inspection::Kind::guarded);
  EXPECT_EQ(guarded.guarded.route->name, "payments");
  EXPECT_EQ(guarded.guarded.store_key.size(), std::string("http:").size() + 64);
  EXPECT_EQ(guarded.guarded.store_key.rfind("http:", 0), 0u);
  EXPECT_EQ(guarded.guarded.key_digest, guarded.guarded.store_key.substr(5, 16));
}

TEST(HttpInspect, OptionalRoutePassesWithoutKeyAndRefusesBadKeys) {
  const GuardOptions options = idem::http::normalized({});
  EXPECT_EQ(idem::http::inspect(options, post("/x", {})).kind, Inspection::Kind::pass);
  const Inspection bad = idem::http::inspect(options, post("/x", keyed("unquoted")));
  EXPECT_EQ(bad.kind, Inspection::Kind::refuse);
  EXPECT_EQ(bad.refusal, Refusal::key_invalid);
  const Inspection twice = idem::http::inspect(
      options, post("/x", {{"Idempotency-Key", "\"a\""}, {"Idempotency-Key", "\"a\""}}));
  EXPECT_EQ(twice.refusal, Refusal::key_repeated);
}

// ---- scoping ---------------------------------------------------------------------------------

TEST(HttpInspect, KeyIsScopedByPrincipalMethodRouteAndPath) {
  GuardOptions options;
  options.principal.headers = {"Authorization", "X-Api-Key"};
  options.routes.push_back(Route{});
  options.routes.back().methods = {"POST", "PUT"};
  options = idem::http::normalized(options);
  const auto key_of = [&](Request request) {
    return idem::http::inspect(options, request).guarded.store_key;
  };
  Headers alice = keyed("\"k\"");
  alice.push_back({"Authorization", "Bearer alice"});
  Headers bob = keyed("\"k\"");
  bob.push_back({"Authorization", "Bearer bob"});
  Headers api = keyed("\"k\"");
  api.push_back({"X-Api-Key", "Bearer alice"});
  const std::string a = key_of(post("/p", alice));
  EXPECT_EQ(a, key_of(post("/p?x=1", alice)));  // the query is the fingerprint's, not the key's
  EXPECT_NE(a, key_of(post("/p", bob)));
  EXPECT_NE(a, key_of(post("/p", api)));  // the field's name counts, not only its value
  EXPECT_NE(a, key_of(post("/q", alice)));
  Request put = post("/p", alice);
  put.method = "PUT";
  EXPECT_NE(a, key_of(put));
  EXPECT_NE(a, key_of(post("/p", keyed("\"k\""))));  // anonymous
  // Neither the token nor the key appears in what is stored.
  EXPECT_EQ(a.find("alice"), std::string::npos);
}

TEST(HttpInspect, ClientCertificateAndRequiredPrincipal) {
  GuardOptions options;
  options.principal.client_certificate = true;
  options.principal.required = true;
  options = idem::http::normalized(options);
  const Inspection none = idem::http::inspect(options, post("/p", keyed("\"k\"")));
  EXPECT_EQ(none.kind, Inspection::Kind::refuse);
  EXPECT_EQ(none.refusal, Refusal::principal_missing);
  Request a = post("/p", keyed("\"k\""));
  a.client_subject = "CN=a";
  Request b = a;
  b.client_subject = "CN=b";
  EXPECT_NE(idem::http::inspect(options, a).guarded.store_key,
            idem::http::inspect(options, b).guarded.store_key);
}

// ---- fingerprint -----------------------------------------------------------------------------

std::string fingerprint_of(const GuardOptions& options, const Request& request) {
  const Inspection inspection = idem::http::inspect(options, request);
  EXPECT_EQ(inspection.kind, Inspection::Kind::guarded);
  return inspection.guarded.fingerprint;
}

TEST(HttpFingerprint, RawBodyQueryAndHeaders) {
  GuardOptions options;
  options.routes.push_back(Route{});
  options.routes.back().fingerprint.headers = {"Content-Type"};
  options = idem::http::normalized(options);
  const std::string base =
      fingerprint_of(options, post("/p?a=1&b=2", keyed("\"k\""), R"({"x":1})"));
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(base, fingerprint_of(options, post("/p?b=2&a=1", keyed("\"k\""), R"({"x":1})")));
  EXPECT_NE(base, fingerprint_of(options, post("/p?a=1&b=3", keyed("\"k\""), R"({"x":1})")));
  EXPECT_NE(base, fingerprint_of(options, post("/p?a=1&b=2", keyed("\"k\""), R"({"x": 1})")));
  Headers typed = keyed("\"k\"");
  typed.push_back({"content-type", "application/json"});
  EXPECT_NE(base, fingerprint_of(options, post("/p?a=1&b=2", typed, R"({"x":1})")));
  // Fields outside the chosen subset do not count.
  Headers other = keyed("\"k\"");
  other.push_back({"User-Agent", "curl"});
  EXPECT_EQ(base, fingerprint_of(options, post("/p?a=1&b=2", other, R"({"x":1})")));
}

TEST(HttpFingerprint, JsonIsCanonicalAndPointersChooseMembers) {
  GuardOptions options;
  options.routes.push_back(Route{});
  options.routes.back().fingerprint.body = idem::http::BodyFingerprint::json;
  options.routes.back().fingerprint.query = false;
  options = idem::http::normalized(options);
  const std::string a = fingerprint_of(options, post("/p", keyed("\"k\""), R"({"a":1,"b":[1,2]})"));
  EXPECT_EQ(a, fingerprint_of(
                   options, post("/p?ignored", keyed("\"k\""), "{ \"b\" : [1, 2],\n \"a\": 1 }")));
  EXPECT_NE(a, fingerprint_of(options, post("/p", keyed("\"k\""), R"({"a":1.0,"b":[1,2]})")));
  EXPECT_NE(a, fingerprint_of(options, post("/p", keyed("\"k\""), R"({"a":1,"b":[2,1]})")));
  // Not JSON, or nested too deep for the canonical form: the raw bytes (never a crash).
  const std::string deep(100000, '[');
  EXPECT_EQ(fingerprint_of(options, post("/p", keyed("\"k\""), deep)).size(), 64u);
  EXPECT_NE(fingerprint_of(options, post("/p", keyed("\"k\""), "not json")),
            fingerprint_of(options, post("/p", keyed("\"k\""), "not  json")));

  options.routes.front().fingerprint.json_pointers = {"/amount", "/card/last4"};
  const std::string chosen = fingerprint_of(
      options, post("/p", keyed("\"k\""), R"({"amount":5,"card":{"last4":"4242"},"note":"a"})"));
  EXPECT_EQ(chosen,
            fingerprint_of(options, post("/p", keyed("\"k\""),
                                         R"({"note":"b","card":{"last4":"4242"},"amount":5})")));
  EXPECT_NE(chosen, fingerprint_of(options, post("/p", keyed("\"k\""),
                                                 R"({"amount":6,"card":{"last4":"4242"}})")));
  // An absent member differs from null.
  EXPECT_NE(fingerprint_of(options, post("/p", keyed("\"k\""), R"({"amount":null})")),
            fingerprint_of(options, post("/p", keyed("\"k\""), R"({})")));
}

// ---- responses -------------------------------------------------------------------------------

TEST(HttpProblem, AboutBlankAndTypedProblems) {
  GuardOptions options = idem::http::normalized({});
  const auto blank = idem::http::problem(options, Refusal::fingerprint_mismatch, "details");
  EXPECT_EQ(blank.status, 422);
  EXPECT_EQ(idem::http::find_header(blank.headers, "content-type"), "application/problem+json");
  const auto body = nlohmann::json::parse(blank.body);
  EXPECT_EQ(body.at("type"), "about:blank");
  EXPECT_EQ(body.at("title"), "Unprocessable Content");
  EXPECT_EQ(body.at("status"), 422);
  EXPECT_EQ(body.at("code"), "fingerprint-mismatch");
  EXPECT_NE(body.at("detail").get<std::string>().find("details"), std::string::npos);

  options.problem_base = "https://api.example.com/problems/";
  const auto typed = idem::http::problem(options, Refusal::in_progress, "d");
  EXPECT_EQ(typed.status, 409);
  EXPECT_EQ(idem::http::find_header(typed.headers, "Retry-After"), "1");
  const auto typed_body = nlohmann::json::parse(typed.body);
  EXPECT_EQ(typed_body.at("type"), "https://api.example.com/problems/in-progress");
  EXPECT_EQ(typed_body.at("title"), "A request is outstanding for this Idempotency-Key");
  EXPECT_FALSE(typed_body.contains("code"));
  EXPECT_EQ(idem::http::status_of(Refusal::key_missing), 400);
  EXPECT_EQ(idem::http::status_of(Refusal::key_spent), 409);
  EXPECT_EQ(idem::http::status_of(Refusal::store_unavailable), 503);
}

TEST(HttpStored, RoundTripKeepsOnlyAllowedFields) {
  Route route;
  idem::http::Response response;
  response.status = 201;
  response.headers = {{"Content-Type", "application/json"},
                      {"Set-Cookie", "s=1"},
                      {"Location", "/v1/payments/7"},
                      {"Transfer-Encoding", "chunked"},
                      {"X-Request-Id", "r1"}};
  response.body = std::string("{\"id\":7}\0binary", 15);
  const std::string bytes = idem::http::encode_stored(route, response, idem::OutcomeKind::success);
  const auto stored = idem::http::decode_stored(bytes);
  EXPECT_EQ(stored.kind, idem::OutcomeKind::success);
  EXPECT_EQ(stored.response.status, 201);
  EXPECT_EQ(stored.response.body, response.body);
  ASSERT_EQ(stored.response.headers.size(), 2u);
  EXPECT_EQ(stored.response.headers[0].name, "Content-Type");
  EXPECT_EQ(stored.response.headers[1].value, "/v1/payments/7");
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_THROW(idem::http::decode_stored(bytes.substr(0, cut)), idem::DecodeError) << cut;
  }
  EXPECT_THROW(idem::http::decode_stored(bytes + "x"), idem::DecodeError);
}

TEST(HttpStored, OutcomeKinds) {
  const Route route;
  EXPECT_EQ(idem::http::outcome_of(route, 201), idem::OutcomeKind::success);
  EXPECT_EQ(idem::http::outcome_of(route, 302), idem::OutcomeKind::success);
  EXPECT_EQ(idem::http::outcome_of(route, 404), idem::OutcomeKind::failure);
  EXPECT_EQ(idem::http::outcome_of(route, 422), idem::OutcomeKind::failure);
  for (int status : {401, 403, 408, 429, 500, 502, 503, 504}) {
    EXPECT_EQ(idem::http::outcome_of(route, status), idem::OutcomeKind::transient) << status;
  }
}

TEST(HttpDate, ImfFixdate) {
  EXPECT_EQ(idem::http::http_date(idem::WallTime(std::chrono::seconds(784111777))),
            "Sun, 06 Nov 1994 08:49:37 GMT");
}

// ---- options ---------------------------------------------------------------------------------

TEST(HttpOptions, StatusSets) {
  const idem::http::StatusSet set{"404", "5xx", "420-422"};
  EXPECT_TRUE(set.contains(404));
  EXPECT_TRUE(set.contains(599));
  EXPECT_TRUE(set.contains(421));
  EXPECT_FALSE(set.contains(423));
  EXPECT_FALSE(set.contains(-1));
  EXPECT_FALSE(set.contains(1000));
  for (const char* bad : {"6xx", "99", "600", "4x", "500-400", "abc", ""}) {
    EXPECT_THROW(idem::http::StatusSet({bad}), idem::ConfigError) << bad;
  }
}

TEST(HttpOptions, ValidateNamesTheProblem) {
  const auto refused = [](GuardOptions options) -> std::string {
    try {
      idem::http::validate(options);
    } catch (const idem::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  GuardOptions options;
  options.routes.push_back(Route{});
  options.routes.back().name = "pay";
  options.routes.back().path = "payments";
  EXPECT_NE(refused(options).find("route 'pay': path"), std::string::npos) << refused(options);
  options.routes.back().path = "/a/*/b";
  EXPECT_NE(refused(options).find("'*'"), std::string::npos);
  options.routes.back().path = "/a/{id";
  EXPECT_NE(refused(options).find("malformed"), std::string::npos);
  options.routes.back().path = "/a";
  options.routes.back().methods = {};
  EXPECT_NE(refused(options).find("methods"), std::string::npos);
  options.routes.back().methods = {"PO ST"};
  EXPECT_NE(refused(options).find("not a method"), std::string::npos);
  options.routes.back().methods = {"POST"};
  options.routes.back().fingerprint.json_pointers = {"/a"};
  EXPECT_NE(refused(options).find("body = json"), std::string::npos);
  options.routes.back().fingerprint.body = idem::http::BodyFingerprint::json;
  options.routes.back().fingerprint.json_pointers = {"a"};
  EXPECT_NE(refused(options).find("JSON pointer"), std::string::npos);
  options.routes.back().fingerprint.json_pointers = {"/a~2"};
  EXPECT_NE(refused(options).find("JSON pointer"), std::string::npos);
  options.routes.back().fingerprint.json_pointers = {"/a~1b"};
  options.routes.back().policy.lease = std::chrono::milliseconds(0);
  EXPECT_NE(refused(options).find("lease"), std::string::npos);
  options.routes.back().policy.lease = std::chrono::seconds(1);
  EXPECT_EQ(refused(options), "");
  options.key.min_length = 10;
  options.key.max_length = 5;
  EXPECT_NE(refused(options).find("min_length"), std::string::npos);
  options.key = {};
  options.principal.required = true;
  EXPECT_NE(refused(options).find("principal.required"), std::string::npos);
  options.principal.required = false;
  options.key_prefix = std::string(200, 'p');
  EXPECT_NE(refused(options).find("key_prefix"), std::string::npos);
}

// ---- the policy matrix (core) ----------------------------------------------------------------

TEST(DuplicatePolicy, KeepsByKindAndReusePolicy) {
  idem::DuplicatePolicy policy;
  EXPECT_TRUE(idem::keeps(policy, idem::OutcomeKind::success));
  EXPECT_TRUE(idem::keeps(policy, idem::OutcomeKind::failure));
  EXPECT_FALSE(idem::keeps(policy, idem::OutcomeKind::transient));
  policy.keep_transient = true;
  EXPECT_TRUE(idem::keeps(policy, idem::OutcomeKind::transient));
  policy.after_finished = idem::ReusePolicy::rerun_failed;
  EXPECT_TRUE(idem::keeps(policy, idem::OutcomeKind::success));
  EXPECT_FALSE(idem::keeps(policy, idem::OutcomeKind::failure));
  EXPECT_FALSE(idem::keeps(policy, idem::OutcomeKind::transient));
  policy = {};
  policy.keep_failures = false;
  EXPECT_FALSE(idem::keeps(policy, idem::OutcomeKind::failure));
}

TEST(DuplicatePolicy, ParsesAndValidates) {
  EXPECT_EQ(idem::parse_reuse_policy("rerun_failed"), idem::ReusePolicy::rerun_failed);
  EXPECT_EQ(idem::parse_in_progress_policy("join"), idem::InProgressPolicy::wait);
  EXPECT_EQ(idem::parse_in_progress_policy("reject"), idem::InProgressPolicy::reject);
  EXPECT_THROW(idem::parse_reuse_policy("again"), idem::ConfigError);
  EXPECT_THROW(idem::parse_in_progress_policy("\x01"), idem::ConfigError);
  EXPECT_EQ(idem::to_string(idem::ReusePolicy::reject), "reject");
  idem::DuplicatePolicy policy;
  policy.ttl = std::chrono::milliseconds(-1);
  EXPECT_THROW(idem::validate(policy, "r"), idem::ConfigError);
  policy.ttl = std::chrono::milliseconds(0);
  EXPECT_NO_THROW(idem::validate(policy, "r"));
  policy.max_wait = std::chrono::milliseconds(-1);
  EXPECT_THROW(idem::validate(policy, "r"), idem::ConfigError);
}

}  // namespace
