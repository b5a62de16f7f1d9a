#ifndef OPSERVER_COMMON_VALUES_H_
#define OPSERVER_COMMON_VALUES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"

namespace opserver {

// Typed values for people (grpcurl's JSON numbers) <-> element bytes.

// Encodes `values` as elements of `dtype`: floats round to nearest-even
// (FLOAT16/BF16 with one rounding from double), integers and BOOL must be
// exact and in range. INVALID_ARGUMENT (naming the index) otherwise.
absl::StatusOr<std::string> EncodeValues(kernels::DType dtype,
                                         absl::Span<const double> values);

// Decodes `count` elements of `dtype` at `bytes` (exact for every dtype
// except 64-bit integers beyond 2^53).
std::vector<double> DecodeValues(kernels::DType dtype, const void* bytes,
                                 int64_t count);

}  // namespace opserver

#endif  // OPSERVER_COMMON_VALUES_H_
