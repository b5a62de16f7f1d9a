#include "runtime/value_requests.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "common/values.h"

namespace opserver {

absl::StatusOr<kernels::DType> CheckValuesDType(int32_t value) {
  if (!kernels::IsKnownDType(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", value, " is not an aclDataType"));
  }
  return static_cast<kernels::DType>(value);
}

absl::StatusOr<std::string> EncodeWriteValues(
    const v1::WriteValuesRequest& request, uint32_t max_values) {
  ASSIGN_OR_RETURN(kernels::DType dtype, CheckValuesDType(request.dtype()));
  if (static_cast<uint64_t>(request.values_size()) > max_values) {
    return absl::ResourceExhaustedError(absl::StrCat(
        request.values_size(), " values exceed the ", max_values,
        " one call may carry (--max_values); use Upload for large tensors"));
  }
  return EncodeValues(dtype, absl::MakeConstSpan(request.values().data(),
                                                 request.values_size()));
}

absl::StatusOr<ValuesRead> CheckReadValues(const v1::ReadValuesRequest& request,
                                           uint32_t max_values) {
  ASSIGN_OR_RETURN(kernels::DType dtype, CheckValuesDType(request.dtype()));
  if (request.count() > max_values) {
    return absl::ResourceExhaustedError(absl::StrCat(
        request.count(), " values exceed the ", max_values,
        " one call may carry (--max_values); use Download for large tensors"));
  }
  ValuesRead read;
  read.dtype = dtype;
  // count <= max_values < 2^32 and elements are at most 8 bytes: no overflow.
  read.bytes = request.count() * kernels::DTypeSize(dtype);
  return read;
}

}  // namespace opserver
