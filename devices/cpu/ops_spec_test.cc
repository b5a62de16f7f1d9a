// The five operators against docs/operators.md: worked examples,
// hand-computed boundaries, NaN/Inf, every dtype, broadcast and strided
// layouts, sizes around the vector width and above the parallel and
// streaming thresholds, in-place and misaligned data, and every check with
// its exact aclnn status. The reference below is written from the spec, one
// element at a time, independently of the kernels.

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "devices/cpu/plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"
#include "kernels/half.h"

namespace opserver::kernels {
namespace {

using cpu::Plan;
using cpu::PrepareOp;
using cpu::RunPlan;
using cpu::ThreadPool;

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- Element access by dtype (the reference's own conversions) ------------

double LoadAs(DType t, const char* p) {
  switch (t) {
    case DType::kFloat: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kDouble: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return HalfToFloat(h);
    }
    case DType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return BFloat16ToFloat(b);
    }
    case DType::kInt32: {
      int32_t i;
      std::memcpy(&i, p, 4);
      return i;
    }
    case DType::kInt8:
      return static_cast<int8_t>(*p);
    case DType::kUint8:
      return static_cast<uint8_t>(*p);
    default:
      ADD_FAILURE() << "dtype not used by these tests";
      return 0;
  }
}

void StoreAs(DType t, char* p, double v) {
  switch (t) {
    case DType::kFloat: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::kDouble:
      std::memcpy(p, &v, 8);
      break;
    case DType::kFloat16: {
      // One rounding from double (a DOUBLE compute stored to FLOAT16 must
      // not round twice); exact for values that are already floats.
      uint16_t h = DoubleToHalf(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      uint16_t b = DoubleToBFloat16(v);
      std::memcpy(p, &b, 2);
      break;
    }
    case DType::kInt32: {
      int32_t i = static_cast<int32_t>(v);
      std::memcpy(p, &i, 4);
      break;
    }
    case DType::kInt8:
      *p = static_cast<char>(static_cast<int8_t>(v));
      break;
    case DType::kUint8:
      *p = static_cast<char>(static_cast<uint8_t>(v));
      break;
    default:
      ADD_FAILURE() << "dtype not used by these tests";
  }
}

// Rounds `v` to what `t` can hold (the value a store then load gives).
double RoundTo(DType t, double v) {
  char bytes[8];
  StoreAs(t, bytes, v);
  return LoadAs(t, bytes);
}

// ---- An owned tensor with any layout --------------------------------------

struct Tensor {
  DType dtype = DType::kFloat;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // Empty: contiguous.
  int64_t offset = 0;
  std::vector<char> storage;
  size_t misalign = 0;  // Bytes the storage base is shifted by.

  char* base() { return storage.data() + misalign; }
  const char* base() const { return storage.data() + misalign; }

  TensorView View() {
    TensorView v;
    v.dtype = dtype;
    v.shape = shape;
    v.strides = strides;
    v.offset = offset;
    v.data = base();
    return v;
  }
  int64_t numel() const { return NumElements(shape); }
  // Storage element of the row-major logical index `i`.
  int64_t Element(int64_t i) const {
    std::vector<int64_t> st =
        strides.empty() ? ContiguousStrides(shape) : strides;
    int64_t e = offset;
    for (int k = static_cast<int>(shape.size()) - 1; k >= 0; --k) {
      e += (i % shape[k]) * st[k];
      i /= shape[k];
    }
    return e;
  }
  double Get(int64_t i) const {
    return LoadAs(dtype, base() + Element(i) * DTypeSize(dtype));
  }
  void Set(int64_t i, double v) {
    StoreAs(dtype, base() + Element(i) * DTypeSize(dtype), v);
  }
};

// A tensor of `shape`, laid out with `strides` (or contiguous), storage
// sized to hold it, filled with a sentinel so unwritten gaps stay visible.
Tensor Make(DType dtype, std::vector<int64_t> shape,
            std::vector<int64_t> strides = {}, int64_t offset = 0,
            size_t misalign = 0) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.strides = std::move(strides);
  t.offset = offset;
  t.misalign = misalign;
  int64_t max_element = offset;
  std::vector<int64_t> st =
      t.strides.empty() ? ContiguousStrides(t.shape) : t.strides;
  for (size_t k = 0; k < t.shape.size(); ++k) {
    if (t.shape[k] == 0) max_element = offset - 1;
  }
  if (max_element >= offset) {
    for (size_t k = 0; k < t.shape.size(); ++k) {
      max_element += (t.shape[k] - 1) * st[k];
    }
  }
  t.storage.assign((max_element + 1) * DTypeSize(dtype) + misalign + 8,
                   static_cast<char>(0x5A));
  return t;
}

Tensor FromValues(DType dtype, std::vector<int64_t> shape,
                  const std::vector<double>& values) {
  Tensor t = Make(dtype, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.Set(i, values[i]);
  return t;
}

void FillRandom(Tensor& t, std::mt19937& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  const bool integral = !IsFloating(t.dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = u(rng);
    t.Set(i, integral ? std::round(v) : v);
  }
}

std::vector<double> Values(const Tensor& t) {
  std::vector<double> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.Get(i);
  return v;
}

// ---- The reference, from the spec ------------------------------------------

// Index of broadcast output element `i` in an input of `in_shape`.
int64_t BroadcastIndex(int64_t i, const std::vector<int64_t>& out_shape,
                       const std::vector<int64_t>& in_shape) {
  int64_t index = 0, scale = 1;
  const size_t lead = out_shape.size() - in_shape.size();
  for (int k = static_cast<int>(out_shape.size()) - 1; k >= 0; --k) {
    const int64_t coord = i % out_shape[k];
    i /= out_shape[k];
    if (k >= static_cast<int>(lead)) {
      const int64_t d = in_shape[k - lead];
      index += (d == 1 ? 0 : coord) * scale;
      scale *= d;
    }
  }
  return index;
}

// Compute dtype of two floating inputs (spec's promotion table).
DType Promote(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::kDouble || b == DType::kDouble) return DType::kDouble;
  return DType::kFloat;
}

// Expected output of `call` over the given tensors, element by element.
std::vector<double> Reference(const OpCall& call, const Tensor& grad,
                              const Tensor& self, const Tensor& out) {
  std::vector<double> expect(out.numel());
  const OpParams& p = call.params;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double g = grad.Get(BroadcastIndex(i, out.shape, grad.shape));
    double r = 0;
    switch (call.op) {
      case OpKind::kThresholdBackward: {
        const double x = self.Get(BroadcastIndex(i, out.shape, self.shape));
        // NaN self passes: only self <= threshold zeroes.
        r = x <= static_cast<float>(p.threshold) ? 0 : g;
        break;
      }
      case OpKind::kSoftshrinkBackward: {
        const double x = self.Get(BroadcastIndex(i, out.shape, self.shape));
        r = std::fabs(x) <= static_cast<float>(p.lambd) ? 0 : g;
        break;
      }
      case OpKind::kHardswishBackward: {
        const float x = static_cast<float>(self.Get(i));
        const float d = x < -3.0f ? 0.0f : (x <= 3.0f ? x / 3.0f + 0.5f : 1.0f);
        r = static_cast<float>(g) * d;
        break;
      }
      case OpKind::kLeakyReluBackward: {
        const double x = self.Get(BroadcastIndex(i, out.shape, self.shape));
        const DType ct = Promote(grad.dtype, self.dtype);
        const double slope = p.negative_slope.AsDouble();
        if (ct == DType::kDouble) {
          r = x > 0 ? g : g * slope;
        } else {
          r = x > 0 ? g
                    : static_cast<double>(static_cast<float>(g) *
                                          static_cast<float>(slope));
        }
        // Rounded to the compute dtype before the cast to `out` (spec).
        r = RoundTo(ct, r);
        break;
      }
      case OpKind::kDropoutBackward: {
        const auto* mask = reinterpret_cast<const uint8_t*>(self.base());
        const bool kept = (mask[i / 8] >> (i % 8)) & 1;
        if (p.scale == 1) {
          r = g;
        } else {
          r = kept ? static_cast<double>(static_cast<float>(g) *
                                         static_cast<float>(p.scale))
                   : 0.0;
        }
        // The compute dtype is gradOutput's: rounded to it before the cast.
        r = RoundTo(grad.dtype, r);
        break;
      }
    }
    expect[i] = RoundTo(out.dtype, r);
  }
  return expect;
}

// Element-wise equality that treats NaN == NaN and checks the sign of 0.
void ExpectSameValues(const std::vector<double>& actual,
                      const std::vector<double>& expected,
                      const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < actual.size() && reported < 5; ++i) {
    const bool same = (std::isnan(actual[i]) && std::isnan(expected[i])) ||
                      (actual[i] == expected[i] &&
                       std::signbit(actual[i]) == std::signbit(expected[i]));
    if (!same) {
      ADD_FAILURE() << what << ": element " << i << " is " << actual[i]
                    << ", expected " << expected[i];
      ++reported;
    }
  }
}

absl::Status Launch(const OpCall& call, ThreadPool* pool = nullptr) {
  absl::StatusOr<Plan> plan = PrepareOp(call);
  if (!plan.ok()) return plan.status();
  std::vector<char> workspace(plan->workspace_size());
  return RunPlan(*plan, workspace.data(), workspace.size(), pool);
}

OpCall Call(OpKind op, Tensor& grad, Tensor& self, Tensor& out,
            OpParams params = {}) {
  OpCall call;
  call.op = op;
  call.grad_output = grad.View();
  call.self = self.View();
  call.out = out.View();
  call.params = params;
  return call;
}

// Runs `call` and checks the output against the reference.
void CheckAgainstReference(OpCall call, Tensor& grad, Tensor& self, Tensor& out,
                           const std::string& what,
                           ThreadPool* pool = nullptr) {
  std::vector<double> expected = Reference(call, grad, self, out);
  absl::Status status = Launch(call, pool);
  ASSERT_TRUE(status.ok()) << what << ": " << status;
  ExpectSameValues(Values(out), expected, what);
}

OpParams Threshold(double t) {
  OpParams p;
  p.threshold = t;
  return p;
}
OpParams Lambd(double l) {
  OpParams p;
  p.lambd = l;
  return p;
}
OpParams Slope(double s, bool self_is_result = false,
               DType dtype = DType::kFloat) {
  OpParams p;
  p.negative_slope = Scalar::Float(s, dtype);
  p.self_is_result = self_is_result;
  return p;
}
OpParams Scale(double s) {
  OpParams p;
  p.scale = s;
  return p;
}

// A mask tensor of the size DropoutBackward requires for `numel` elements.
Tensor MaskFor(int64_t numel, const std::vector<int64_t>& kept_bits) {
  const int64_t bytes = (numel + 127) / 128 * 128 / 8;
  Tensor mask = Make(DType::kUint8, {bytes});
  std::memset(mask.base(), 0, bytes);
  for (int64_t bit : kept_bits) {
    reinterpret_cast<uint8_t*>(mask.base())[bit / 8] |= 1u << (bit % 8);
  }
  return mask;
}

// ---- Worked examples and boundaries ----------------------------------------

TEST(SpecExamples, ThresholdBackward) {
  Tensor self = FromValues(DType::kFloat, {4}, {0.2, 1.2, 2.2, 3.2});
  Tensor grad = FromValues(DType::kFloat, {4}, {4.5, 4.4, 4.3, 4.2});
  Tensor out = Make(DType::kFloat, {4});
  ASSERT_TRUE(
      Launch(Call(OpKind::kThresholdBackward, grad, self, out, Threshold(1.0)))
          .ok());
  EXPECT_THAT(Values(out), ElementsAreArray({0.0, double(4.4f), double(4.3f),
                                             double(4.2f)}));
}

TEST(SpecExamples, DropoutBackward) {
  Tensor grad = FromValues(DType::kFloat, {4, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  Tensor mask = Make(DType::kUint8, {16});
  std::memset(mask.base(), 0, 16);
  mask.base()[0] = 42;
  Tensor out = Make(DType::kFloat, {4, 2});
  ASSERT_TRUE(
      Launch(Call(OpKind::kDropoutBackward, grad, mask, out, Scale(2))).ok());
  EXPECT_THAT(Values(out), ElementsAreArray({0, 2, 0, 6, 0, 10, 0, 0}));
}

TEST(SpecBoundaries, ThresholdEqualityZeroesAndNaNPasses) {
  Tensor self =
      FromValues(DType::kFloat, {5}, {1, 1.0000001, kNaN, -kInf, kInf});
  Tensor grad = FromValues(DType::kFloat, {5}, {7, 7, 7, 7, 7});
  Tensor out = Make(DType::kFloat, {5});
  ASSERT_TRUE(
      Launch(Call(OpKind::kThresholdBackward, grad, self, out, Threshold(1)))
          .ok());
  EXPECT_THAT(Values(out), ElementsAreArray({0, 7, 7, 0, 7}));
}

TEST(SpecBoundaries, ThresholdIntegerSelfComparesExactly) {
  // 1 > 0.5 passes (no truncation of the threshold to 0... or to 1).
  for (DType d : {DType::kInt32, DType::kInt8, DType::kUint8}) {
    Tensor self = FromValues(d, {3}, {0, 1, 2});
    Tensor grad = FromValues(d, {3}, {5, 6, 7});
    Tensor out = Make(d, {3});
    ASSERT_TRUE(Launch(Call(OpKind::kThresholdBackward, grad, self, out,
                            Threshold(0.5)))
                    .ok());
    EXPECT_THAT(Values(out), ElementsAreArray({0, 6, 7})) << DTypeName(d);
    ASSERT_TRUE(Launch(Call(OpKind::kThresholdBackward, grad, self, out,
                            Threshold(1.0)))
                    .ok());
    EXPECT_THAT(Values(out), ElementsAreArray({0, 0, 7})) << DTypeName(d);
  }
}

// Thresholds whose floor lies outside the integer dtype resolve the whole
// tensor at once (everything passes, or nothing does), in the SIMD and the
// strided kernels alike; NaN lets nothing pass (x > NaN is false).
TEST(SpecBoundaries, ThresholdIntegerSelfWithThresholdsOutsideTheDType) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType d : {DType::kInt32, DType::kInt8, DType::kUint8}) {
    const double lo = d == DType::kUint8  ? 0
                      : d == DType::kInt8 ? -128
                                          : -2147483648.0;
    const double hi = d == DType::kUint8  ? 255
                      : d == DType::kInt8 ? 127
                                          : 2147483647.0;
    const std::vector<double> selves = {lo, 1, 2, hi};
    const std::vector<double> grads = {5, 6, 7, 8};
    struct Case {
      double threshold;
      std::vector<double> want;
    };
    std::vector<Case> cases = {{-inf, grads},       {-1e300, grads},
                               {-3e9, grads},       {lo, {0, 6, 7, 8}},
                               {3e9, {0, 0, 0, 0}}, {1e300, {0, 0, 0, 0}},
                               {inf, {0, 0, 0, 0}}, {nan, {0, 0, 0, 0}}};
    if (d != DType::kInt32) {
      // Just outside and at the ends of the range (exact as FLOAT, the
      // threshold's dtype; INT32's ends are not).
      cases.insert(cases.end(), {{lo - 0.5, grads},
                                 {lo - 1, grads},
                                 {hi - 0.5, {0, 0, 0, 8}},
                                 {hi, {0, 0, 0, 0}},
                                 {hi + 0.5, {0, 0, 0, 0}}});
    }
    for (const Case& c : cases) {
      for (bool strided : {false, true}) {
        const std::vector<int64_t> strides =
            strided ? std::vector<int64_t>{3} : std::vector<int64_t>{};
        Tensor self = Make(d, {4}, strides);
        Tensor grad = Make(d, {4}, strides);
        for (int64_t i = 0; i < 4; ++i) {
          self.Set(i, selves[i]);
          grad.Set(i, grads[i]);
        }
        Tensor out = Make(d, {4}, strides);
        ASSERT_TRUE(Launch(Call(OpKind::kThresholdBackward, grad, self, out,
                                Threshold(c.threshold)))
                        .ok());
        EXPECT_THAT(Values(out), ElementsAreArray(c.want))
            << DTypeName(d) << " threshold " << c.threshold
            << (strided ? " strided" : "");
      }
    }
  }
}

TEST(SpecBoundaries, SoftshrinkAbsEqualToLambdIsZero) {
  Tensor self =
      FromValues(DType::kFloat, {6}, {0.5, -0.5, 0.75, -0.75, kNaN, 0});
  Tensor grad = FromValues(DType::kFloat, {6}, {1, 2, 3, 4, 5, 6});
  Tensor out = Make(DType::kFloat, {6});
  ASSERT_TRUE(
      Launch(Call(OpKind::kSoftshrinkBackward, grad, self, out, Lambd(0.5)))
          .ok());
  EXPECT_THAT(Values(out), ElementsAreArray({0, 0, 3, 4, 5, 0}));
}

TEST(SpecBoundaries, HardswishClosedIntervalAndNaN) {
  Tensor self =
      FromValues(DType::kFloat, {7}, {-3, 3, -3.0001, 3.0001, 0, kNaN, 1.5});
  Tensor grad = FromValues(DType::kFloat, {7}, {2, 2, 2, 2, 2, 2, 2});
  Tensor out = Make(DType::kFloat, {7});
  ASSERT_TRUE(Launch(Call(OpKind::kHardswishBackward, grad, self, out)).ok());
  // d(-3) = -0.5, d(3) = 1.5, below -3: 0, above 3: 1, d(0) = 0.5,
  // NaN takes the last branch, d(1.5) = 1.
  EXPECT_THAT(Values(out), ElementsAreArray({-1, 3, 0, 2, 1, 2, 2}));
}

TEST(SpecBoundaries, LeakyReluZeroTakesTheSlopeAndNaNToo) {
  Tensor self = FromValues(DType::kFloat, {4}, {0, -0.0, 1e-30, kNaN});
  Tensor grad = FromValues(DType::kFloat, {4}, {8, 8, 8, 8});
  Tensor out = Make(DType::kFloat, {4});
  ASSERT_TRUE(
      Launch(Call(OpKind::kLeakyReluBackward, grad, self, out, Slope(0.25)))
          .ok());
  EXPECT_THAT(Values(out), ElementsAreArray({2, 2, 8, 2}));
}

TEST(SpecBoundaries, LeakyReluSelfIsResultRefusesNegativeSlope) {
  Tensor self = FromValues(DType::kFloat, {2}, {1, -1});
  Tensor grad = FromValues(DType::kFloat, {2}, {1, 1});
  Tensor out = Make(DType::kFloat, {2});
  absl::Status status = Launch(Call(OpKind::kLeakyReluBackward, grad, self, out,
                                    Slope(-0.1, /*self_is_result=*/true)));
  EXPECT_EQ(GetAclnnStatus(status), kAclnnErrParamInvalid);
  EXPECT_THAT(status.message(), HasSubstr("negativeSlope"));
  // Without selfIsResult a negative slope is fine.
  EXPECT_TRUE(
      Launch(Call(OpKind::kLeakyReluBackward, grad, self, out, Slope(-0.1)))
          .ok());
  EXPECT_THAT(Values(out), ElementsAreArray({1.0, double(-0.1f)}));
}

TEST(SpecBoundaries, DropoutMaskBitsScaleZeroOneAndNonFiniteGrads) {
  const int64_t n = 200;
  Tensor grad = Make(DType::kFloat, {n});
  for (int64_t i = 0; i < n; ++i) grad.Set(i, i + 1);
  grad.Set(1, kNaN);   // Dropped: must become exactly 0.
  grad.Set(2, kInf);   // Dropped.
  grad.Set(7, -kInf);  // Kept.
  Tensor mask = MaskFor(n, {0, 7, 8, 127, 128, 199});
  ASSERT_EQ(mask.numel(), 32);  // align(200, 128) / 8.
  Tensor out = Make(DType::kFloat, {n});
  ASSERT_TRUE(
      Launch(Call(OpKind::kDropoutBackward, grad, mask, out, Scale(2))).ok());
  for (int64_t i = 0; i < n; ++i) {
    const bool kept =
        i == 0 || i == 7 || i == 8 || i == 127 || i == 128 || i == 199;
    const double expect = !kept ? 0.0 : (i == 7 ? -kInf : 2.0 * (i + 1));
    EXPECT_EQ(out.Get(i), expect) << "element " << i;
    if (!kept) {
      EXPECT_FALSE(std::signbit(out.Get(i))) << "element " << i;
    }
  }
  // scale 0: all zeros; scale 1: gradOutput unchanged, mask ignored.
  ASSERT_TRUE(
      Launch(Call(OpKind::kDropoutBackward, grad, mask, out, Scale(0))).ok());
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out.Get(i), 0) << i;
  ASSERT_TRUE(
      Launch(Call(OpKind::kDropoutBackward, grad, mask, out, Scale(1))).ok());
  ExpectSameValues(Values(out), Values(grad), "scale 1");
}

// ---- Every dtype, random data, sizes around the vector width ---------------

struct DTypeCase {
  OpKind op;
  DType grad, self, out;
};

std::vector<DTypeCase> AllDTypeCases() {
  std::vector<DTypeCase> cases;
  for (DType d : {DType::kFloat, DType::kFloat16, DType::kBFloat16,
                  DType::kInt32, DType::kInt8, DType::kUint8}) {
    cases.push_back({OpKind::kThresholdBackward, d, d, d});
  }
  const DType halves[] = {DType::kFloat, DType::kFloat16, DType::kBFloat16};
  for (DType g : halves) {
    for (DType s : halves) {
      cases.push_back({OpKind::kSoftshrinkBackward, g, s, Promote(g, s)});
    }
    cases.push_back({OpKind::kHardswishBackward, g, g, g});
  }
  const DType floats[] = {DType::kFloat, DType::kFloat16, DType::kBFloat16,
                          DType::kDouble};
  for (DType g : floats) {
    for (DType s : floats) {
      for (DType o : floats)
        cases.push_back({OpKind::kLeakyReluBackward, g, s, o});
    }
  }
  for (DType g : halves) {
    for (DType o : floats) cases.push_back({OpKind::kDropoutBackward, g, g, o});
  }
  return cases;
}

OpParams ParamsFor(OpKind op) {
  switch (op) {
    case OpKind::kThresholdBackward:
      return Threshold(0.25);
    case OpKind::kSoftshrinkBackward:
      return Lambd(0.5);
    case OpKind::kLeakyReluBackward:
      return Slope(0.01);
    case OpKind::kDropoutBackward:
      return Scale(1.0 / (1.0 - 0.3));
    default:
      return {};
  }
}

std::string Name(const DTypeCase& c, int64_t n) {
  return std::string(GetOpInfo(c.op).name) + " " +
         std::string(DTypeName(c.grad)) + "/" + std::string(DTypeName(c.self)) +
         "->" + std::string(DTypeName(c.out)) + " n=" + std::to_string(n);
}

void RunRandomCase(const DTypeCase& c, int64_t n, ThreadPool* pool,
                   size_t misalign, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor grad = Make(c.grad, {n}, {}, 0, misalign);
  const bool dropout = c.op == OpKind::kDropoutBackward;
  Tensor self = dropout ? MaskFor(n, {}) : Make(c.self, {n}, {}, 0, misalign);
  Tensor out = Make(c.out, {n}, {}, 0, misalign);
  FillRandom(grad, rng, -5, 5);
  if (dropout) {
    for (int64_t i = 0; i < self.numel(); ++i) {
      self.base()[i] = static_cast<char>(rng());
    }
  } else {
    FillRandom(self, rng, -4, 4);
    // Plant the boundaries among random values.
    const double specials[] = {0.25, -0.5, 0.5, -3, 3, 0, kNaN, kInf, -kInf};
    for (int64_t i = 0; i < n; i += 7) {
      if (!IsFloating(c.self) && std::isnan(specials[i % 9])) continue;
      if (!IsFloating(c.self) && std::isinf(specials[i % 9])) continue;
      self.Set(i, specials[i % 9]);
    }
  }
  CheckAgainstReference(Call(c.op, grad, self, out, ParamsFor(c.op)), grad,
                        self, out, Name(c, n), pool);
}

TEST(EveryDType, SizesAroundTheVectorWidth) {
  // 512-bit vectors hold 16 fp32 / 32 fp16 / 64 int8; cover each +-1.
  const int64_t sizes[] = {1,  3,  7,  8,  9,  15,  16,  17,   31,
                           32, 33, 63, 64, 65, 127, 129, 1000, 4099};
  uint32_t seed = 1;
  for (const DTypeCase& c : AllDTypeCases()) {
    for (int64_t n : sizes) RunRandomCase(c, n, nullptr, 0, seed++);
  }
}

TEST(EveryDType, MisalignedStarts) {
  uint32_t seed = 100;
  for (const DTypeCase& c : AllDTypeCases()) {
    for (size_t misalign : {size_t{2}, size_t{4}, size_t{6}}) {
      RunRandomCase(c, 531, nullptr, misalign, seed++);
    }
  }
}

TEST(EveryDType, AboveTheParallelAndStreamingThresholds) {
  ThreadPool pool(2);
  uint32_t seed = 1000;
  for (const DTypeCase& c : AllDTypeCases()) {
    if (c.grad != c.out && c.op == OpKind::kLeakyReluBackward &&
        c.self != c.grad) {
      continue;  // The mixed-dtype grid is covered at small sizes.
    }
    RunRandomCase(c, 300001, &pool, 0, seed++);
  }
  // Outputs past the non-temporal-store threshold.
  RunRandomCase(
      {OpKind::kThresholdBackward, DType::kFloat, DType::kFloat, DType::kFloat},
      (3 << 20) + 5, &pool, 0, seed++);
  RunRandomCase({OpKind::kDropoutBackward, DType::kBFloat16, DType::kBFloat16,
                 DType::kFloat},
                (3 << 20) + 5, &pool, 0, seed++);
}

// ---- Layouts ----------------------------------------------------------------

// A result is rounded to its compute dtype before the cast to a wider
// `out` (spec, common rules): the spec's two examples, then every compute
// dtype x wider out dtype, contiguous and strided.
TEST(MixedDTypes, ResultIsRoundedToTheComputeDTypeBeforeTheCast) {
  // LeakyRelu, FLOAT16 gradOutput and self, slope 2.5, FLOAT out.
  {
    Tensor g = Make(DType::kFloat16, {2}), s = Make(DType::kFloat16, {2});
    Tensor o = Make(DType::kFloat, {2});
    g.Set(0, 65504);
    g.Set(1, 0.1);
    s.Set(0, -1);
    s.Set(1, -1);
    ASSERT_TRUE(
        Launch(Call(OpKind::kLeakyReluBackward, g, s, o, Slope(2.5))).ok());
    EXPECT_EQ(o.Get(0), kInf);
    EXPECT_EQ(o.Get(1), 0.25);
  }
  // Dropout, FLOAT16 gradOutput 65504, scale 2, FLOAT out.
  {
    Tensor g = Make(DType::kFloat16, {1}), o = Make(DType::kFloat, {1});
    g.Set(0, 65504);
    Tensor mask = MaskFor(1, {0});
    ASSERT_TRUE(
        Launch(Call(OpKind::kDropoutBackward, g, mask, o, Scale(2))).ok());
    EXPECT_EQ(o.Get(0), kInf);
  }
  // Every compute dtype with every wider out, in a contiguous and a strided
  // layout: FLOAT16 overflows at 65504 * 2.5, BFLOAT16 keeps 8 bits (255 *
  // 1.5 = 382.5 -> 382), FLOAT rounds 0.1 * 3 to float before a DOUBLE out.
  struct Case {
    DType compute;
    double grad, factor, expected;
  };
  const Case cases[] = {
      {DType::kFloat16, 65504, 2.5, kInf},
      {DType::kBFloat16, 255, 1.5, 382},
      {DType::kFloat, 0.1, 3,
       static_cast<double>(static_cast<float>(0.1f) * 3.0f)},
  };
  for (const Case& c : cases) {
    for (DType out : {DType::kFloat, DType::kDouble}) {
      if (DTypeSize(out) <= DTypeSize(c.compute)) continue;
      for (bool strided : {false, true}) {
        const std::vector<int64_t> strides =
            strided ? std::vector<int64_t>{3} : std::vector<int64_t>{};
        const std::string what = std::string(DTypeName(c.compute)) + " -> " +
                                 std::string(DTypeName(out)) +
                                 (strided ? " strided" : "");
        Tensor g = Make(c.compute, {4}, strides);
        Tensor s = Make(c.compute, {4});
        Tensor o = Make(out, {4}, strides);
        for (int64_t i = 0; i < 4; ++i) {
          g.Set(i, c.grad);
          s.Set(i, -1);
        }
        ASSERT_TRUE(
            Launch(Call(OpKind::kLeakyReluBackward, g, s, o, Slope(c.factor)))
                .ok())
            << what;
        for (int64_t i = 0; i < 4; ++i) {
          EXPECT_EQ(o.Get(i), c.expected) << "LeakyRelu " << what;
        }
        // Dropout scales by at least 1: use the factor as the scale.
        if (c.factor < 1) continue;
        Tensor dg = Make(c.compute, {4}, strides);
        Tensor dout = Make(out, {4}, strides);
        for (int64_t i = 0; i < 4; ++i) dg.Set(i, c.grad);
        Tensor mask = MaskFor(4, {0, 1, 2, 3});
        ASSERT_TRUE(Launch(Call(OpKind::kDropoutBackward, dg, mask, dout,
                                Scale(c.factor)))
                        .ok())
            << what;
        for (int64_t i = 0; i < 4; ++i) {
          EXPECT_EQ(dout.Get(i), c.expected) << "Dropout " << what;
        }
      }
    }
  }
}

TEST(Layouts, InPlaceOutAliasesGradOutput) {
  for (OpKind op : {OpKind::kThresholdBackward, OpKind::kSoftshrinkBackward,
                    OpKind::kHardswishBackward, OpKind::kLeakyReluBackward,
                    OpKind::kDropoutBackward}) {
    for (int64_t n : {int64_t{17}, int64_t{100003}}) {
      std::mt19937 rng(n);
      Tensor grad = Make(DType::kFloat, {n});
      FillRandom(grad, rng, -5, 5);
      Tensor self = op == OpKind::kDropoutBackward ? MaskFor(n, {0, 3, 9})
                                                   : Make(DType::kFloat, {n});
      if (op != OpKind::kDropoutBackward) FillRandom(self, rng, -4, 4);
      Tensor expected_out = Make(DType::kFloat, {n});
      std::vector<double> expected =
          Reference(Call(op, grad, self, expected_out, ParamsFor(op)), grad,
                    self, expected_out);
      OpCall call = Call(op, grad, self, grad, ParamsFor(op));
      ThreadPool pool(2);
      ASSERT_TRUE(Launch(call, &pool).ok());
      ExpectSameValues(Values(grad), expected,
                       std::string(GetOpInfo(op).name) + " in place");
    }
  }
}

TEST(Layouts, BroadcastInEveryDirection) {
  struct Case {
    std::vector<int64_t> grad, self;
  } cases[] = {
      {{3, 4}, {4}},          {{4}, {3, 4}},
      {{3, 1}, {1, 4}},       {{2, 3, 4}, {3, 1}},
      {{1}, {5, 2}},          {{}, {3, 3}},
      {{6, 1, 5}, {1, 7, 1}}, {{2, 1, 3, 1, 2}, {5, 3, 4, 1}},
  };
  std::mt19937 rng(5);
  for (OpKind op : {OpKind::kThresholdBackward, OpKind::kSoftshrinkBackward,
                    OpKind::kLeakyReluBackward}) {
    for (const Case& c : cases) {
      Tensor grad = Make(DType::kFloat, c.grad);
      Tensor self = Make(DType::kFloat16, c.self);
      if (op == OpKind::kThresholdBackward) self = Make(DType::kFloat, c.self);
      FillRandom(grad, rng, -5, 5);
      FillRandom(self, rng, -2, 2);
      const size_t rank = std::max(c.grad.size(), c.self.size());
      std::vector<int64_t> out_shape(rank);
      for (size_t k = 0; k < rank; ++k) {
        int64_t a =
            k + c.grad.size() >= rank ? c.grad[k + c.grad.size() - rank] : 1;
        int64_t b =
            k + c.self.size() >= rank ? c.self[k + c.self.size() - rank] : 1;
        out_shape[k] = std::max(a, b);
      }
      Tensor out = Make(DType::kFloat, out_shape);
      CheckAgainstReference(Call(op, grad, self, out, ParamsFor(op)), grad,
                            self, out,
                            std::string(GetOpInfo(op).name) + " broadcast");
    }
  }
}

TEST(Layouts, TransposedSlicedStrideZeroAndStridedOut) {
  std::mt19937 rng(9);
  for (OpKind op : {OpKind::kThresholdBackward, OpKind::kSoftshrinkBackward,
                    OpKind::kHardswishBackward, OpKind::kLeakyReluBackward}) {
    for (DType d : {DType::kFloat, DType::kBFloat16}) {
      // grad: a transposed 37x19 view; self: every third column of a slice
      // with an offset; out: rows padded to 40 elements.
      Tensor grad = Make(d, {19, 37}, {1, 19});
      Tensor self = Make(d, {19, 37}, {120, 3}, 5);
      Tensor out = Make(d, {19, 37}, {40, 1}, 2);
      FillRandom(grad, rng, -5, 5);
      FillRandom(self, rng, -4, 4);
      std::vector<char> before = out.storage;
      CheckAgainstReference(Call(op, grad, self, out, ParamsFor(op)), grad,
                            self, out,
                            std::string(GetOpInfo(op).name) + " strided");
      // The gaps of the strided out are untouched.
      for (int64_t r = 0; r < 19; ++r) {
        for (int64_t c = 37; c < 40 && r * 40 + c + 2 < 19 * 40; ++c) {
          const int64_t byte = (2 + r * 40 + c) * DTypeSize(d);
          EXPECT_EQ(out.storage[byte], before[byte]) << "gap written";
        }
      }
    }
  }
  // An input broadcast through a stride-0 dimension.
  for (OpKind op : {OpKind::kThresholdBackward, OpKind::kHardswishBackward}) {
    Tensor grad = Make(DType::kFloat, {8, 33}, {0, 1});  // Every row the same.
    Tensor self = Make(DType::kFloat, {8, 33});
    Tensor out = Make(DType::kFloat, {8, 33});
    FillRandom(grad, rng, -5, 5);
    FillRandom(self, rng, -4, 4);
    CheckAgainstReference(Call(op, grad, self, out, ParamsFor(op)), grad, self,
                          out, std::string(GetOpInfo(op).name) + " stride 0");
  }
  // A non-contiguous dropout mask and gradOutput.
  {
    Tensor grad = Make(DType::kFloat, {16, 8}, {1, 16});
    FillRandom(grad, rng, -5, 5);
    Tensor mask = Make(DType::kUint8, {16}, {2});
    for (int64_t i = 0; i < 16; ++i) mask.Set(i, static_cast<uint8_t>(rng()));
    Tensor gathered = MaskFor(128, {});
    for (int64_t i = 0; i < 16; ++i) gathered.base()[i] = mask.Get(i);
    Tensor out = Make(DType::kFloat, {16, 8});
    OpCall call = Call(OpKind::kDropoutBackward, grad, mask, out, Scale(3));
    std::vector<double> expected = Reference(call, grad, gathered, out);
    absl::StatusOr<Plan> plan = PrepareOp(call);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_GT(plan->workspace_size(), 0u);
    std::vector<char> workspace(plan->workspace_size());
    absl::Status small =
        RunPlan(*plan, workspace.data(), workspace.size() - 1, nullptr);
    EXPECT_EQ(GetAclnnStatus(small), kAclnnErrParamInvalid);
    ASSERT_TRUE(
        RunPlan(*plan, workspace.data(), workspace.size(), nullptr).ok());
    ExpectSameValues(Values(out), expected, "strided dropout");
  }
}

TEST(Layouts, ZeroDimAndEmptyTensors) {
  Tensor g0 = FromValues(DType::kFloat, {}, {3});
  Tensor s0 = FromValues(DType::kFloat, {}, {-1});
  Tensor o0 = Make(DType::kFloat, {});
  ASSERT_TRUE(
      Launch(Call(OpKind::kLeakyReluBackward, g0, s0, o0, Slope(0.5))).ok());
  EXPECT_EQ(o0.Get(0), 1.5);

  for (OpKind op : {OpKind::kThresholdBackward, OpKind::kSoftshrinkBackward,
                    OpKind::kHardswishBackward, OpKind::kLeakyReluBackward,
                    OpKind::kDropoutBackward}) {
    Tensor grad = Make(DType::kFloat, {3, 0, 2});
    Tensor self = op == OpKind::kDropoutBackward
                      ? Make(DType::kUint8, {0})
                      : Make(DType::kFloat, {3, 0, 2});
    Tensor out = Make(DType::kFloat, {3, 0, 2});
    OpCall call = Call(op, grad, self, out, ParamsFor(op));
    absl::StatusOr<Plan> plan = PrepareOp(call);
    ASSERT_TRUE(plan.ok()) << GetOpInfo(op).name << ": " << plan.status();
    EXPECT_EQ(plan->workspace_size(), 0u);
    EXPECT_TRUE(RunPlan(*plan, nullptr, 0, nullptr).ok());
  }
}

// ---- Checks and their exact status -----------------------------------------

struct ErrorCase {
  std::string name;
  std::function<void(OpCall&)> edit;
  int32_t aclnn;
  std::string message;
};

void ExpectErrors(OpKind op, Tensor& grad, Tensor& self, Tensor& out,
                  OpParams params, const std::vector<ErrorCase>& cases) {
  for (const ErrorCase& c : cases) {
    OpCall call = Call(op, grad, self, out, params);
    c.edit(call);
    absl::StatusOr<Plan> plan = PrepareOp(call);
    ASSERT_FALSE(plan.ok()) << GetOpInfo(op).name << ": " << c.name;
    EXPECT_EQ(GetAclnnStatus(plan.status()), c.aclnn)
        << GetOpInfo(op).name << ": " << c.name << ": " << plan.status();
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name;
    EXPECT_THAT(plan.status().message(), HasSubstr(c.message))
        << GetOpInfo(op).name << ": " << c.name;
  }
}

std::vector<ErrorCase> CommonErrors(absl::string_view out_name) {
  const std::string out(out_name);
  return {
      {"missing gradOutput", [](OpCall& c) { c.grad_output.reset(); },
       kAclnnErrParamNullptr, "gradOutput"},
      {"missing out", [](OpCall& c) { c.out.reset(); }, kAclnnErrParamNullptr,
       out},
      {"null data", [](OpCall& c) { c.grad_output->data = nullptr; },
       kAclnnErrParamNullptr, "gradOutput"},
      {"rank 9", [](OpCall& c) { c.out->shape = {1, 1, 1, 1, 1, 1, 1, 1, 4}; },
       kAclnnErrParamInvalid, out},
      {"negative dim", [](OpCall& c) { c.out->shape = {-4}; },
       kAclnnErrParamInvalid, out},
      {"negative stride", [](OpCall& c) { c.out->strides = {-1}; },
       kAclnnErrParamInvalid, out},
      {"stride count",
       [](OpCall& c) {
         c.out->strides = {1, 1};
       },
       kAclnnErrParamInvalid, out},
      {"overflowing shape",
       [](OpCall& c) {
         c.out->shape = {1ll << 40, 1ll << 40};
       },
       kAclnnErrParamInvalid, out},
      {"view outside storage shape",
       [](OpCall& c) { c.out->storage_shape = {3}; }, kAclnnErrParamInvalid,
       out},
      {"out shape",
       [](OpCall& c) {
         c.out->shape = {2, 2};
       },
       kAclnnErrParamInvalid, out},
      // An output may not overlap itself, so a
      // few bytes cannot describe ~2^62 elements of work.
      {"out with a stride-0 dimension", [](OpCall& c) { c.out->strides = {0}; },
       kAclnnErrParamInvalid, "overlap in memory"},
      {"out with interleaved strides",
       [](OpCall& c) {
         c.out->shape = {2, 2};
         c.out->strides = {1, 1};
         c.grad_output->shape = {2, 2};
         // self, unless it is DropoutBackward's mask.
         if (c.self->shape == std::vector<int64_t>{4}) c.self->shape = {2, 2};
       },
       kAclnnErrParamInvalid,
       out + " (shape [2,2], strides [1,1]) has elements that overlap in "
             "memory"},
  };
}

// A hostile view: 4 bytes describing 2^62 INT8
// elements through stride 0 everywhere are refused at planning time.
TEST(Checks, HugeViewsOverFewBytesAreRefused) {
  for (int64_t n : {int64_t{1} << 62, int64_t{17179869184},
                    std::numeric_limits<int64_t>::max()}) {
    Tensor t = Make(DType::kInt8, {4});
    t.shape = {n};
    t.strides = {0};
    absl::StatusOr<Plan> plan =
        PrepareOp(Call(OpKind::kThresholdBackward, t, t, t, Threshold(0)));
    EXPECT_EQ(GetAclnnStatus(plan.status()), kAclnnErrParamInvalid) << n;
    EXPECT_THAT(plan.status().message(), HasSubstr("overlap")) << n;
  }
  // Inputs may broadcast through stride 0; only the output is constrained.
  Tensor g = Make(DType::kFloat, {1});
  g.shape = {64};
  g.strides = {0};
  Tensor self = Make(DType::kFloat, {64}), out = Make(DType::kFloat, {64});
  EXPECT_TRUE(
      PrepareOp(Call(OpKind::kThresholdBackward, g, self, out, Threshold(0)))
          .ok());
  // A permuted, padded output is fine: its elements are distinct.
  Tensor po = Make(DType::kFloat, {3, 4}, {1, 5});
  Tensor pg = Make(DType::kFloat, {3, 4}), ps = Make(DType::kFloat, {3, 4});
  EXPECT_TRUE(
      PrepareOp(Call(OpKind::kThresholdBackward, pg, ps, po, Threshold(0)))
          .ok());
}

TEST(Checks, ThresholdBackward) {
  Tensor grad = Make(DType::kFloat, {4}), self = Make(DType::kFloat, {4}),
         out = Make(DType::kFloat, {4});
  std::vector<ErrorCase> cases = CommonErrors("out");
  cases.push_back({"missing self", [](OpCall& c) { c.self.reset(); },
                   kAclnnErrParamNullptr, "self"});
  cases.push_back({"self dtype differs",
                   [](OpCall& c) { c.self->dtype = DType::kInt8; },
                   kAclnnErrParamInvalid,
                   "self has dtype INT8 but gradOutput has FLOAT; they must "
                   "match"});
  cases.push_back({"unsupported dtype",
                   [](OpCall& c) {
                     c.grad_output->dtype = c.self->dtype = c.out->dtype =
                         DType::kDouble;
                   },
                   kAclnnErrParamInvalid, "DOUBLE"});
  cases.push_back({"shapes do not broadcast",
                   [](OpCall& c) { c.self->shape = {3}; },
                   kAclnnErrParamInvalid, "broadcast"});
  ExpectErrors(OpKind::kThresholdBackward, grad, self, out, Threshold(0),
               cases);
}

TEST(Checks, SoftshrinkBackward) {
  Tensor grad = Make(DType::kFloat, {4}), self = Make(DType::kFloat16, {4}),
         out = Make(DType::kFloat, {4});
  std::vector<ErrorCase> cases = CommonErrors("gradInput");
  cases.push_back({"negative lambd", [](OpCall& c) { c.params.lambd = -0.1; },
                   kAclnnErrParamInvalid, "lambd"});
  cases.push_back({"NaN lambd", [](OpCall& c) { c.params.lambd = kNaN; },
                   kAclnnErrParamInvalid, "lambd"});
  cases.push_back({"gradInput not the promoted dtype",
                   [](OpCall& c) { c.out->dtype = DType::kFloat16; },
                   kAclnnErrParamInvalid, "gradInput"});
  cases.push_back({"integer input",
                   [](OpCall& c) { c.self->dtype = DType::kInt32; },
                   kAclnnErrParamInvalid, "self"});
  ExpectErrors(OpKind::kSoftshrinkBackward, grad, self, out, Lambd(0.5), cases);
}

TEST(Checks, HardswishBackward) {
  Tensor grad = Make(DType::kFloat, {4}), self = Make(DType::kFloat, {4}),
         out = Make(DType::kFloat, {4});
  std::vector<ErrorCase> cases = CommonErrors("out");
  cases.push_back({"no broadcasting", [](OpCall& c) { c.self->shape = {1}; },
                   kAclnnErrParamInvalid, "self"});
  cases.push_back({"dtypes differ",
                   [](OpCall& c) { c.self->dtype = DType::kBFloat16; },
                   kAclnnErrParamInvalid, "self"});
  ExpectErrors(OpKind::kHardswishBackward, grad, self, out, {}, cases);
}

TEST(Checks, LeakyReluBackward) {
  Tensor grad = Make(DType::kFloat, {4}), self = Make(DType::kDouble, {4}),
         out = Make(DType::kFloat16, {4});
  std::vector<ErrorCase> cases = CommonErrors("out");
  cases.push_back({"integer out",
                   [](OpCall& c) { c.out->dtype = DType::kInt32; },
                   kAclnnErrParamInvalid, "out"});
  cases.push_back({"bool out", [](OpCall& c) { c.out->dtype = DType::kBool; },
                   kAclnnErrParamInvalid, "out"});
  cases.push_back({"negative slope with selfIsResult",
                   [](OpCall& c) {
                     c.params.self_is_result = true;
                     c.params.negative_slope = Scalar::Float(-1);
                   },
                   kAclnnErrParamInvalid, "negativeSlope"});
  ExpectErrors(OpKind::kLeakyReluBackward, grad, self, out, Slope(0.1), cases);
  // Every listed slope dtype is accepted, integer ones included.
  for (Scalar slope :
       {Scalar::Int(2, DType::kInt32), Scalar::Int(2, DType::kInt64),
        Scalar::Int(2, DType::kInt16), Scalar::Int(2, DType::kInt8),
        Scalar::Int(2, DType::kUint8), Scalar::Bool(true),
        Scalar::Float(2, DType::kDouble), Scalar::Float(2, DType::kFloat16),
        Scalar::Float(2, DType::kBFloat16)}) {
    Tensor g = FromValues(DType::kFloat, {2}, {3, 3});
    Tensor s = FromValues(DType::kFloat, {2}, {1, -1});
    Tensor o = Make(DType::kFloat, {2});
    OpParams p;
    p.negative_slope = slope;
    ASSERT_TRUE(Launch(Call(OpKind::kLeakyReluBackward, g, s, o, p)).ok())
        << DTypeName(slope.dtype);
    EXPECT_EQ(o.Get(1), 3 * slope.AsDouble()) << DTypeName(slope.dtype);
  }
}

TEST(Checks, DropoutBackward) {
  Tensor grad = Make(DType::kFloat, {4}), mask = MaskFor(4, {}),
         out = Make(DType::kFloat, {4});
  std::vector<ErrorCase> cases = CommonErrors("out");
  cases.push_back({"missing mask", [](OpCall& c) { c.self.reset(); },
                   kAclnnErrParamNullptr, "mask"});
  cases.push_back({"mask too small", [](OpCall& c) { c.self->shape = {15}; },
                   kAclnnErrParamInvalid, "mask"});
  cases.push_back({"mask too large", [](OpCall& c) { c.self->shape = {17}; },
                   kAclnnErrParamInvalid, "mask"});
  cases.push_back({"mask dtype",
                   [](OpCall& c) { c.self->dtype = DType::kInt8; },
                   kAclnnErrParamInvalid, "mask"});
  for (double bad : {0.5, -1.0, 0.999, kNaN}) {
    cases.push_back({"scale " + std::to_string(bad),
                     [bad](OpCall& c) { c.params.scale = bad; },
                     kAclnnErrParamInvalid, "scale"});
  }
  cases.push_back({"integer out",
                   [](OpCall& c) { c.out->dtype = DType::kInt32; },
                   kAclnnErrParamInvalid, "out"});
  // The first review, finding 14: the mask size rule once computed
  // numel + 127 and overflowed (UB, fatal under --config=asan) for a
  // gradOutput of 2^63-1 elements.
  cases.push_back({"gradOutput of 2^63-1 elements",
                   [](OpCall& c) {
                     c.grad_output->shape =
                         c.out->shape = {std::numeric_limits<int64_t>::max()};
                     c.grad_output->strides = c.out->strides = {0};
                   },
                   kAclnnErrParamInvalid, "align(9223372036854775807, 128)"});
  ExpectErrors(OpKind::kDropoutBackward, grad, mask, out, Scale(2), cases);
  // The size rule: numel 1111 needs exactly 144 bytes, in any shape.
  Tensor g = Make(DType::kFloat, {11, 101});
  Tensor o = Make(DType::kFloat, {11, 101});
  Tensor m = Make(DType::kUint8, {12, 12});
  std::memset(m.base(), 0, 144);
  EXPECT_TRUE(
      PrepareOp(Call(OpKind::kDropoutBackward, g, m, o, Scale(2))).ok());
  m.shape = {143};
  EXPECT_EQ(GetAclnnStatus(
                PrepareOp(Call(OpKind::kDropoutBackward, g, m, o, Scale(2)))
                    .status()),
            kAclnnErrParamInvalid);
}

TEST(Registry, ListsTheFiveOperatorsWithTheirArguments) {
  std::vector<std::string> names;
  for (const OpInfo& op : OpRegistry()) names.emplace_back(op.name);
  EXPECT_THAT(names,
              ElementsAreArray({"ThresholdBackward", "SoftshrinkBackward",
                                "HardswishBackward", "LeakyReluBackward",
                                "DropoutBackward"}));
  EXPECT_EQ(FindOp("aclnnDropoutBackward"),
            &GetOpInfo(OpKind::kDropoutBackward));
  EXPECT_EQ(FindOp("Relu"), nullptr);
  EXPECT_EQ(GetOpInfo(OpKind::kSoftshrinkBackward).tensors[2].name,
            "gradInput");
  EXPECT_EQ(GetOpInfo(OpKind::kDropoutBackward).tensors[1].name, "mask");
}

}  // namespace
// A launch with a cancel flag: unset, it computes everything; set, it stops
// between pieces and says CANCELLED, so a destroyed stream or a shutdown
// need not wait for billions of elements.
TEST(Cancellation, ASetFlagStopsTheLaunchAndSaysSo) {
  constexpr int64_t kN = int64_t{4} << 20;  // Several pieces.
  auto filled = [](float v) {
    Tensor t;
    t.shape = {kN};
    t.storage.resize(static_cast<size_t>(kN) * sizeof(float));
    float* p = reinterpret_cast<float*>(t.storage.data());
    for (int64_t i = 0; i < kN; ++i) p[i] = v;
    return t;
  };
  Tensor grad = filled(2), self = filled(1), out = filled(7);
  absl::StatusOr<Plan> plan = PrepareOp(
      Call(OpKind::kThresholdBackward, grad, self, out, Threshold(0.5)));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ThreadPool pool(2);
  std::atomic<bool> cancelled{true};
  absl::Status stopped = RunPlan(*plan, nullptr, 0, &pool, &cancelled);
  EXPECT_EQ(stopped.code(), absl::StatusCode::kCancelled) << stopped;
  const float* o = reinterpret_cast<const float*>(out.storage.data());
  EXPECT_EQ(o[0], 7) << "nothing was computed";
  EXPECT_EQ(o[kN - 1], 7);
  cancelled = false;
  ASSERT_TRUE(RunPlan(*plan, nullptr, 0, &pool, &cancelled).ok());
  EXPECT_EQ(o[0], 2);
  EXPECT_EQ(o[kN - 1], 2);
}

}  // namespace opserver::kernels
