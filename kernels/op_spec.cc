#include "kernels/op_spec.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"

namespace opserver::kernels {
namespace {

// Dimension k of `shape` aligned right in `rank` dimensions (1 where it
// has none).
int64_t DimAt(const std::vector<int64_t>& shape, size_t rank, size_t k) {
  const size_t lead = rank - shape.size();
  return k < lead ? 1 : shape[k - lead];
}

absl::Status Broadcast(const TensorView& a, absl::string_view a_name,
                       const TensorView& b, absl::string_view b_name,
                       std::vector<int64_t>* out) {
  size_t k = 0;
  std::optional<std::vector<int64_t>> shape =
      BroadcastShapes(a.shape, b.shape, &k);
  if (!shape.has_value()) {
    const size_t rank = std::max(a.shape.size(), b.shape.size());
    return ParamInvalid(absl::StrCat(
        a_name, " shape ", ShapeStr(a.shape), " and ", b_name, " shape ",
        ShapeStr(b.shape), " cannot be broadcast (dimension ", k, ": ",
        DimAt(a.shape, rank, k), " vs ", DimAt(b.shape, rank, k), ")"));
  }
  *out = *std::move(shape);
  return absl::OkStatus();
}

}  // namespace

std::optional<std::vector<int64_t>> BroadcastShapes(
    const std::vector<int64_t>& a, const std::vector<int64_t>& b,
    size_t* mismatch) {
  const size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank, 1);
  for (size_t k = 0; k < rank; ++k) {
    const int64_t da = DimAt(a, rank, k);
    const int64_t db = DimAt(b, rank, k);
    if (da != db && da != 1 && db != 1) {
      if (mismatch != nullptr) *mismatch = k;
      return std::nullopt;
    }
    out[k] = da == 1 ? db : da;
  }
  return out;
}

std::string ShapeStr(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string DTypeList(const std::vector<DType>& dtypes) {
  return absl::StrJoin(dtypes, ", ", [](std::string* out, DType d) {
    absl::StrAppend(out, DTypeName(d));
  });
}

bool Contains(const std::vector<DType>& v, DType d) {
  return std::find(v.begin(), v.end(), d) != v.end();
}

absl::Status CheckDType(const OpInfo& info, const TensorView& t,
                        absl::string_view name,
                        const std::vector<DType>& allowed) {
  if (Contains(allowed, t.dtype)) return absl::OkStatus();
  return ParamInvalid(absl::StrCat(name, " has dtype ", DTypeName(t.dtype),
                                   "; ", info.name, " supports ",
                                   DTypeList(allowed)));
}

absl::Status CheckSameDType(const TensorView& t, absl::string_view name,
                            const TensorView& ref, absl::string_view ref_name) {
  if (t.dtype == ref.dtype) return absl::OkStatus();
  return ParamInvalid(absl::StrCat(name, " has dtype ", DTypeName(t.dtype),
                                   " but ", ref_name, " has ",
                                   DTypeName(ref.dtype), "; they must match"));
}

absl::Status CheckOutShape(const TensorView& out, absl::string_view out_name,
                           const std::vector<int64_t>& expected,
                           absl::string_view what) {
  if (out.shape == expected) return absl::OkStatus();
  return ParamInvalid(absl::StrCat(out_name, " shape ", ShapeStr(out.shape),
                                   " must equal ", what, " ",
                                   ShapeStr(expected)));
}

absl::Status CheckInputDTypes(const OpInfo& info, const OpCall& call) {
  const Names n(info);
  absl::Status st =
      CheckDType(info, *call.grad_output, n.g, info.tensors[0].dtypes);
  if (st.ok()) st = CheckDType(info, *call.self, n.s, info.tensors[1].dtypes);
  return st;
}

absl::Status CheckOneDType(const OpInfo& info, const OpCall& call) {
  const Names n(info);
  const TensorView& g = *call.grad_output;
  absl::Status st = CheckDType(info, g, n.g, info.tensors[0].dtypes);
  if (st.ok()) st = CheckSameDType(*call.self, n.s, g, n.g);
  if (st.ok()) st = CheckSameDType(*call.out, n.o, g, n.g);
  return st;
}

absl::Status CheckBroadcastOut(const OpInfo& info, const OpCall& call,
                               std::vector<int64_t>* out_shape) {
  const Names n(info);
  RETURN_IF_ERROR(
      Broadcast(*call.grad_output, n.g, *call.self, n.s, out_shape));
  return CheckOutShape(
      *call.out, n.o, *out_shape,
      absl::StrCat("the broadcast shape of ", n.g, " and ", n.s));
}

}  // namespace opserver::kernels
