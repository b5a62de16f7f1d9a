#include "kernels/scalar.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/aclnn_status.h"
#include "kernels/half.h"

namespace opserver::kernels {
namespace {

template <typename T>
T Read(const void* bytes) {
  T v;
  std::memcpy(&v, bytes, sizeof(T));
  return v;
}

}  // namespace

absl::StatusOr<Scalar> Scalar::FromBytes(DType dtype, const void* bytes,
                                         size_t size) {
  if (!IsKnownDType(static_cast<int32_t>(dtype))) {
    return ParamInvalid(
        absl::StrCat("scalar has unknown dtype ", static_cast<int32_t>(dtype)));
  }
  if (bytes == nullptr) return ParamNullptr("scalar value is null");
  if (static_cast<int64_t>(size) != DTypeSize(dtype)) {
    return ParamInvalid(absl::StrCat("scalar of dtype ", DTypeName(dtype),
                                     " needs ", DTypeSize(dtype),
                                     " bytes, got ", size));
  }
  switch (dtype) {
    case DType::kFloat:
      return Float(Read<float>(bytes), dtype);
    case DType::kFloat16:
      return Float(HalfToFloat(Read<uint16_t>(bytes)), dtype);
    case DType::kBFloat16:
      return Float(BFloat16ToFloat(Read<uint16_t>(bytes)), dtype);
    case DType::kDouble:
      return Float(Read<double>(bytes), dtype);
    case DType::kInt8:
      return Int(Read<int8_t>(bytes), dtype);
    case DType::kUint8:
      return Int(Read<uint8_t>(bytes), dtype);
    case DType::kInt16:
      return Int(Read<int16_t>(bytes), dtype);
    case DType::kUint16:
      return Int(Read<uint16_t>(bytes), dtype);
    case DType::kInt32:
      return Int(Read<int32_t>(bytes), dtype);
    case DType::kUint32:
      return Int(Read<uint32_t>(bytes), dtype);
    case DType::kInt64:
      return Int(Read<int64_t>(bytes), dtype);
    case DType::kUint64:
      // Stored bit-for-bit; AsDouble() reinterprets as unsigned.
      return Int(static_cast<int64_t>(Read<uint64_t>(bytes)), dtype);
    case DType::kBool:
      return Bool(Read<uint8_t>(bytes) != 0);
  }
  return ParamInvalid("scalar has unknown dtype");
}

double Scalar::AsDouble() const {
  switch (dtype) {
    case DType::kFloat:
      return static_cast<float>(f);
    case DType::kFloat16:
      return HalfToFloat(DoubleToHalf(f));
    case DType::kBFloat16:
      return BFloat16ToFloat(DoubleToBFloat16(f));
    case DType::kDouble:
      return f;
    case DType::kUint64:
      return static_cast<double>(static_cast<uint64_t>(i));
    case DType::kBool:
      return i != 0 ? 1.0 : 0.0;
    default:
      return static_cast<double>(i);
  }
}

}  // namespace opserver::kernels
