#ifndef OPSERVER_COMMON_SESSION_ROUTING_H_
#define OPSERVER_COMMON_SESSION_ROUTING_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace opserver {

// Session affinity through an HTTP/2 proxy (docs/pool.md). The client
// library picks a routing key before CreateSession and sends it as this
// metadata on every call it makes for the session: CreateSession, the
// Pipeline channel, unary calls, transfers, data-path tickets and Attach.
// A proxy keeps each key on one backend (HAProxy: a stick table on the
// header). The server remembers the key a session was created with and
// refuses a call carrying another one, so a misrouted call fails clearly.
// The key is random, unrelated to the session id: a proxy's logs of it
// grant nothing. Calls without the header (grpcurl, older clients) are not
// checked.
inline constexpr char kSessionRoutingHeader[] = "x-opserver-session";

// A key is 128 bits as 32 lowercase hex digits.
inline constexpr size_t kSessionRoutingKeyChars = 32;

// A fresh random key (from the system's random device).
std::string NewSessionRoutingKey();

// OK when `key` is a well-formed key; INVALID_ARGUMENT naming the header
// and saying what is wrong otherwise (the bytes are not echoed: they come
// from the wire).
absl::Status CheckSessionRoutingKey(absl::string_view key);

// The NOT_FOUND a server answers a call that carries routing key `key` for
// a session it did not create with that key (unknown here, another
// client's, or created with another key). It names the key, not the
// session id, and says how a proxy must route. `key` is shown escaped and
// shortened when it is not well formed.
absl::Status SessionRoutingKeyNotFound(absl::string_view key);

}  // namespace opserver

#endif  // OPSERVER_COMMON_SESSION_ROUTING_H_
