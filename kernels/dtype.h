// Element types as aclnn numbers them (aclDataType), so that values travel
// unchanged between the aclnn-style API, the wire protocol and the kernels.
#ifndef OPSERVER_KERNELS_DTYPE_H_
#define OPSERVER_KERNELS_DTYPE_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace opserver::kernels {

// The numeric values are aclDataType's; never renumber them.
enum class DType : int32_t {
  kFloat = 0,
  kFloat16 = 1,
  kInt8 = 2,
  kInt32 = 3,
  kUint8 = 4,
  kInt16 = 6,
  kUint16 = 7,
  kUint32 = 8,
  kInt64 = 9,
  kUint64 = 10,
  kDouble = 11,
  kBool = 12,
  kBFloat16 = 27,
};

// aclDataType name without the ACL_ prefix ("FLOAT", "FLOAT16", "BFLOAT16",
// "INT8", ...); "UNKNOWN(<n>)" is never returned: unknown values give
// "UNKNOWN".
absl::string_view DTypeName(DType dtype);

// Bytes per element; 0 for a value that is not a known DType.
int64_t DTypeSize(DType dtype);

// True when `value` is one of the enumerators above.
bool IsKnownDType(int32_t value);

// FLOAT, FLOAT16, BFLOAT16 and DOUBLE.
bool IsFloating(DType dtype);

// The dtype a binary floating operator computes in: the operands' common
// dtype, else DOUBLE if either is, else FLOAT.
constexpr DType PromoteDType(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::kDouble || b == DType::kDouble) return DType::kDouble;
  return DType::kFloat;
}

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_DTYPE_H_
