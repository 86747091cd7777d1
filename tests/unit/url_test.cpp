// The URL toolkit idem::open, RedisOptions::from_url and the RabbitMQ transport share
// (url/idem_url.hpp): its parts, its checks and the words of its problems, without any of them.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <string_view>

#include "idem_url.hpp"

namespace {

using namespace idem::detail;

// Failures as "<part>|<problem>", so a test sees which is which.
class Recorded final : public UrlErrors {
 private:
  void throw_error(std::string_view part, std::string_view problem) const override {
    throw std::runtime_error(std::string(part) + "|" + std::string(problem));
  }
};

template <class F>
std::string failure(F&& parse) {
  try {
    parse();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no failure";
  return {};
}

const Recorded errors{};

TEST(UrlToolkit, SplitsTheSchemeInLowerCase) {
  const SplitUrl split = split_scheme(errors, "AMQPS://h/v", "amqp:// or amqps://");
  EXPECT_EQ(split.scheme, "amqps");
  EXPECT_EQ(split.rest, "//h/v");
  EXPECT_EQ(failure([] { split_scheme(errors, "", "x://"); }), "scheme|is missing (expected x://)");
  EXPECT_EQ(failure([] { split_scheme(errors, "/tmp/a", "x://"); }),
            "scheme|is missing (expected x://)");
  EXPECT_EQ(failure([] { split_scheme(errors, "1a://h", "x://"); }),
            "scheme|'1a' is not a URL scheme (expected x://)");
}

TEST(UrlToolkit, SplitsTheLocation) {
  UrlLocation location = split_location(errors, "//u:p@h:1/db?a=1&b=2", "x://h");
  EXPECT_EQ(location.authority, "u:p@h:1");
  EXPECT_EQ(location.path, "/db");
  EXPECT_EQ(location.query, "a=1&b=2");
  location = split_location(errors, "//h?a=/b", "x://h");  // a '/' in the query is no path
  EXPECT_EQ(location.authority, "h");
  EXPECT_EQ(location.path, "");
  EXPECT_EQ(location.query, "a=/b");
  EXPECT_NE(failure([] { split_location(errors, "h/db", "x://h/db"); }).find("authority|"),
            std::string::npos);
  EXPECT_NE(failure([] { split_location(errors, "//h/db#x", "x://h"); }).find("fragment|"),
            std::string::npos);
}

TEST(UrlToolkit, SplitsTheUserInfoAtTheLastAt) {
  Authority authority = split_authority(errors, "al%69ce:p@ss:w@h:1");
  ASSERT_TRUE(authority.user_info);
  EXPECT_EQ(authority.user_info->user, "alice");
  EXPECT_EQ(authority.user_info->password, "p@ss:w");
  EXPECT_EQ(authority.hosts, "h:1");
  authority = split_authority(errors, "bob@h");
  ASSERT_TRUE(authority.user_info);
  EXPECT_EQ(authority.user_info->user, "bob");
  EXPECT_FALSE(authority.user_info->password);
  EXPECT_FALSE(split_authority(errors, "h").user_info);
  // A malformed escape in the password names the password, never its text.
  const std::string message = failure([] { split_authority(errors, "u:hunter2%zz@h"); });
  EXPECT_EQ(message.rfind("password|has a malformed %-escape", 0), 0u) << message;
  EXPECT_EQ(message.find("hunter2"), std::string::npos) << message;
}

TEST(UrlToolkit, ParsesHostsPortsAndIpv6) {
  HostPort node = parse_host_port(errors, "cache.internal:6380");
  EXPECT_EQ(node.host, "cache.internal");
  EXPECT_EQ(node.port, 6380);
  node = parse_host_port(errors, "[::1]:7001");
  EXPECT_EQ(node.host, "::1");
  EXPECT_EQ(node.port, 7001);
  node = parse_host_port(errors, "[fe80::1%25eth0]");
  EXPECT_EQ(node.host, "fe80::1%eth0");
  EXPECT_FALSE(node.port);
  EXPECT_EQ(parse_host_port(errors, "h:65535").port, 65535);
  EXPECT_EQ(parse_host_port(errors, "h:1").port, 1);

  EXPECT_EQ(failure([] { parse_host_port(errors, ""); }), "host|is missing");
  EXPECT_EQ(failure([] { parse_host_port(errors, ":6379"); }), "host|is missing");
  EXPECT_EQ(failure([] { parse_host_port(errors, "[]:1"); }), "host|is missing");
  EXPECT_EQ(failure([] { parse_host_port(errors, "[::1"); }), "host '[::1'|misses ']'");
  EXPECT_EQ(failure([] { parse_host_port(errors, "[::1]x"); }),
            "host '[::1]'|is followed by 'x' (only :port may come after the host)");
  EXPECT_NE(failure([] { parse_host_port(errors, "h[x]"); }).find("outside an IPv6 address"),
            std::string::npos);
  EXPECT_EQ(failure([] { parse_host_port(errors, "h:"); }), "port|is empty");
  EXPECT_EQ(failure([] { parse_host_port(errors, "[::1]:"); }), "port|is empty");
  EXPECT_EQ(failure([] { parse_host_port(errors, "h:abc"); }),
            "port 'abc'|is not a number (expected 1..65535)");
  EXPECT_EQ(failure([] { parse_host_port(errors, "h:-1"); }),
            "port '-1'|is not a number (expected 1..65535)");
  EXPECT_EQ(failure([] { parse_host_port(errors, "h:0"); }), "port|must be 1..65535, got '0'");
  EXPECT_EQ(failure([] { parse_host_port(errors, "h:65536"); }),
            "port|must be 1..65535, got '65536'");
  EXPECT_EQ(failure([] { parse_host_port(errors, "h:99999999999999999999999"); }),
            "port|must be 1..65535, got '99999999999999999999999'");
}

TEST(UrlToolkit, PercentDecodes) {
  EXPECT_EQ(percent_decode(errors, "%7Bapp%7d:%20x", "prefix"), "{app}: x");
  EXPECT_EQ(failure([] { percent_decode(errors, "ab%4", "path"); }),
            "path|has a malformed %-escape at offset 2 (expected % and two hex digits)");
  EXPECT_EQ(failure([] { percent_decode(errors, "%zz", "path"); }).substr(0, 5), "path|");
  EXPECT_EQ(failure([] { percent_decode(errors, "a%00b", "path"); }),
            "path|contains a NUL byte (%00)");
  EXPECT_EQ(lenient_percent_decode("%41%zz%4"), "A%zz%4");
}

TEST(UrlToolkit, ParsesTheQuery) {
  const auto parameters = parse_query(errors, "a=1&&b%5Fc=x%20y&");
  ASSERT_EQ(parameters.size(), 2u);
  EXPECT_EQ(parameters[0].name, "a");
  EXPECT_EQ(parameters[0].value, "1");
  EXPECT_EQ(parameters[1].name, "b_c");
  EXPECT_EQ(parameters[1].value, "x y");
  EXPECT_EQ(parameters[1].raw, "b%5Fc=x%20y");
  EXPECT_TRUE(parse_query(errors, "").empty());
  EXPECT_EQ(failure([] { parse_query(errors, "a"); }),
            "query parameter 'a'|has no value (expected name=value)");
  EXPECT_EQ(failure([] { parse_query(errors, "a=1&a=2"); }), "query parameter 'a'|is given twice");
  EXPECT_EQ(failure([] { parse_query(errors, "=1"); }), "query|a parameter has no name ('=1')");
}

TEST(UrlToolkit, ReadsTypedValues) {
  const auto parameters = parse_query(errors, "n=12&b=0&d=1500ms&x=-1");
  EXPECT_EQ(count_value(errors, parameters[0], 1, 100), 12u);
  EXPECT_FALSE(bool_value(errors, parameters[1]));
  EXPECT_EQ(duration_value(errors, parameters[2]), std::chrono::milliseconds(1500));
  EXPECT_EQ(failure([&] { count_value(errors, parameters[0], 1, 10); }),
            "query parameter 'n'|must be a whole number from 1 to 10, got '12'");
  EXPECT_EQ(whole_number(errors, "n", "18446744073709551615"), 18446744073709551615u);
  EXPECT_EQ(failure([] { whole_number(errors, "n", "-1"); }),
            "n|must be a non-negative integer, got '-1'");
  EXPECT_EQ(failure([] { whole_number(errors, "n", "11", 10); }),
            "n|must be a non-negative integer, got '11'");
  EXPECT_EQ(failure([&] { unknown_parameter(errors, parameters[3], "x:", "n, b"); }),
            "query parameter 'x'|is not known for x: (known: n, b)");
}

TEST(UrlToolkit, FindsEverySecret) {
  EXPECT_EQ(redact_url_secrets("redis://u:pw@h/0?password=a&sslPassword=b&c=d"),
            "redis://u:***@h/0?password=***&sslPassword=***&c=d");
  EXPECT_EQ(redact_url_secrets("amqp://a:b:c@h/v"), "amqp://a:***@h/v");
  EXPECT_EQ(redact_url_secrets("redis:u:pw@host/0"), "redis:u:***@host/0");  // "//" forgotten
  EXPECT_EQ(redact_url_secrets("alice:pw@host"), "alice:***@host");          // no scheme
  EXPECT_EQ(redact_url_secrets("amqp://user@h/"), "amqp://user@h/");
  EXPECT_EQ(redact_url_secrets("garbage"), "garbage");
  EXPECT_EQ(redact_url_secrets(std::string_view("a\0b", 3)), std::string("a\0b", 3));  // as is
  const auto spans = url_secret_spans("x://u:pw@h?password=s");
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0], std::make_pair(std::size_t{6}, std::size_t{8}));
  EXPECT_EQ(spans[1], std::make_pair(std::size_t{20}, std::size_t{21}));
}

}  // namespace
