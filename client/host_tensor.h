// Host-side tensors for tools: typed values <-> raw element bytes, and
// NumPy's .npy format (version 1.0/2.0, little-endian, C order).
#ifndef OPSERVER_CLIENT_HOST_TENSOR_H_
#define OPSERVER_CLIENT_HOST_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"

namespace opserver::remote {

struct HostTensor {
  kernels::DType dtype = kernels::DType::kFloat;
  std::vector<int64_t> shape;
  // Elements in C order, each DTypeSize(dtype) bytes, little-endian.
  std::string bytes;

  int64_t numel() const;
};

// Values as `dtype` elements: FLOAT16/BF16 round to nearest-even; integers
// and BOOL must be exact and in range (INVALID_ARGUMENT naming the value).
absl::StatusOr<std::string> EncodeValues(kernels::DType dtype,
                                         const std::vector<double>& values);
// The elements of `bytes` as doubles.
std::vector<double> DecodeValues(kernels::DType dtype, absl::string_view bytes);

// "1.5,2,-3" -> {1.5, 2, -3}; "nan"/"inf" allowed. INVALID_ARGUMENT naming
// the bad item.
absl::StatusOr<std::vector<double>> ParseNumberList(absl::string_view text);
absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view text);

// aclDataType name ("FLOAT", "FLOAT16", "BF16" or "BFLOAT16", "INT8", ...).
absl::StatusOr<kernels::DType> ParseDType(absl::string_view name);

// .npy files. BF16 has no NumPy dtype and is refused.
absl::StatusOr<HostTensor> ReadNpy(const std::string& path);
absl::Status WriteNpy(const std::string& path, const HostTensor& tensor);

}  // namespace opserver::remote

#endif  // OPSERVER_CLIENT_HOST_TENSOR_H_
