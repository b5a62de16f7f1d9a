#include "server/grpc_status_util.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/aclnn_status.h"
#include "server/log.h"

namespace opserver {

grpc::Status ToGrpcStatus(const absl::Status& status,
                          grpc::ServerContextBase* context) {
  if (status.ok()) return grpc::Status::OK;
  const int32_t aclnn = kernels::GetAclnnStatus(status);
  if (context != nullptr) {
    context->AddTrailingMetadata(kAclnnStatusMetadataKey,
                                 std::to_string(aclnn));
  }
  // The server's one log line per failed call.
  LogLine(absl::StrCat("call failed: ", absl::StatusCodeToString(status.code()),
                       " (aclnn ", aclnn, "): ", status.message()));
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace opserver
