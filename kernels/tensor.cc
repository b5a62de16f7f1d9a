#include "kernels/tensor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"

namespace opserver::kernels {

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t NumElements(const TensorView& view) { return NumElements(view.shape); }

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    strides[k] = s;
    s *= shape[k];
  }
  return strides;
}

std::vector<int64_t> EffectiveStrides(const TensorView& view) {
  if (view.strides.empty()) return ContiguousStrides(view.shape);
  return view.strides;
}

bool IsContiguous(const TensorView& view) {
  if (view.strides.empty()) return true;
  int64_t expected = 1;
  for (size_t k = view.shape.size(); k-- > 0;) {
    if (view.shape[k] != 1 && view.strides[k] != expected) return false;
    expected *= view.shape[k];
  }
  return true;
}

absl::Status CheckTensorLayout(const TensorView& view, absl::string_view name,
                               int64_t* max_element) {
  if (!IsKnownDType(static_cast<int32_t>(view.dtype))) {
    return ParamInvalid(absl::StrCat(name, " has unknown dtype ",
                                     static_cast<int32_t>(view.dtype)));
  }
  const size_t rank = view.shape.size();
  if (rank > static_cast<size_t>(kMaxRank)) {
    return ParamInvalid(absl::StrCat(name, " has ", rank,
                                     " dimensions; at most ", kMaxRank,
                                     " are supported"));
  }
  if (!view.strides.empty() && view.strides.size() != rank) {
    return ParamInvalid(absl::StrCat(name, " has ", view.strides.size(),
                                     " strides for ", rank,
                                     " dimensions; they must match"));
  }
  if (view.offset < 0) {
    return ParamInvalid(
        absl::StrCat(name, " has negative view offset ", view.offset));
  }
  // The product of the non-zero dims must fit, wherever a zero dim is: an
  // empty view is refused or accepted whatever the order of its dims (the
  // fuzzers found [2^60, 176, 0] refused but [0, 2^60, 176] accepted), and
  // any product of dims (element counts, row-major strides) fits int64.
  int64_t numel = 1;
  bool empty = false;
  for (size_t k = 0; k < rank; ++k) {
    const int64_t d = view.shape[k];
    if (d < 0) {
      return ParamInvalid(absl::StrCat(name, " has negative dimension ", d,
                                       " at index ", k, " of shape [",
                                       absl::StrJoin(view.shape, ","), "]"));
    }
    if (d == 0) {
      empty = true;
    } else if (__builtin_mul_overflow(numel, d, &numel)) {
      return ParamInvalid(absl::StrCat(name, " shape [",
                                       absl::StrJoin(view.shape, ","),
                                       "] overflows int64"));
    }
    if (!view.strides.empty() && view.strides[k] < 0) {
      return ParamInvalid(absl::StrCat(name, " has negative stride ",
                                       view.strides[k], " at index ", k,
                                       "; strides must be non-negative"));
    }
  }
  if (empty) {
    *max_element = -1;
    return absl::OkStatus();
  }
  // Strides of a contiguous view are products of dims: no overflow since
  // numel fits. Given strides may be anything non-negative.
  const std::vector<int64_t> strides = EffectiveStrides(view);
  int64_t furthest = view.offset;
  for (size_t k = 0; k < rank; ++k) {
    int64_t step;
    if (__builtin_mul_overflow(view.shape[k] - 1, strides[k], &step) ||
        __builtin_add_overflow(furthest, step, &furthest)) {
      return ParamInvalid(
          absl::StrCat(name, " strides and offset overflow int64"));
    }
  }
  int64_t end_bytes;
  if (__builtin_add_overflow(furthest, 1, &end_bytes) ||
      __builtin_mul_overflow(end_bytes, DTypeSize(view.dtype), &end_bytes)) {
    return ParamInvalid(absl::StrCat(name, " extent overflows int64"));
  }
  *max_element = furthest;
  return absl::OkStatus();
}

absl::Status CheckTensorBounds(const TensorView& view,
                               int64_t storage_bytes_available,
                               absl::string_view name) {
  int64_t max_element = -1;
  RETURN_IF_ERROR(CheckTensorLayout(view, name, &max_element));
  if (max_element < 0) return absl::OkStatus();
  const int64_t needed = (max_element + 1) * DTypeSize(view.dtype);
  if (needed > storage_bytes_available) {
    return ParamInvalid(absl::StrCat(name, " view reaches byte ", needed,
                                     " but its storage holds only ",
                                     storage_bytes_available, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckNoInternalOverlap(const TensorView& view,
                                    absl::string_view name) {
  if (view.strides.empty()) return absl::OkStatus();  // Row-major.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size), size > 1.
  for (size_t k = 0; k < view.shape.size(); ++k) {
    if (view.shape[k] == 0) return absl::OkStatus();  // No elements at all.
    if (view.shape[k] > 1) dims.emplace_back(view.strides[k], view.shape[k]);
  }
  std::sort(dims.begin(), dims.end());
  // `extent`: the furthest element offset reachable with the dims so far.
  // It is bounded by the layout check's furthest element, so no overflow.
  int64_t extent = 0;
  for (const auto& [stride, size] : dims) {
    if (stride <= extent) {
      return ParamInvalid(absl::StrCat(
          name, " (shape [", absl::StrJoin(view.shape, ","), "], strides [",
          absl::StrJoin(view.strides, ","),
          "]) has elements that overlap in memory; an output must address "
          "every element separately"));
    }
    extent += stride * (size - 1);
  }
  return absl::OkStatus();
}

}  // namespace opserver::kernels
