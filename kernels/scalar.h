// A host scalar as aclCreateScalar describes it: a value and its dtype.
#ifndef OPSERVER_KERNELS_SCALAR_H_
#define OPSERVER_KERNELS_SCALAR_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace opserver::kernels {

// Floating dtypes (FLOAT, FLOAT16, BFLOAT16, DOUBLE) keep their value in `f`;
// integer dtypes and BOOL keep it in `i`. AsDouble() rounds `f` to the
// scalar's own dtype first, so a FLOAT16 scalar built from 0.1 behaves like
// the FLOAT16 value nearest to 0.1, as the bytes aclCreateScalar copies would.
struct Scalar {
  DType dtype = DType::kFloat;
  double f = 0;
  int64_t i = 0;

  static Scalar Float(double value, DType dtype = DType::kFloat) {
    return Scalar{dtype, value, 0};
  }
  static Scalar Int(int64_t value, DType dtype = DType::kInt64) {
    return Scalar{dtype, 0, value};
  }
  static Scalar Bool(bool value) {
    return Scalar{DType::kBool, 0, value ? 1 : 0};
  }

  // Decodes `size` bytes holding one element of `dtype` (little-endian, as
  // aclCreateScalar's `value` pointer). 161002 for an unsupported dtype or a
  // size that is not DTypeSize(dtype).
  static absl::StatusOr<Scalar> FromBytes(DType dtype, const void* bytes,
                                          size_t size);

  // The value as a double (exact for every supported dtype except INT64 and
  // UINT64 magnitudes above 2^53).
  double AsDouble() const;
};

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_SCALAR_H_
