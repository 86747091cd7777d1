// TLS settings of a client connection: the CA to trust, an optional client certificate and key,
// the name the server's certificate must carry, whether to verify it. One struct for every
// backend that speaks TLS through idem::net: idem::redis::RedisTlsOptions and
// idem::net::TlsOptions are other names of it. A plain value, no OpenSSL here: a header of a
// backend's options includes it without pulling in idem::net.
//
// Thread-safety: a plain value; copy it freely.
#pragma once

#include <optional>
#include <string>

namespace idem {

struct TlsOptions {
  // PEM file of the CA certificate(s) the server's chain must lead to, and/or a directory of
  // hashed CA certificates (c_rehash / openssl rehash). Both empty: the system's default CA store
  // (OpenSSL's default verify paths).
  std::string ca_file{};
  std::string ca_dir{};
  // Client certificate (PEM, may hold the chain) and its private key (PEM), for servers that
  // require one (Redis: --tls-auth-clients yes). key_file empty: the key is in cert_file.
  std::string cert_file{};
  std::string key_file{};
  // Passphrase of an encrypted key_file. Never printed.
  std::optional<std::string> key_password{};
  // The name the server's certificate must carry, also sent as SNI when it is a DNS name. Empty:
  // the host connected to. Set it when connecting by IP address to a server whose certificate
  // names a DNS name.
  std::string server_name{};
  // false: encrypt without checking the certificate or its name — only where the network itself
  // is trusted (tests). Default true.
  bool verify_peer = true;
};

}  // namespace idem
