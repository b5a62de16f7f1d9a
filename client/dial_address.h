// What a client checks about a server address before and after dialing it,
// so that a mistyped address or a refused connection is an immediate error
// that says what is wrong, not a wait for the connect time-out followed by
// a bare "cannot reach" (the first-hour review, problem 4).
#ifndef OPSERVER_CLIENT_DIAL_ADDRESS_H_
#define OPSERVER_CLIENT_DIAL_ADDRESS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/listen_address.h"

namespace opserver {
namespace remote {

// OK for HOST:PORT (PORT 1..65535) and for gRPC's own target forms
// ("dns:///host:port", "unix:/path", "ipv4:...", ...); INVALID_ARGUMENT
// naming the address and the mistake otherwise: empty, a URL
// ("http://host:port"), a missing or zero port, an empty host.
absl::Status CheckDialAddress(absl::string_view address);

// The HOST:PORT of `address`, or nothing for gRPC's target forms.
std::optional<ListenAddress> DialHostPort(absl::string_view address);

// Why a TCP connection to `address` cannot be made, in words ("connection
// refused", "host unreachable", "no answer within 2s", "host name does not
// resolve: ..."), or nothing when one can (something listens there).
std::optional<std::string> TcpConnectFailure(const ListenAddress& address,
                                             absl::Duration timeout);

}  // namespace remote
}  // namespace opserver

#endif  // OPSERVER_CLIENT_DIAL_ADDRESS_H_
