#include "idem/fingerprint.hpp"

#include <openssl/evp.h>

namespace idem::detail {

namespace {

std::string digest_hex(std::string_view data, const EVP_MD* algorithm, std::string_view name) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &length, algorithm, nullptr) != 1 ||
      static_cast<int>(length) != EVP_MD_get_size(algorithm)) {
    throw Error(ErrorCode::invalid_argument, "idem: " + std::string(name) + " failed (libcrypto)");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0x0f]);
  }
  return hex;
}

// The algorithm fetched once: EVP_sha256() makes OpenSSL 3 look the implementation up again on
// every digest (a lock and a property query), and every keyed call fingerprints its arguments.
const EVP_MD* fetched_sha256() {
  static const EVP_MD* const md = [] {
    const EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return fetched != nullptr ? fetched : EVP_sha256();
  }();
  return md;
}

}  // namespace

std::string sha256_hex(std::string_view data) {
  return digest_hex(data, fetched_sha256(), "SHA-256");
}

std::string sha1_hex(std::string_view data) {
  return digest_hex(data, EVP_sha1(), "SHA-1");
}

}  // namespace idem::detail
