#include "common/values.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/half.h"

namespace opserver {
namespace {

using kernels::DType;

template <typename T>
absl::Status PutInteger(double v, size_t i, DType dtype, char* out) {
  // Compare in double against the type's range; the bounds of 64-bit types
  // are powers of two and so exact in double.
  const double lo = static_cast<double>(std::numeric_limits<T>::min());
  const double hi = std::ldexp(1.0, std::numeric_limits<T>::digits);
  if (!(v == std::trunc(v)) || v < lo || v >= hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("values[", i, "] = ", v, " is not representable as ",
                     kernels::DTypeName(dtype), " (not an integer in range)"));
  }
  T t = static_cast<T>(v);
  std::memcpy(out + i * sizeof(T), &t, sizeof(T));
  return absl::OkStatus();
}

template <typename T>
double Get(const char* bytes, int64_t i) {
  T t;
  std::memcpy(&t, bytes + i * sizeof(T), sizeof(T));
  return static_cast<double>(t);
}

}  // namespace

absl::StatusOr<std::string> EncodeValues(DType dtype,
                                         absl::Span<const double> values) {
  const int64_t size = kernels::DTypeSize(dtype);
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
  std::string out(values.size() * size, '\0');
  char* p = out.data();
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    absl::Status s;
    switch (dtype) {
      case DType::kFloat: {
        float f = static_cast<float>(v);
        std::memcpy(p + i * 4, &f, 4);
        break;
      }
      case DType::kDouble:
        std::memcpy(p + i * 8, &v, 8);
        break;
      case DType::kFloat16: {
        uint16_t h = kernels::DoubleToHalf(v);
        std::memcpy(p + i * 2, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        uint16_t b = kernels::DoubleToBFloat16(v);
        std::memcpy(p + i * 2, &b, 2);
        break;
      }
      case DType::kInt8:
        s = PutInteger<int8_t>(v, i, dtype, p);
        break;
      case DType::kUint8:
        s = PutInteger<uint8_t>(v, i, dtype, p);
        break;
      case DType::kInt16:
        s = PutInteger<int16_t>(v, i, dtype, p);
        break;
      case DType::kUint16:
        s = PutInteger<uint16_t>(v, i, dtype, p);
        break;
      case DType::kInt32:
        s = PutInteger<int32_t>(v, i, dtype, p);
        break;
      case DType::kUint32:
        s = PutInteger<uint32_t>(v, i, dtype, p);
        break;
      case DType::kInt64:
        s = PutInteger<int64_t>(v, i, dtype, p);
        break;
      case DType::kUint64:
        s = PutInteger<uint64_t>(v, i, dtype, p);
        break;
      case DType::kBool:
        if (v != 0 && v != 1) {
          s = absl::InvalidArgumentError(
              absl::StrCat("values[", i, "] = ", v, " is not a BOOL (0 or 1)"));
        } else {
          p[i] = static_cast<char>(v);
        }
        break;
    }
    if (!s.ok()) return s;
  }
  return out;
}

std::vector<double> DecodeValues(DType dtype, const void* bytes,
                                 int64_t count) {
  const char* p = static_cast<const char*>(bytes);
  std::vector<double> out(count);
  for (int64_t i = 0; i < count; ++i) {
    double v = 0;
    switch (dtype) {
      case DType::kFloat:
        v = Get<float>(p, i);
        break;
      case DType::kDouble:
        v = Get<double>(p, i);
        break;
      case DType::kFloat16: {
        uint16_t h;
        std::memcpy(&h, p + i * 2, 2);
        v = kernels::HalfToFloat(h);
        break;
      }
      case DType::kBFloat16: {
        uint16_t b;
        std::memcpy(&b, p + i * 2, 2);
        v = kernels::BFloat16ToFloat(b);
        break;
      }
      case DType::kInt8:
        v = Get<int8_t>(p, i);
        break;
      case DType::kUint8:
        v = Get<uint8_t>(p, i);
        break;
      case DType::kInt16:
        v = Get<int16_t>(p, i);
        break;
      case DType::kUint16:
        v = Get<uint16_t>(p, i);
        break;
      case DType::kInt32:
        v = Get<int32_t>(p, i);
        break;
      case DType::kUint32:
        v = Get<uint32_t>(p, i);
        break;
      case DType::kInt64:
        v = Get<int64_t>(p, i);
        break;
      case DType::kUint64:
        v = Get<uint64_t>(p, i);
        break;
      case DType::kBool:
        v = p[i] != 0 ? 1 : 0;
        break;
    }
    out[i] = v;
  }
  return out;
}

}  // namespace opserver
