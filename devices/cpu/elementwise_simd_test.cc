#include "devices/cpu/elementwise_simd.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "kernels/half.h"
#include "kernels/ops/dropout_backward.h"
#include "kernels/ops/hardswish_backward.h"
#include "kernels/ops/leaky_relu_backward.h"
#include "kernels/ops/softshrink_backward.h"
#include "kernels/ops/threshold_backward.h"

namespace opserver::kernels {
namespace {

using cpu::ContigFn;
using cpu::SimdContigKernel;

// Every operator/dtype the SIMD list names is reachable, and nothing else:
// a broken list would silently fall back to the (correct, slower) strided
// kernels, which the result tests cannot see.
TEST(SimdContigKernel, CoversExactlyTheListedOperatorsAndDTypes) {
  const std::vector<std::pair<OpKind, std::vector<DType>>> simd = {
      {OpKind::kThresholdBackward,
       {DType::kFloat, DType::kFloat16, DType::kBFloat16, DType::kInt32,
        DType::kInt8, DType::kUint8}},
      {OpKind::kSoftshrinkBackward,
       {DType::kFloat, DType::kFloat16, DType::kBFloat16}},
      {OpKind::kHardswishBackward,
       {DType::kFloat, DType::kFloat16, DType::kBFloat16}},
      {OpKind::kLeakyReluBackward,
       {DType::kFloat, DType::kFloat16, DType::kBFloat16, DType::kDouble}},
      {OpKind::kDropoutBackward,
       {DType::kFloat, DType::kFloat16, DType::kBFloat16}},
  };
  const DType all[] = {DType::kFloat,   DType::kFloat16, DType::kInt8,
                       DType::kInt32,   DType::kUint8,   DType::kInt16,
                       DType::kUint16,  DType::kUint32,  DType::kInt64,
                       DType::kUint64,  DType::kDouble,  DType::kBool,
                       DType::kBFloat16};
  for (const auto& [op, dtypes] : simd) {
    for (DType d : all) {
      bool listed = false;
      for (DType l : dtypes) listed = listed || l == d;
      EXPECT_EQ(SimdContigKernel(op, d) != nullptr, listed)
          << static_cast<int>(op) << " " << DTypeName(d);
    }
  }
  // Distinct kernels for distinct entries.
  EXPECT_NE(SimdContigKernel(OpKind::kThresholdBackward, DType::kFloat),
            SimdContigKernel(OpKind::kHardswishBackward, DType::kFloat));
  EXPECT_NE(SimdContigKernel(OpKind::kLeakyReluBackward, DType::kFloat),
            SimdContigKernel(OpKind::kLeakyReluBackward, DType::kDouble));
}

// ---- BFLOAT16, bit for bit against the scalar formulas ----------------------
//
// The bf16 SIMD kernels split 2N elements into two float vectors and pack
// them back with their own round-to-nearest-even, so every element must
// come out with exactly the bits of the scalar formula rounded by
// FloatToBFloat16: NaN payloads and the quiet bit, signed zeros,
// subnormals, and ties at the bf16 halfway point.

// bf16 bit patterns planted among random bits: ±0, ±Inf, quiet and
// signalling NaNs (with every mantissa bit set too), the smallest and
// largest subnormals and normals, the largest finite value, and the
// hardswish boundaries ±3 with their neighbours and values whose
// derivative has few significant bits (so g * deriv often ties).
constexpr uint16_t kSpecialBF16[] = {
    0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0x7FFF,
    0xFFFF, 0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x8080, 0x7F7F,
    0xFF7F, 0x4040, 0xC040, 0x403F, 0x4041, 0xC03F, 0xC041, 0x3F40,
    0xBF40, 0x3FC0, 0xBFC0, 0x3EC0, 0x3F80, 0xBF80, 0x3F00, 0xBF00};

uint16_t RandomBF16(std::mt19937& rng, int64_t i) {
  // A third specials, a third random bits (every class, often
  // subnormal or NaN), a third finite values of moderate size.
  switch (rng() % 3) {
    case 0:
      return kSpecialBF16[rng() % (sizeof(kSpecialBF16) / 2)];
    case 1:
      return static_cast<uint16_t>(rng());
    default:
      return static_cast<uint16_t>(0x3C00 + rng() % 0x0600) |
             static_cast<uint16_t>((i & 1) << 15);
  }
}

float F(uint16_t b) { return BFloat16ToFloat(b); }

struct BF16Case {
  std::string name;
  OpKind op;
  KernelParams params;
  // The scalar formula on element i (x is self's bits, or the mask bit).
  std::function<float(float g, uint16_t x, bool bit)> formula;
  // Whether the inputs make the result land on the bf16 halfway point
  // (a scalar of few significant bits; 2 is exact, 0.01 rarely ties).
  bool ties = false;
};

std::vector<BF16Case> BF16Cases() {
  std::vector<BF16Case> cases;
  KernelParams p;
  cases.push_back({"HardswishBackward", OpKind::kHardswishBackward, p,
                   [](float g, uint16_t x, bool) {
                     return HardswishFormula<float>(KernelParams())(g, F(x));
                   },
                   true});
  for (float slope : {0.01f, 1.5f, -0.25f}) {
    KernelParams q;
    q.slope_f = slope;
    q.slope_d = slope;
    cases.push_back({"LeakyReluBackward slope " + std::to_string(slope),
                     OpKind::kLeakyReluBackward, q,
                     [q](float g, uint16_t x, bool) {
                       return LeakyFormula<float>(q)(g, F(x));
                     },
                     slope != 0.01f});
  }
  for (float scale : {2.0f, 1.5f, 1.0f / 0.7f}) {
    KernelParams q;
    q.scale = scale;
    q.dropout_mode = DropoutMode::kScale;
    cases.push_back(
        {"DropoutBackward scale " + std::to_string(scale),
         OpKind::kDropoutBackward, q,
         [q](float g, uint16_t, bool bit) { return DropoutFormula(q)(g, bit); },
         scale == 1.5f});
  }
  KernelParams t;
  t.threshold = 0.25f;
  cases.push_back({"ThresholdBackward", OpKind::kThresholdBackward, t,
                   [t](float g, uint16_t x, bool) {
                     return ThresholdFormula<float>(t)(g, F(x));
                   }});
  KernelParams l;
  l.lambd = 0.5f;
  cases.push_back({"SoftshrinkBackward", OpKind::kSoftshrinkBackward, l,
                   [l](float g, uint16_t x, bool) {
                     return SoftshrinkFormula<float>(l)(g, F(x));
                   }});
  return cases;
}

enum class Alias { kNone, kOutIsGrad, kOutIsSelf };

// Runs one case over n elements starting `offset` elements into their
// buffers and compares every output bit pattern; returns how many expected
// results were exact ties before rounding.
int64_t CheckBF16(const BF16Case& c, int64_t n, size_t offset, Alias alias,
                  bool stream, int64_t bit0, uint32_t seed) {
  const bool dropout = c.op == OpKind::kDropoutBackward;
  std::mt19937 rng(seed);
  // 64-byte aligned storage, so `offset` sets the alignment seen by the
  // kernel (streaming stores need a vector-aligned output).
  const size_t len = static_cast<size_t>(n) + offset + 32;
  std::vector<uint16_t> g_buf(len + 32), s_buf(len + 32), o_buf(len + 32);
  auto aligned = [](std::vector<uint16_t>& v) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + ((64 - a % 64) % 64) / 2;
  };
  uint16_t* g = aligned(g_buf) + offset;
  uint16_t* s = aligned(s_buf) + offset;
  uint16_t* o = aligned(o_buf) + offset;
  std::vector<uint8_t> mask(static_cast<size_t>((bit0 + n + 7) / 8 + 8));
  for (uint8_t& m : mask) m = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < n; ++i) {
    g[i] = RandomBF16(rng, i);
    s[i] = RandomBF16(rng, i + 1);
    o[i] = 0x5555;
  }
  std::vector<uint16_t> expected(n);
  int64_t ties = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t bit = static_cast<uint64_t>(bit0 + i);
    const float r = c.formula(F(g[i]), s[i], (mask[bit / 8] >> (bit % 8)) & 1);
    expected[i] = FloatToBFloat16(r);
    if ((FloatBits(r) & 0xFFFFu) == 0x8000u && !std::isnan(r)) ++ties;
  }
  uint16_t* out = alias == Alias::kOutIsGrad   ? g
                  : alias == Alias::kOutIsSelf ? s
                                               : o;
  const ContigFn fn = SimdContigKernel(c.op, DType::kBFloat16);
  if (fn == nullptr) {
    ADD_FAILURE() << c.name << " has no bf16 SIMD kernel";
    return 0;
  }
  fn(c.params, g, dropout ? static_cast<const void*>(mask.data()) : s, out, n,
     bit0, stream);
  int reported = 0;
  for (int64_t i = 0; i < n && reported < 5; ++i) {
    if (out[i] != expected[i]) {
      ADD_FAILURE() << c.name << " n=" << n << " offset=" << offset
                    << " alias=" << static_cast<int>(alias)
                    << " stream=" << stream << " bit0=" << bit0 << ": element "
                    << i << " is 0x" << std::hex << out[i] << ", expected 0x"
                    << expected[i] << std::dec;
      ++reported;
    }
  }
  // Nothing written past the end (only checked where out is its own
  // buffer, whose tail still holds the fill).
  if (alias == Alias::kNone) {
    for (int64_t i = n; i < n + 16; ++i) {
      EXPECT_EQ(o[i], 0) << c.name << " wrote past element " << n;
    }
  }
  return ties;
}

TEST(BFloat16Kernels, BitIdenticalToTheScalarFormulas) {
  // One 512-bit vector is 16 floats and 32 bf16 (the bf16 loop's step);
  // each around that, smaller targets' widths, and large.
  const int64_t sizes[] = {1,  2,  3,  7,  8,  9,  15, 16, 17,   31,   32,
                           33, 47, 48, 63, 64, 65, 95, 97, 1000, 4099, 100003};
  // Every instruction set this CPU runs, not just the one dispatch picks.
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    uint32_t seed = 7;
    for (const BF16Case& c : BF16Cases()) {
      int64_t ties = 0;
      for (int64_t n : sizes) {
        for (size_t offset : {size_t{0}, size_t{1}, size_t{7}}) {
          for (bool stream : {false, true}) {
            ties += CheckBF16(c, n, offset, Alias::kNone, stream, 0, seed++);
          }
        }
        ties += CheckBF16(c, n, 0, Alias::kOutIsGrad, true, 0, seed++);
        ties += CheckBF16(c, n, 3, Alias::kOutIsGrad, false, 0, seed++);
        if (c.op == OpKind::kDropoutBackward) {
          for (int64_t bit0 : {1, 5, 8, 13}) {
            ties += CheckBF16(c, n, 0, Alias::kNone, true, bit0, seed++);
          }
        } else {
          ties += CheckBF16(c, n, 0, Alias::kOutIsSelf, true, 0, seed++);
        }
      }
      if (c.ties) {
        EXPECT_GT(ties, 100) << c.name << " never ties";
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// ---- FLOAT16 at every vector width ------------------------------------------
//
// The fp16 kernels compute in float. Targets without a hardware conversion
// (all of Arm's) store each result vector through a stack buffer and
// convert it lane by lane: the buffer must hold the target's widest vector
// (SVE's 2048-bit vectors hold 64 floats), which this test reaches under
// qemu's SVE CPU (scripts/test-arm64.sh). Every element is the scalar
// formula's float rounded by FloatToHalf, and nothing past the end is
// written.

struct F16Case {
  std::string name;
  OpKind op;
  KernelParams params;
  std::function<float(float g, float x, bool bit)> formula;
};

std::vector<F16Case> F16Cases() {
  std::vector<F16Case> cases;
  cases.push_back({"HardswishBackward", OpKind::kHardswishBackward,
                   KernelParams(), [](float g, float x, bool) {
                     return HardswishFormula<float>(KernelParams())(g, x);
                   }});
  KernelParams l;
  l.slope_f = 1.5f;
  l.slope_d = 1.5;
  cases.push_back(
      {"LeakyReluBackward", OpKind::kLeakyReluBackward, l,
       [l](float g, float x, bool) { return LeakyFormula<float>(l)(g, x); }});
  KernelParams d;
  d.scale = 2.0f;
  d.dropout_mode = DropoutMode::kScale;
  cases.push_back(
      {"DropoutBackward", OpKind::kDropoutBackward, d,
       [d](float g, float, bool bit) { return DropoutFormula(d)(g, bit); }});
  KernelParams t;
  t.threshold = 0.25f;
  cases.push_back({"ThresholdBackward", OpKind::kThresholdBackward, t,
                   [t](float g, float x, bool) {
                     return ThresholdFormula<float>(t)(g, x);
                   }});
  KernelParams s;
  s.lambd = 0.5f;
  cases.push_back({"SoftshrinkBackward", OpKind::kSoftshrinkBackward, s,
                   [s](float g, float x, bool) {
                     return SoftshrinkFormula<float>(s)(g, x);
                   }});
  return cases;
}

void CheckF16(const F16Case& c, int64_t n, size_t offset, uint32_t seed) {
  std::mt19937 rng(seed);
  constexpr uint16_t kFill = 0x5555;
  const size_t len = static_cast<size_t>(n) + offset + 256;
  std::vector<uint16_t> g(len), s(len), o(len, kFill);
  // Finite halves of either sign between 1/8 and 16, and some zeros.
  auto random_half = [&rng] {
    if (rng() % 16 == 0) return uint16_t{0};
    return static_cast<uint16_t>((0x3000 + rng() % 0x1C00) |
                                 ((rng() & 1) << 15));
  };
  for (size_t i = 0; i < len; ++i) {
    g[i] = random_half();
    s[i] = random_half();
  }
  std::vector<uint8_t> mask(static_cast<size_t>((n + 7) / 8 + 8));
  for (uint8_t& m : mask) m = static_cast<uint8_t>(rng());
  const bool dropout = c.op == OpKind::kDropoutBackward;
  const ContigFn fn = SimdContigKernel(c.op, DType::kFloat16);
  ASSERT_NE(fn, nullptr) << c.name << " has no fp16 SIMD kernel";
  fn(c.params, g.data() + offset,
     dropout ? static_cast<const void*>(mask.data()) : s.data() + offset,
     o.data() + offset, n, 0, false);
  int reported = 0;
  for (int64_t i = 0; i < n && reported < 5; ++i) {
    const size_t k = offset + static_cast<size_t>(i);
    const bool bit = (mask[i / 8] >> (i % 8)) & 1;
    const uint16_t want =
        FloatToHalf(c.formula(HalfToFloat(g[k]), HalfToFloat(s[k]), bit));
    if (o[k] != want) {
      ADD_FAILURE() << c.name << " n=" << n << " offset=" << offset
                    << ": element " << i << " is 0x" << std::hex << o[k]
                    << ", expected 0x" << want << std::dec;
      ++reported;
    }
  }
  for (size_t k = 0; k < offset; ++k) {
    EXPECT_EQ(o[k], kFill) << c.name << " wrote before element 0";
  }
  for (size_t k = offset + static_cast<size_t>(n); k < len; ++k) {
    EXPECT_EQ(o[k], kFill) << c.name << " wrote past element " << n;
  }
}

TEST(Float16Kernels, EveryTargetAndVectorWidthMatchesTheScalarFormulas) {
  // Around 4, 8, 16, 32 and 64 floats per vector (128 to 2048 bits).
  const int64_t sizes[] = {1,   3,   4,   5,   7,   8,   9,   15,   16,
                           17,  31,  32,  33,  63,  64,  65,  127,  128,
                           129, 191, 192, 193, 255, 256, 257, 1000, 4099};
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    uint32_t seed = 11;
    for (const F16Case& c : F16Cases()) {
      for (int64_t n : sizes) {
        for (size_t offset : {size_t{0}, size_t{1}}) {
          CheckF16(c, n, offset, seed++);
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The instruction sets the per-target tests above run, in the log; with
// OPSERVER_EXPECT_SIMD_TARGETS set (scripts/test-arm64.sh names those of
// each emulated CPU), exactly those, so an emulator or build offering fewer
// cannot leave a target's code unrun unnoticed.
TEST(SimdTargets, RunsEveryInstructionSetThisCpuOffers) {
  std::string names;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (!names.empty()) names += ",";
    names += hwy::TargetName(target);
  }
  ASSERT_FALSE(names.empty());
  std::cout << "SIMD targets run: " << names << "\n";
  if (const char* want = std::getenv("OPSERVER_EXPECT_SIMD_TARGETS")) {
    EXPECT_EQ(names, want);
  }
}

}  // namespace
}  // namespace opserver::kernels
