// What the client library's sources share and nothing else sees: the
// wording of an unknown handle and every unary call's preamble (deadline,
// token, routing key, status). Private to //client:client.
#ifndef OPSERVER_CLIENT_CLIENT_CALLS_H_
#define OPSERVER_CLIENT_CLIENT_CALLS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/session_routing.h"
#include "grpcpp/grpcpp.h"

namespace opserver {
namespace remote {

// NOT_FOUND for a handle this session does not have, as the server words
// it; `what` prefixes the message (e.g. "Free: ").
inline absl::Status UnknownHandle(absl::string_view what, absl::string_view kind,
                           uint64_t handle) {
  return absl::NotFoundError(absl::StrCat(
      what, "no ", kind, " ", handle,
      " in this session (never created, freed, or another session's)"));
}

inline v1::DataType ToProtoDType(kernels::DType dtype) {
  return static_cast<v1::DataType>(static_cast<int32_t>(dtype));
}

inline v1::Runtime::Stub& StubOf(Client& client, v1::Runtime::Stub*) {
  return client.runtime();
}
inline v1::Operators::Stub& StubOf(Client& client, v1::Operators::Stub*) {
  return client.operators();
}

// Every unary call of the client: a fresh context with the per-call
// deadline (`wait`: ConnectOptions::wait_timeout, for calls that wait for
// device work) and the token, the call, and its status through
// FromGrpcStatus with `what` naming the call.
// `routing_key` (empty: none) is sent as the session's routing key.
template <typename Stub, typename Request, typename Response>
absl::Status Unary(Client& client, const std::string& routing_key,
                   grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                const Request&, Response*),
                   const Request& request, Response* response,
                   absl::string_view what, bool wait = false,
                   std::optional<absl::Duration> within = std::nullopt) {
  grpc::ClientContext context;
  if (!routing_key.empty()) {
    context.AddMetadata(kSessionRoutingHeader, routing_key);
  }
  if (within.has_value()) {
    // A caller's own time-out (aclrtSynchronizeEventWithTimeout).
    context.set_deadline(absl::ToChronoTime(absl::Now() + *within));
    client.Authorize(&context);
  } else if (wait) {
    client.SetWaitDeadline(&context);
  } else {
    client.SetDeadline(&context);
  }
  return client.CallStatus((StubOf(client, static_cast<Stub*>(nullptr)).*
                            method)(&context, request, response),
                           context, what);
}

}  // namespace remote
}  // namespace opserver

#endif  // OPSERVER_CLIENT_CLIENT_CALLS_H_
