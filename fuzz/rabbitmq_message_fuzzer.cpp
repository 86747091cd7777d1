// AMQP message → idem::Event: what a consumer makes of whatever a sender put on the wire.
// The input is [2-byte length][encoded basic properties][body]: the properties are decoded by
// rabbitmq-c's own amqp_decode_properties (as when a content header frame arrives), read into a
// Delivery by the consumer's read_message(), and turned into an Event (or a malformed reason) by
// event_from_delivery(). Invariants: nothing throws; a well-formed result has a valid key as its
// id and the body as its payload; a message without message_id is always malformed.
#include <amqp.h>
#include <amqp_framing.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "amqp_connection.hpp"
#include "fuzz_support.hpp"
#include "idem/key.hpp"
#include "internal.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t header = static_cast<std::size_t>(data[0]) << 8 | data[1];
  if (header > size - 2) return 0;
  amqp_pool_t pool;
  init_amqp_pool(&pool, 4096);
  void* decoded = nullptr;
  amqp_bytes_t encoded{header, const_cast<std::uint8_t*>(data + 2)};
  if (amqp_decode_properties(AMQP_BASIC_CLASS, &pool, encoded, &decoded) != AMQP_STATUS_OK ||
      decoded == nullptr) {
    empty_amqp_pool(&pool);
    return 0;
  }
  amqp_message_t message{};
  message.properties = *static_cast<amqp_basic_properties_t*>(decoded);
  message.body = amqp_bytes_t{size - 2 - header, const_cast<std::uint8_t*>(data + 2 + header)};

  idem::rabbitmq::detail::Delivery delivery;
  delivery.routing_key = "order.paid";
  try {
    idem::rabbitmq::detail::read_message(message, delivery);
    const auto incoming = idem::rabbitmq::detail::event_from_delivery(delivery);
    if (incoming.event) {
      if (!idem::is_valid_key(incoming.event->id)) idem::fuzz::fail("an invalid id was accepted");
      if (incoming.event->payload != delivery.body) idem::fuzz::fail("the body was changed");
      if (incoming.event->type.empty()) idem::fuzz::fail("an event without a type");
    } else if (incoming.malformed_reason.rfind("malformed: ", 0) != 0) {
      idem::fuzz::fail("a rejected message without a malformed: reason");
    }
    if (!delivery.message_id && incoming.event) idem::fuzz::fail("no message_id, yet an event");
  } catch (const std::exception& e) {
    idem::fuzz::fail(std::string("threw: ") + e.what());
  }
  empty_amqp_pool(&pool);
  return 0;
}
