#ifndef OPSERVER_SERVER_ROUTING_KEY_H_
#define OPSERVER_SERVER_ROUTING_KEY_H_

#include <optional>
#include <string>

#include "grpcpp/server_context.h"

namespace opserver {

// The call's session routing key (the x-opserver-session metadata,
// common/session_routing.h), as sent, when it carries one: what
// SessionManager remembers at CreateSession and checks on every later
// call. The first value when the header is repeated (gRPC bounds the
// metadata's size).
std::optional<std::string> SessionRoutingKeyOf(
    const grpc::ServerContextBase* context);

}  // namespace opserver

#endif  // OPSERVER_SERVER_ROUTING_KEY_H_
