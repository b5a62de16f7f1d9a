#include "devices/cpu/plan.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"

namespace opserver::cpu {
namespace {

using kernels::AclnnError;
using kernels::DTypeName;
using kernels::DTypeSize;
using kernels::EffectiveStrides;
using kernels::GetOpInfo;
using kernels::kAclnnErrInner;
using kernels::kMaxRank;
using kernels::NumElements;
using kernels::OpCall;
using kernels::OpInfo;
using kernels::ParamInvalid;
using kernels::ParamNullptr;
using kernels::TensorView;
using kernels::ValidCall;

// Tuning (measured on the 2-core Zen 5 machine, see BENCHMARKS.md):
// below kMinParallelElements a thread hand-off costs more than it saves;
// tasks are at least kMinTaskElements and a multiple of kTaskAlign elements
// (whole SIMD vectors and whole mask bytes); outputs of at least
// kStreamMinBytes bypass the caches with non-temporal stores.
constexpr int64_t kMinParallelElements = 64 * 1024;
constexpr int64_t kMinTaskElements = 32 * 1024;
constexpr int64_t kTaskAlign = 1024;
constexpr int64_t kTasksPerThread = 4;
constexpr int64_t kStreamMinBytes = 4 * 1024 * 1024;
// With a cancel flag, a launch looks at it after each piece of this many
// elements (a millisecond or less), so a 2^31-element launch stops within
// about that once cancelled. A multiple of kTaskAlign.
constexpr int64_t kCancelCheckElements = 1024 * 1024;

// Byte strides of `t` broadcast to `shape` (stride 0 on stretched dims).
std::vector<int64_t> BroadcastByteStrides(const TensorView& t,
                                          const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 0);
  const std::vector<int64_t> eff = EffectiveStrides(t);
  const size_t lead = shape.size() - t.shape.size();
  const int64_t esize = DTypeSize(t.dtype);
  for (size_t k = 0; k < t.shape.size(); ++k) {
    if (t.shape[k] != 1) strides[lead + k] = eff[k] * esize;
  }
  return strides;
}

}  // namespace

absl::StatusOr<Plan> PrepareOp(const OpCall& call) {
  ASSIGN_OR_RETURN(ValidCall valid, kernels::Validate(call));
  return PlanCall(valid);
}

absl::StatusOr<std::unique_ptr<DevicePlan>> HostPlan::Prepare(
    const Device* device, ValidCall valid) {
  ASSIGN_OR_RETURN(Plan plan, PlanCall(valid));
  return std::unique_ptr<DevicePlan>(
      new HostPlan(device, std::move(valid), std::move(plan)));
}

absl::StatusOr<const Plan*> HostPlan::Of(const DevicePlan& plan,
                                         const Device* device) {
  // Checked, not assumed: a plan that names this device but is not a
  // HostPlan must not be read as one.
  const auto* host = dynamic_cast<const HostPlan*>(&plan);
  if (plan.device() != device || host == nullptr) {
    return absl::InternalError(
        "a launch was prepared by another device than the stream's");
  }
  return &host->plan_;
}

absl::StatusOr<Plan> PlanCall(const ValidCall& valid) {
  const OpCall& call = valid.call;
  const OpInfo& info = GetOpInfo(call.op);
  Plan plan;
  plan.out_shape_ = valid.out_shape;
  plan.params_ = valid.params;
  const TensorView& g = *call.grad_output;
  const TensorView& s = *call.self;
  const TensorView& o = *call.out;
  // A bit-mask input (DropoutBackward's mask) is addressed by element index.
  const bool mask_input = info.bit_mask_input;
  plan.kernel_ = FindKernel(call.op, g.dtype, s.dtype, o.dtype);
  if (plan.kernel_ == nullptr) {
    return AclnnError(
        kAclnnErrInner, absl::StatusCode::kInternal,
        absl::StrCat("no kernel for ", info.name, " with ", DTypeName(g.dtype),
                     ", ", DTypeName(s.dtype), ", ", DTypeName(o.dtype)));
  }
  plan.call_ = call;
  plan.numel_ = NumElements(plan.out_shape_);
  if (plan.numel_ == 0) return plan;

  // Iteration space: out's shape; inputs broadcast into it. A bit-mask
  // input is addressed by linear element index, not by strides.
  const std::vector<int64_t>& shape = plan.out_shape_;
  const std::vector<int64_t> gs = BroadcastByteStrides(g, shape);
  const std::vector<int64_t> ss = mask_input
                                      ? std::vector<int64_t>(shape.size(), 0)
                                      : BroadcastByteStrides(s, shape);
  const std::vector<int64_t> os = BroadcastByteStrides(o, shape);
  int nd = 0;
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == 1) continue;
    if (nd > 0) {
      // Merge into the previous dim when that is one step of this one in
      // every operand. Preserves the row-major element order (and so the
      // mask bit index).
      const int j = nd - 1;
      if (plan.g_strides_[j] == gs[k] * shape[k] &&
          plan.s_strides_[j] == ss[k] * shape[k] &&
          plan.o_strides_[j] == os[k] * shape[k]) {
        plan.dims_[j] *= shape[k];
        plan.g_strides_[j] = gs[k];
        plan.s_strides_[j] = ss[k];
        plan.o_strides_[j] = os[k];
        continue;
      }
    }
    plan.dims_[nd] = shape[k];
    plan.g_strides_[nd] = gs[k];
    plan.s_strides_[nd] = ss[k];
    plan.o_strides_[nd] = os[k];
    ++nd;
  }
  const int64_t g_size = DTypeSize(g.dtype);
  const int64_t s_size = DTypeSize(s.dtype);
  const int64_t o_size = DTypeSize(o.dtype);
  if (nd == 0) {  // One element.
    plan.dims_[0] = 1;
    plan.g_strides_[0] = g_size;
    plan.s_strides_[0] = mask_input ? 0 : s_size;
    plan.o_strides_[0] = o_size;
    nd = 1;
  }
  plan.ndim_ = nd;
  const int in = nd - 1;
  plan.unit_inner_ = plan.kernel_->contig != nullptr &&
                     plan.g_strides_[in] == g_size &&
                     plan.o_strides_[in] == o_size &&
                     (mask_input || plan.s_strides_[in] == s_size);
  // numel * o_size cannot overflow: `out` does not overlap itself, so its
  // numel elements lie inside an extent CheckTensor found to fit int64.
  plan.stream_ = plan.unit_inner_ && plan.numel_ * o_size >= kStreamMinBytes;
  plan.g_base_ = static_cast<const char*>(g.data) + g.offset * g_size;
  plan.s_base_ = static_cast<const char*>(s.data) + s.offset * s_size;
  plan.o_base_ = static_cast<char*>(o.data) + o.offset * o_size;
  // The workspace (see Validate) holds the gathered mask.
  plan.workspace_size_ = valid.workspace_size;
  plan.gather_mask_ = plan.workspace_size_ > 0;
  return plan;
}

void Plan::RunRange(const char* s_base, int64_t begin, int64_t end,
                    bool stream) const {
  const int nd = ndim_;
  const int in = nd - 1;
  const int64_t inner = dims_[in];
  int64_t idx[kMaxRank];
  int64_t j = begin % inner;
  int64_t rest = begin / inner;
  const char* g = g_base_ + j * g_strides_[in];
  const char* s = s_base + j * s_strides_[in];
  char* o = o_base_ + j * o_strides_[in];
  for (int k = in - 1; k >= 0; --k) {
    idx[k] = rest % dims_[k];
    rest /= dims_[k];
    g += idx[k] * g_strides_[k];
    s += idx[k] * s_strides_[k];
    o += idx[k] * o_strides_[k];
  }
  const Kernel& kernel = *kernel_;
  int64_t pos = begin;
  while (pos < end) {
    const int64_t n = std::min(inner - j, end - pos);
    if (unit_inner_) {
      kernel.contig(params_, g, s, o, n, pos, stream);
    } else {
      kernel.strided(params_, g, g_strides_[in], s, s_strides_[in], o,
                     o_strides_[in], n, pos);
    }
    pos += n;
    if (pos >= end) break;
    // Back to the row start, then one step of the outer odometer.
    g -= j * g_strides_[in];
    s -= j * s_strides_[in];
    o -= j * o_strides_[in];
    j = 0;
    for (int k = in - 1; k >= 0; --k) {
      g += g_strides_[k];
      s += s_strides_[k];
      o += o_strides_[k];
      if (++idx[k] < dims_[k]) break;
      g -= g_strides_[k] * dims_[k];
      s -= s_strides_[k] * dims_[k];
      o -= o_strides_[k] * dims_[k];
      idx[k] = 0;
    }
  }
}

namespace {

// Copies the bytes of a strided UINT8 view into `dst` in row-major order.
void GatherBytes(const TensorView& t, uint8_t* dst) {
  const std::vector<int64_t> strides = EffectiveStrides(t);
  const uint8_t* base = static_cast<const uint8_t*>(t.data) + t.offset;
  const int rank = static_cast<int>(t.shape.size());
  if (rank == 0) {
    dst[0] = base[0];
    return;
  }
  int64_t idx[kMaxRank] = {0};
  const int64_t inner = t.shape[rank - 1];
  const int64_t inner_stride = strides[rank - 1];
  const int64_t rows = NumElements(t) / inner;
  const uint8_t* row = base;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < inner; ++j) *dst++ = row[j * inner_stride];
    for (int k = rank - 2; k >= 0; --k) {
      row += strides[k];
      if (++idx[k] < t.shape[k]) break;
      row -= strides[k] * t.shape[k];
      idx[k] = 0;
    }
  }
}

}  // namespace

absl::Status RunPlan(const Plan& plan, void* workspace, uint64_t workspace_size,
                     ThreadPool* pool, const std::atomic<bool>* cancelled,
                     ComputeTurns* turns, int party) {
  if (workspace_size < plan.workspace_size_) {
    return ParamInvalid(
        absl::StrCat("workspaceSize ", workspace_size, " is smaller than the ",
                     plan.workspace_size_, " bytes the plan needs"));
  }
  if (plan.workspace_size_ > 0 && workspace == nullptr) {
    return ParamNullptr(absl::StrCat("workspace is null but the plan needs ",
                                     plan.workspace_size_, " bytes"));
  }
  if (plan.numel_ == 0) return absl::OkStatus();
  if (plan.numel_ <= ComputeTurns::kSmallElements) turns = nullptr;
  const char* s_base = plan.s_base_;
  if (plan.gather_mask_) {
    GatherBytes(*plan.call_.self, static_cast<uint8_t*>(workspace));
    s_base = static_cast<const char*>(workspace);
  }
  // [begin, end) in pieces, checking the cancel flag and taking a turn
  // for each.
  auto run = [&](int64_t begin, int64_t end) {
    if (cancelled == nullptr && turns == nullptr) {
      plan.RunRange(s_base, begin, end, plan.stream_);
      return;
    }
    for (int64_t at = begin; at < end; at += kCancelCheckElements) {
      if (cancelled != nullptr && cancelled->load(std::memory_order_relaxed)) {
        return;
      }
      ComputeTurns::Turn turn(turns, party);
      plan.RunRange(s_base, at, std::min(end, at + kCancelCheckElements),
                    plan.stream_);
    }
  };
  const int64_t numel = plan.numel_;
  const int threads = pool == nullptr ? 1 : pool->num_threads();
  if (threads <= 1 || numel < kMinParallelElements) {
    run(0, numel);
  } else {
    int64_t tasks =
        std::min<int64_t>(threads * kTasksPerThread, numel / kMinTaskElements);
    tasks = std::max<int64_t>(tasks, 1);
    int64_t chunk = (numel + tasks - 1) / tasks;
    chunk = (chunk + kTaskAlign - 1) / kTaskAlign * kTaskAlign;
    tasks = (numel + chunk - 1) / chunk;
    pool->ParallelFor(tasks, [&](int64_t t) {
      const int64_t begin = t * chunk;
      run(begin, std::min(numel, begin + chunk));
    });
  }
  if (cancelled != nullptr && cancelled->load(std::memory_order_relaxed)) {
    return absl::CancelledError(
        "the launch was cancelled (its stream was destroyed, its session "
        "closed, or the server is shutting down); its output is partly "
        "written");
  }
  return absl::OkStatus();
}

}  // namespace opserver::cpu
