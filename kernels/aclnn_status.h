// aclnn status codes carried inside absl::Status.
//
// Every error the kernels return is an absl::Status whose payload holds the
// aclnn code the original API would have returned, so the server can hand
// the exact number to clients while C++ code keeps using absl::Status.
#ifndef OPSERVER_KERNELS_ACLNN_STATUS_H_
#define OPSERVER_KERNELS_ACLNN_STATUS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace opserver::kernels {

inline constexpr int32_t kAclnnSuccess = 0;
inline constexpr int32_t kAclnnErrParamNullptr = 161001;
inline constexpr int32_t kAclnnErrParamInvalid = 161002;
inline constexpr int32_t kAclnnErrRuntimeError = 361001;
inline constexpr int32_t kAclnnErrInner = 561000;
inline constexpr int32_t kAclnnErrInnerCreateExecutor = 561101;
inline constexpr int32_t kAclnnErrInnerNullptr = 561103;

// Payload type URL under which the aclnn code is stored; the value is the
// code as a decimal string.
inline constexpr absl::string_view kAclnnStatusTypeUrl =
    "type.googleapis.com/opserver.AclnnStatus";

// A non-OK status with `code` and `message` carrying `aclnn_status`.
absl::Status AclnnError(int32_t aclnn_status, absl::StatusCode code,
                        absl::string_view message);

// The aclnn code of `status`: 0 for OK, the payload when present, otherwise
// derived from the canonical code (INVALID_ARGUMENT -> 161002,
// INTERNAL -> 561000, anything else -> 361001).
int32_t GetAclnnStatus(const absl::Status& status);

// 161002 / INVALID_ARGUMENT: any argument check other than a missing one.
absl::Status ParamInvalid(absl::string_view message);

// 161001 / INVALID_ARGUMENT: a required argument is missing.
absl::Status ParamNullptr(absl::string_view message);

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_ACLNN_STATUS_H_
