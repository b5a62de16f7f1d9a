// WriteValues and ReadValues without the transport: the checks and the
// typed-values codec the Runtime service's handlers run before they touch
// device memory.
#ifndef OPSERVER_RUNTIME_VALUE_REQUESTS_H_
#define OPSERVER_RUNTIME_VALUE_REQUESTS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "proto/opserver.pb.h"

namespace opserver {

// `value` as a DType; INVALID_ARGUMENT unless it is an aclDataType.
absl::StatusOr<kernels::DType> CheckValuesDType(int32_t value);

// WriteValues: the element bytes of request.values() as request.dtype().
// INVALID_ARGUMENT for an unknown dtype or a value the dtype cannot hold,
// RESOURCE_EXHAUSTED for more than `max_values` values.
absl::StatusOr<std::string> EncodeWriteValues(
    const v1::WriteValuesRequest& request, uint32_t max_values);

// What a ReadValues request reads: `bytes` bytes holding its elements.
struct ValuesRead {
  kernels::DType dtype = kernels::DType::kFloat;
  uint64_t bytes = 0;
};

// ReadValues: INVALID_ARGUMENT for an unknown dtype, RESOURCE_EXHAUSTED for
// a count over `max_values`.
absl::StatusOr<ValuesRead> CheckReadValues(const v1::ReadValuesRequest& request,
                                           uint32_t max_values);

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_VALUE_REQUESTS_H_
