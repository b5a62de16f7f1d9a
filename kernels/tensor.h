// A strided view of device memory, as aclCreateTensor describes one.
#ifndef OPSERVER_KERNELS_TENSOR_H_
#define OPSERVER_KERNELS_TENSOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"

namespace opserver::kernels {

// aclnn tensors have at most 8 dimensions.
inline constexpr int kMaxRank = 8;

// Element (i_0, ..., i_{r-1}) lives at
//   data + (offset + sum_k i_k * strides[k]) * DTypeSize(dtype)
// An empty `shape` is a 0-dim (scalar) tensor with one element.
struct TensorView {
  DType dtype = DType::kFloat;
  std::vector<int64_t> shape;
  // In elements; empty means contiguous row-major. Otherwise one per dim.
  std::vector<int64_t> strides;
  // In elements, from `data`.
  int64_t offset = 0;
  // The shape of the underlying storage (aclCreateTensor's storageDims).
  // Empty means "not given"; when given, the view must lie inside it.
  std::vector<int64_t> storage_shape;
  // Base of the storage (not of the first element).
  void* data = nullptr;
};

// Product of `shape` (1 for a 0-dim shape); only meaningful for validated
// shapes (non-negative, no overflow).
int64_t NumElements(const std::vector<int64_t>& shape);
int64_t NumElements(const TensorView& view);

// Row-major strides, in elements, for `shape`.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape);

// `view.strides`, or the row-major strides when they are not given.
std::vector<int64_t> EffectiveStrides(const TensorView& view);

// True when the elements are laid out row-major without gaps (strides of
// size-1 dimensions are ignored, as they never move the address).
bool IsContiguous(const TensorView& view);

// Checks that `view` is well formed and lies inside `storage_bytes_available`
// bytes starting at view.data: known dtype, rank <= 8, dims >= 0, either no
// strides or one per dim, strides >= 0 and offset >= 0 (aclnn accepts no
// negative strides, so they are rejected), no int64 overflow in any size or
// address computation (the non-zero dims multiply within int64 even when
// another dim is 0), and the furthest element ends within the storage.
// An empty view (a zero dimension) needs no storage. Errors are 161002
// (INVALID_ARGUMENT) with a message starting with `name`.
absl::Status CheckTensorBounds(const TensorView& view,
                               int64_t storage_bytes_available,
                               absl::string_view name = "tensor");

// The structural part of CheckTensorBounds without a storage limit; on
// success sets `*max_element` to the element index (from data) of the
// furthest element, or -1 for an empty view.
absl::Status CheckTensorLayout(const TensorView& view, absl::string_view name,
                               int64_t* max_element);

// For a view that passed CheckTensorLayout: 161002 (INVALID_ARGUMENT) when
// two of its elements share an address (a stride of 0 on a dimension > 1,
// or strides that interleave), OK otherwise. Outputs must pass it: writes
// through an overlapping view race, and a few bytes of storage could
// otherwise describe ~2^62 elements of work. The test is PyTorch's
// sufficient condition (dims sorted by stride, each stride past the extent
// of the smaller ones), so a few exotic non-overlapping views are refused.
absl::Status CheckNoInternalOverlap(const TensorView& view,
                                    absl::string_view name = "tensor");

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_TENSOR_H_
