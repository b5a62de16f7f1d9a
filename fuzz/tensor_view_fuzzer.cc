// Tensor views with extreme shapes, strides and offsets, straight into the
// kernels' checks (kernels/tensor.h): CheckTensorBounds, CheckTensorLayout,
// CheckNoInternalOverlap, IsContiguous. The input is decoded field by field
// (see Decode below), each integer drawn from small values, extremes
// (0, ±1, 2^31, 2^32, 2^62, INT64_MAX, INT64_MIN, ...) or raw 8 bytes.
//
// Checked against an independent oracle in 128-bit arithmetic:
// - an accepted view lies inside its storage: offset + sum (d-1)*stride
//   elements end within the bytes available, without int64 overflow, and
//   its non-zero dims multiply within int64 (an empty view's too);
// - a small, plainly valid view is accepted;
// - a view accepted by CheckNoInternalOverlap has distinct element
//   addresses (enumerated when small) and at most as many elements as its
//   storage has element slots (the bound on a launch's work);
// - a contiguous view addresses element i at offset + i.
// Then the view, as all three tensors of ThresholdBackward, is planned and
// launched over a heap block of exactly the bytes available, so ASan sees
// any element the checks let through outside it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "devices/cpu/plan.h"
#include "fuzz/fuzz_support.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace {

using int128 = __int128;
using opserver::kernels::DType;
using opserver::kernels::TensorView;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kExtremes[] = {
    0,
    1,
    2,
    3,
    7,
    8,
    -1,
    -2,
    127,
    128,
    255,
    256,
    4095,
    4096,
    65535,
    65536,
    int64_t{1} << 31,
    (int64_t{1} << 31) - 1,
    int64_t{1} << 32,
    (int64_t{1} << 32) + 1,
    int64_t{1} << 62,
    (int64_t{1} << 62) + 1,
    kMax,
    kMax - 1,
    kMax / 2,
    kMax / 2 + 1,
    kMax / 3,
    kMax / 4,
    kMax / 8,
    kMin,
    kMin + 1,
    int64_t{1} << 61,
};
constexpr int32_t kDTypes[] = {0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 27,
                               // Not aclDataTypes.
                               5, 13, 26, 28, -1};

// Reads the input front to back; zeros once it runs out.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  int64_t Value() {
    switch (Byte() & 3) {
      case 0:
        return Byte();
      case 1:
        return kExtremes[Byte() % (sizeof(kExtremes) / sizeof(kExtremes[0]))];
      case 2: {
        uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v |= uint64_t{Byte()} << (8 * i);
        return static_cast<int64_t>(v);
      }
      default:
        return -static_cast<int64_t>(Byte());
    }
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

struct Input {
  TensorView view;
  int64_t available = 0;  // Storage bytes from view.data.
};

Input Decode(const uint8_t* data, size_t size) {
  Reader r(data, size);
  Input in;
  in.view.dtype = static_cast<DType>(
      kDTypes[r.Byte() % (sizeof(kDTypes) / sizeof(kDTypes[0]))]);
  const int rank = r.Byte() % 10;  // Up to 9: one past the limit.
  const int strides_mode = r.Byte() % 4;
  for (int k = 0; k < rank; ++k) in.view.shape.push_back(r.Value());
  int strides = 0;
  if (strides_mode == 1 || strides_mode == 2) strides = rank;
  if (strides_mode == 3) strides = rank + (r.Byte() % 2 ? 1 : -1);
  for (int k = 0; k < strides; ++k) in.view.strides.push_back(r.Value());
  in.view.offset = r.Value();
  const int storage_rank = r.Byte() % 16;  // 10..15: none given.
  for (int k = 0; k < storage_rank && storage_rank < 10; ++k) {
    in.view.storage_shape.push_back(r.Value());
  }
  in.available = r.Value();
  return in;
}

// The oracle's view of `v`: whether it is structurally valid and, if so,
// its element count and the end of its furthest element in bytes.
struct Extent {
  bool valid = false;
  bool empty = false;
  int128 numel = 0;
  int128 nonzero_numel = 0;  // Product of the non-zero dims.
  int128 end_bytes = 0;      // Saturates at 2^100.
};

constexpr int128 kCap = int128{1} << 100;

// a * b for a, b >= 0, saturating at kCap.
int128 SatMul(int128 a, int128 b) {
  if (a == 0 || b == 0) return 0;
  if (a > kCap / b) return kCap;
  return std::min(kCap, a * b);
}

Extent Measure(const TensorView& v) {
  Extent e;
  const int64_t esize = opserver::kernels::DTypeSize(v.dtype);
  if (esize == 0 || v.shape.size() > 8 || v.offset < 0) return e;
  if (!v.strides.empty() && v.strides.size() != v.shape.size()) return e;
  int128 numel = 1, nonzero = 1, furthest = v.offset, row = 1;
  for (size_t k = v.shape.size(); k-- > 0;) {
    const int64_t d = v.shape[k];
    if (d < 0) return e;
    if (!v.strides.empty() && v.strides[k] < 0) return e;
    const int128 stride = v.strides.empty() ? row : int128{v.strides[k]};
    if (d == 0) e.empty = true;
    numel = SatMul(numel, d);
    nonzero = SatMul(nonzero, std::max<int64_t>(d, 1));
    if (d > 0) furthest = std::min(kCap, furthest + SatMul(d - 1, stride));
    row = SatMul(row, std::max<int64_t>(d, 1));
  }
  e.valid = true;
  e.numel = numel;
  e.nonzero_numel = nonzero;
  e.end_bytes = e.empty ? 0 : SatMul(furthest + 1, esize);
  return e;
}

// Element offsets of a small view, in row-major index order.
std::vector<int64_t> Offsets(const TensorView& v) {
  const std::vector<int64_t> strides = opserver::kernels::EffectiveStrides(v);
  std::vector<int64_t> out;
  const int64_t n = opserver::kernels::NumElements(v);
  std::vector<int64_t> idx(v.shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t at = v.offset;
    for (size_t k = 0; k < v.shape.size(); ++k) at += idx[k] * strides[k];
    out.push_back(at);
    for (size_t k = v.shape.size(); k-- > 0;) {
      if (++idx[k] < v.shape[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

constexpr int64_t kSmallElements = 1 << 14;
constexpr int64_t kMaxStorage = 1 << 16;

namespace k = opserver::kernels;

// CheckTensorBounds and CheckTensorLayout against the oracle's extent `e`;
// their statuses.
std::pair<absl::Status, absl::Status> CheckBoundsAndLayout(const Input& in,
                                                           const Extent& e,
                                                           int64_t esize) {
  const TensorView& v = in.view;
  const absl::Status bounds = k::CheckTensorBounds(v, in.available, "t");
  opserver::fuzz::Report("CheckTensorBounds", bounds);
  int64_t max_element = -2;
  const absl::Status layout = k::CheckTensorLayout(v, "t", &max_element);
  FUZZ_CHECK(layout.ok() || !bounds.ok(),
             "bounds ok but layout not: ", layout.ToString());
  if (layout.ok()) {
    FUZZ_CHECK(e.valid, "an invalid view passed the layout check");
    // Whatever the order of the dims (an empty view too).
    FUZZ_CHECK(e.nonzero_numel <= kMax, "dims multiplying past int64 accepted");
    if (e.empty) {
      FUZZ_CHECK(max_element == -1, "empty view, max element ", max_element);
    } else {
      FUZZ_CHECK(e.numel <= kMax, "element count past int64 accepted");
      FUZZ_CHECK(e.end_bytes <= kMax, "extent past int64 accepted");
      FUZZ_CHECK(int128{max_element + 1} * esize == e.end_bytes, "max element ",
                 max_element, " disagrees with the oracle");
    }
  }
  if (bounds.ok() && !e.empty) {  // An empty view needs no storage.
    FUZZ_CHECK(e.end_bytes <= in.available, "a view ending past its ",
               in.available, " bytes was accepted");
  }
  // Small, plainly valid views are accepted.
  bool small = e.valid && in.available >= 0 && e.nonzero_numel <= kMax;
  for (int64_t d : v.shape) small &= d < (1 << 20);
  for (int64_t s : v.strides) small &= s < (1 << 20);
  small &= v.offset < (1 << 20);
  if (small && e.end_bytes <= in.available) {
    FUZZ_CHECK(bounds.ok(), "a valid view was refused: ", bounds.ToString());
  }
  return {bounds, layout};
}

// CheckNoInternalOverlap and IsContiguous against the elements' offsets
// (enumerated for small views).
void CheckOverlapAndContiguity(const TensorView& v, const Extent& e,
                               int64_t esize) {
  const absl::Status overlap = k::CheckNoInternalOverlap(v, "t");
  const bool enumerable = !e.empty && e.numel <= kSmallElements;
  std::vector<int64_t> offsets;
  if (enumerable) offsets = Offsets(v);
  if (overlap.ok() && !e.empty) {
    // Distinct elements: no more than the slots up to the furthest one.
    FUZZ_CHECK(e.numel * esize <= e.end_bytes, static_cast<double>(e.numel),
               " elements in an extent of ", static_cast<double>(e.end_bytes),
               " bytes passed the overlap check");
    if (enumerable) {
      std::vector<int64_t> sorted = offsets;
      std::sort(sorted.begin(), sorted.end());
      FUZZ_CHECK(
          std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
          "two elements share an address but the overlap check passed");
    }
  }
  if (enumerable && k::IsContiguous(v)) {
    for (size_t i = 0; i < offsets.size(); ++i) {
      FUZZ_CHECK(offsets[i] == v.offset + static_cast<int64_t>(i),
                 "contiguous view, element ", i, " at ", offsets[i]);
    }
  }
}

// Planned and launched over exactly `available` bytes: every element the
// plan touches must lie inside them.
void PlanOverStorage(Input& in, int64_t esize) {
  TensorView& v = in.view;
  std::unique_ptr<char[]> storage(new char[in.available]());
  v.data = storage.get();
  // An operator taking the view's dtype for all three tensors.
  k::OpCall call;
  if (v.dtype == DType::kDouble) {
    call.op = k::OpKind::kLeakyReluBackward;
    call.params.negative_slope = k::Scalar::Float(0.5);
  } else {
    call.op = k::OpKind::kThresholdBackward;
  }
  call.grad_output = v;
  call.self = v;
  call.out = v;
  absl::StatusOr<opserver::cpu::Plan> plan = opserver::cpu::PrepareOp(call);
  opserver::fuzz::Report("PrepareOp", plan.status());
  if (!plan.ok()) {
    FUZZ_CHECK(plan.status().code() != absl::StatusCode::kInternal,
               plan.status().ToString());
    return;
  }
  FUZZ_CHECK(plan->numel() * esize <= in.available, plan->numel(),
             " elements planned over ", in.available, " bytes");
  absl::Status run = opserver::cpu::RunPlan(*plan, nullptr, 0, nullptr);
  FUZZ_CHECK(run.ok(), run.ToString());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in = Decode(data, size);
  const Extent e = Measure(in.view);
  const int64_t esize = k::DTypeSize(in.view.dtype);
  const auto [bounds, layout] = CheckBoundsAndLayout(in, e, esize);
  if (!layout.ok()) return 0;
  CheckOverlapAndContiguity(in.view, e, esize);
  if (!bounds.ok() || in.available < 0 || in.available > kMaxStorage) {
    return 0;
  }
  PlanOverStorage(in, esize);
  return 0;
}
