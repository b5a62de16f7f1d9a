#ifndef OPSERVER_COMMON_LISTEN_ADDRESS_H_
#define OPSERVER_COMMON_LISTEN_ADDRESS_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace opserver {

// A TCP address to listen on, split into its parts.
struct ListenAddress {
  std::string host;  // "127.0.0.1", "localhost", "::1" (no brackets), ...
  int port = 0;      // 0 asks the kernel for a free port.

  // "host:port" with IPv6 hosts in brackets, as gRPC expects it.
  std::string ToString() const;
};

// Parses "HOST:PORT" or "[IPV6]:PORT". HOST is a name or address literal
// (letters, digits, '.', '-', '_'); PORT is 0..65535 in decimal. Returns
// INVALID_ARGUMENT with a message saying what is wrong.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text);

// The longest HOST:PORT ParseConnectAddress takes: a DNS name's 253 bytes
// and ":65535".
inline constexpr size_t kMaxConnectAddressBytes = 259;

// Parses an address to connect to, as ParseListenAddress does, but PORT
// is 1..65535, HOST is no wildcard (0.0.0.0, ::: they listen everywhere
// but are nowhere to dial) and the whole is at most
// kMaxConnectAddressBytes. The address may come from a peer (the server's
// OpenDataTransferResponse.address, which the client checks with this as
// the server checks its --data_advertise), so the INVALID_ARGUMENT message
// quotes `text` escaped, and not at all when it is too long.
absl::StatusOr<ListenAddress> ParseConnectAddress(absl::string_view text);

// Whether `address` only accepts connections from this machine: an IPv4
// address in 127.0.0.0/8, ::1 (or an IPv4-mapped loopback), or "localhost".
// Any other name counts as non-loopback: what it resolves to may change.
bool IsLoopback(const ListenAddress& address);

// Binds (and closes again) a TCP socket on every address `address` resolves
// to, so that a port already in use is reported with the OS's reason before
// gRPC is involved. Returns UNAVAILABLE ("... Address already in use") or
// INVALID_ARGUMENT for a host that does not resolve.
absl::Status ProbeBind(const ListenAddress& address);

}  // namespace opserver

#endif  // OPSERVER_COMMON_LISTEN_ADDRESS_H_
