#include "kernels/aclnn_status.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"

namespace opserver::kernels {

absl::Status AclnnError(int32_t aclnn_status, absl::StatusCode code,
                        absl::string_view message) {
  absl::Status status(code, message);
  // An OK code cannot carry a payload; callers asking for an error with
  // code OK get an internal error rather than a silent success.
  if (status.ok()) status = absl::Status(absl::StatusCode::kInternal, message);
  status.SetPayload(kAclnnStatusTypeUrl,
                    absl::Cord(std::to_string(aclnn_status)));
  return status;
}

int32_t GetAclnnStatus(const absl::Status& status) {
  if (status.ok()) return kAclnnSuccess;
  if (auto payload = status.GetPayload(kAclnnStatusTypeUrl)) {
    int32_t value = 0;
    if (absl::SimpleAtoi(std::string(*payload), &value)) return value;
  }
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return kAclnnErrParamInvalid;
    case absl::StatusCode::kInternal:
      return kAclnnErrInner;
    default:
      return kAclnnErrRuntimeError;
  }
}

absl::Status ParamInvalid(absl::string_view message) {
  return AclnnError(kAclnnErrParamInvalid, absl::StatusCode::kInvalidArgument,
                    message);
}

absl::Status ParamNullptr(absl::string_view message) {
  return AclnnError(kAclnnErrParamNullptr, absl::StatusCode::kInvalidArgument,
                    message);
}

}  // namespace opserver::kernels
