#include "bench/soak_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/half.h"
#include "kernels/kernel_params.h"
#include "kernels/ops/dropout_backward.h"
#include "kernels/ops/hardswish_backward.h"
#include "kernels/ops/leaky_relu_backward.h"
#include "kernels/ops/softshrink_backward.h"
#include "kernels/ops/threshold_backward.h"

namespace opserver::soak {
namespace {

// Integer self against a real threshold, as the kernels compare it.
template <class TI>
double IntThreshold(const kernels::KernelParams& kp, double g, double x) {
  const kernels::IntThresholdFormula<TI> f(kp);
  using Whole = typename kernels::IntThresholdFormula<TI>::Whole;
  if (f.whole == Whole::kAllZero) return 0;
  if (f.whole == Whole::kAllPass) return g;
  return f(static_cast<TI>(g), static_cast<TI>(x));
}

}  // namespace

int DSize(DataType dt) {
  switch (dt) {
    case v1::FLOAT:
    case v1::INT32:
    case v1::UINT32:
      return 4;
    case v1::DOUBLE:
    case v1::INT64:
    case v1::UINT64:
      return 8;
    case v1::FLOAT16:
    case v1::BF16:
    case v1::INT16:
    case v1::UINT16:
      return 2;
    default:
      return 1;
  }
}

bool IsIntegral(DataType dt) {
  return dt == v1::INT32 || dt == v1::INT8 || dt == v1::UINT8;
}

void EncodeValue(DataType dt, double v, char* p) {
  switch (dt) {
    case v1::FLOAT: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case v1::DOUBLE:
      std::memcpy(p, &v, 8);
      break;
    case v1::FLOAT16: {
      uint16_t h = kernels::FloatToHalf(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case v1::BF16: {
      uint16_t b = kernels::FloatToBFloat16(static_cast<float>(v));
      std::memcpy(p, &b, 2);
      break;
    }
    case v1::INT32: {
      int32_t i = static_cast<int32_t>(v);
      std::memcpy(p, &i, 4);
      break;
    }
    case v1::INT8:
      *p = static_cast<char>(static_cast<int8_t>(v));
      break;
    default:  // UINT8 (the mask too)
      *p = static_cast<char>(static_cast<uint8_t>(v));
      break;
  }
}

double DecodeValue(DataType dt, const char* p) {
  switch (dt) {
    case v1::FLOAT: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case v1::DOUBLE: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case v1::FLOAT16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return kernels::HalfToFloat(h);
    }
    case v1::BF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return kernels::BFloat16ToFloat(b);
    }
    case v1::INT32: {
      int32_t i;
      std::memcpy(&i, p, 4);
      return i;
    }
    case v1::INT8:
      return static_cast<int8_t>(*p);
    default:
      return static_cast<uint8_t>(*p);
  }
}

double RoundTo(DataType dt, double v) {
  char bytes[8];
  EncodeValue(dt, v, bytes);
  return DecodeValue(dt, bytes);
}

std::string Encode(DataType dt, const std::vector<double>& values) {
  std::string out(values.size() * DSize(dt), '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    EncodeValue(dt, values[i], out.data() + i * DSize(dt));
  }
  return out;
}

#define OPSERVER_SOAK_NAME(Name, in0, in1, out, PARAMS) #Name,
const char* const kOpNames[kNumOps] = {OPSERVER_OPERATORS(OPSERVER_SOAK_NAME)};
#undef OPSERVER_SOAK_NAME

const char* SecondName(int op) {
#define OPSERVER_SOAK_SECOND(Name, in0, in1, out, PARAMS) #in1,
  static const char* const kNames[] = {
      OPSERVER_OPERATORS(OPSERVER_SOAK_SECOND)};
#undef OPSERVER_SOAK_SECOND
  return kNames[op];
}

const char* OutName(int op) {
#define OPSERVER_SOAK_OUT(Name, in0, in1, out, PARAMS) #out,
  static const char* const kNames[] = {OPSERVER_OPERATORS(OPSERVER_SOAK_OUT)};
#undef OPSERVER_SOAK_OUT
  return kNames[op];
}

std::vector<DataType> OpDTypes(int op) {
  switch (op) {
    case kThresholdBackward:
      return {v1::FLOAT, v1::FLOAT16, v1::BF16, v1::INT32, v1::INT8, v1::UINT8};
    case kLeakyReluBackward:
      return {v1::FLOAT, v1::FLOAT16, v1::BF16, v1::DOUBLE};
    default:
      return {v1::FLOAT, v1::FLOAT16, v1::BF16};
  }
}

v1::TensorDesc Desc(uint64_t buffer, DataType dt, std::vector<int64_t> shape,
                    std::vector<int64_t> strides, int64_t offset,
                    uint64_t buffer_offset) {
  v1::TensorDesc d;
  d.set_buffer(buffer);
  d.set_buffer_offset(buffer_offset);
  d.set_dtype(dt);
  for (int64_t s : shape) d.add_shape(s);
  for (int64_t s : strides) d.add_strides(s);
  d.set_offset(offset);
  return d;
}

// The kernels' own element formulas (kernels/ops/), with the scalars
// converted the way each operator's Check converts them, so that a wrong
// formula cannot hide behind a copy of itself here.
double Reference(int op, DataType dt, const v1::OpParams& p, double g, double x,
                 bool bit) {
  kernels::KernelParams kp;
  kp.threshold = static_cast<float>(p.threshold());
  kp.threshold_d = kp.threshold;
  kp.lambd = static_cast<float>(p.lambd());
  kp.slope_d = p.negative_slope().value();
  kp.slope_f = static_cast<float>(kp.slope_d);
  const float gf = static_cast<float>(g);
  const float xf = static_cast<float>(x);
  switch (op) {
    case kThresholdBackward:
      switch (dt) {
        case v1::INT32:
          return IntThreshold<int32_t>(kp, g, x);
        case v1::INT8:
          return IntThreshold<int8_t>(kp, g, x);
        case v1::UINT8:
          return IntThreshold<uint8_t>(kp, g, x);
        default:
          return RoundTo(dt, kernels::ThresholdFormula<float>(kp)(gf, xf));
      }
    case kSoftshrinkBackward:
      return RoundTo(dt, kernels::SoftshrinkFormula<float>(kp)(gf, xf));
    case kHardswishBackward:
      return RoundTo(dt, kernels::HardswishFormula<float>(kp)(gf, xf));
    case kLeakyReluBackward:
      if (dt == v1::DOUBLE) return kernels::LeakyFormula<double>(kp)(g, x);
      return RoundTo(dt, kernels::LeakyFormula<float>(kp)(gf, xf));
    default:
      // The kernels' mode dispatch (DropoutBackward's Check): scale 0
      // zeroes, scale 1 copies, anything else applies the mask.
      if (p.scale() == 0) return 0.0;
      if (p.scale() == 1) return g;
      kp.scale = static_cast<float>(p.scale());
      return RoundTo(dt, kernels::DropoutFormula(kp)(gf, bit));
  }
}

bool CloseEnough(DataType dt, double got, double want, double g) {
  if (std::isnan(want)) return std::isnan(got);
  double tol = 0;
  switch (dt) {
    case v1::FLOAT16:
      tol = 2e-3;
      break;
    case v1::BF16:
      tol = 1.6e-2;
      break;
    case v1::FLOAT:
      tol = 1e-6;
      break;
    case v1::DOUBLE:
      tol = 1e-12;
      break;
    default:
      return got == want;
  }
  return std::fabs(got - want) <= tol * std::max(std::fabs(want), std::fabs(g));
}

}  // namespace opserver::soak
