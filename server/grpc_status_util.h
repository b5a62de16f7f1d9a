#ifndef OPSERVER_SERVER_GRPC_STATUS_UTIL_H_
#define OPSERVER_SERVER_GRPC_STATUS_UTIL_H_

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace opserver {

// The one place where absl::Status becomes grpc::Status. Every RPC handler
// finishes through this, so codes and messages are converted identically
// everywhere. The canonical codes have the same numbering in both libraries.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace opserver

#endif  // OPSERVER_SERVER_GRPC_STATUS_UTIL_H_
