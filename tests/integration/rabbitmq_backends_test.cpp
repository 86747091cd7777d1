// The idempotent handlers plug into the RabbitMQ consumer unchanged on the server recorders:
// every event published twice on purpose runs its side effect once with Redis and PostgreSQL
// recorders opened by URL (check_then_mark and exclusive on both, transactional on PostgreSQL).
// Memory and SQLite are covered by rabbitmq_transport_test.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "idem/handler.hpp"
#include "idem/open.hpp"
#include "rabbitmq_test_env.hpp"
#include "rabbitmq_test_handlers.hpp"

IDEM_RABBITMQ_TEST_ENVIRONMENT();

namespace {

struct BackendCase {
  std::string name;
  std::string url_variable;  // IDEM_TEST_REDIS_URL or IDEM_TEST_POSTGRES_URL
  idem::HandlerMode mode;
};

class RabbitMqBackendTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  idem::test::TestTopology topology_;
  idem::rabbitmq::ConnectionOptions connection_ = idem::test::amqp_test_options();
};

TEST_P(RabbitMqBackendTest, AnEventPublishedTwiceRunsItsSideEffectOnce) {
  const BackendCase& param = GetParam();
  std::string url = idem::test::env(param.url_variable.c_str());
  if (url.empty()) IDEM_SERVER_MISSING(param.url_variable << " is not set");
  if (param.url_variable == "IDEM_TEST_REDIS_URL") {
    url += "?prefix=idemtest:rmq:" + idem::new_event_id().substr(0, 12) + ":";
  }
  idem::test::expect_events_published_twice_run_once(topology_, connection_, "dup-" + param.name,
                                                     idem::open_recorder(url), param.mode);
}

INSTANTIATE_TEST_SUITE_P(
    Recorders, RabbitMqBackendTest,
    ::testing::Values(
        BackendCase{"redis_check", "IDEM_TEST_REDIS_URL", idem::HandlerMode::check_then_mark},
        BackendCase{"redis_exclusive", "IDEM_TEST_REDIS_URL", idem::HandlerMode::exclusive},
        BackendCase{"postgres_check", "IDEM_TEST_POSTGRES_URL", idem::HandlerMode::check_then_mark},
        BackendCase{"postgres_exclusive", "IDEM_TEST_POSTGRES_URL", idem::HandlerMode::exclusive},
        BackendCase{"postgres_transactional", "IDEM_TEST_POSTGRES_URL",
                    idem::HandlerMode::transactional}),
    [](const ::testing::TestParamInfo<BackendCase>& case_info) { return case_info.param.name; });

}  // namespace
