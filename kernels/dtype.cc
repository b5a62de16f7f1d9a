#include "kernels/dtype.h"

namespace opserver::kernels {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat:
      return "FLOAT";
    case DType::kFloat16:
      return "FLOAT16";
    case DType::kInt8:
      return "INT8";
    case DType::kInt32:
      return "INT32";
    case DType::kUint8:
      return "UINT8";
    case DType::kInt16:
      return "INT16";
    case DType::kUint16:
      return "UINT16";
    case DType::kUint32:
      return "UINT32";
    case DType::kInt64:
      return "INT64";
    case DType::kUint64:
      return "UINT64";
    case DType::kDouble:
      return "DOUBLE";
    case DType::kBool:
      return "BOOL";
    case DType::kBFloat16:
      return "BFLOAT16";
  }
  return "UNKNOWN";
}

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
    case DType::kUint8:
    case DType::kBool:
      return 1;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16:
    case DType::kUint16:
      return 2;
    case DType::kFloat:
    case DType::kInt32:
    case DType::kUint32:
      return 4;
    case DType::kInt64:
    case DType::kUint64:
    case DType::kDouble:
      return 8;
  }
  return 0;
}

bool IsKnownDType(int32_t value) {
  return DTypeSize(static_cast<DType>(value)) != 0;
}

bool IsFloating(DType dtype) {
  return dtype == DType::kFloat || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16 || dtype == DType::kDouble;
}

}  // namespace opserver::kernels
