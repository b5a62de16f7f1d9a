// The five backward operators on the CPU: planning (after Validate, see
// validate.h) and launch. This is the kernels library's entry point for
// the server.
//
//   OpCall call{OpKind::kThresholdBackward, grad, self, out, params};
//   absl::StatusOr<Plan> plan = PrepareOp(call);    // GetWorkspaceSize
//   if (!plan.ok()) return GetAclnnStatus(plan.status());
//   ... allocate plan->workspace_size() bytes ...
//   absl::Status s = RunPlan(*plan, ws, ws_size, &pool);  // the launch
#ifndef OPSERVER_KERNELS_OPS_H_
#define OPSERVER_KERNELS_OPS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "kernels/elementwise_simd.h"
#include "kernels/kernel_table.h"
#include "kernels/op_kind.h"
#include "kernels/scalar.h"
#include "kernels/tensor.h"
#include "kernels/thread_pool.h"
#include "kernels/validate.h"

namespace opserver::kernels {

// A checked call with its iteration plan (aclnn's executor). Holds the
// call's data pointers and uses them as they are at RunPlan time.
class Plan {
 public:
  Plan(Plan&&) = default;
  Plan& operator=(Plan&&) = default;

  // Bytes of workspace RunPlan needs (0 unless the dropout mask is not
  // contiguous: it is then gathered into the workspace).
  uint64_t workspace_size() const { return workspace_size_; }
  const OpCall& call() const { return call_; }
  // Shape of the output (the broadcast shape of the inputs).
  const std::vector<int64_t>& out_shape() const { return out_shape_; }
  int64_t numel() const { return numel_; }

 private:
  friend absl::StatusOr<Plan> PrepareOp(const OpCall& call);
  friend absl::Status RunPlan(const Plan& plan, void* workspace,
                              uint64_t workspace_size, ThreadPool* pool,
                              const std::atomic<bool>* cancelled);
  Plan() = default;

  void RunRange(const char* s_base, int64_t begin, int64_t end,
                bool stream) const;

  OpCall call_;
  std::vector<int64_t> out_shape_;
  uint64_t workspace_size_ = 0;
  int64_t numel_ = 0;
  const Kernel* kernel_ = nullptr;
  KernelParams params_;
  // The iteration space after dropping size-1 dims and merging dims that
  // are contiguous in every operand; strides in bytes; at least 1 dim.
  int ndim_ = 0;
  std::array<int64_t, kMaxRank> dims_{};
  std::array<int64_t, kMaxRank> g_strides_{};
  std::array<int64_t, kMaxRank> s_strides_{};
  std::array<int64_t, kMaxRank> o_strides_{};
  const char* g_base_ = nullptr;
  const char* s_base_ = nullptr;
  char* o_base_ = nullptr;
  bool unit_inner_ = false;   // Innermost dim is unit-stride everywhere.
  bool stream_ = false;       // Output larger than the caches.
  bool gather_mask_ = false;  // Dropout mask not contiguous.
};

// aclnnXxxGetWorkspaceSize: checks every argument (161001 for a missing
// tensor or data pointer, 161002 for any other violation, with a message
// naming the argument and the rule) and plans the launch. Empty tensors
// give a plan with workspace 0 that computes nothing.
absl::StatusOr<Plan> PrepareOp(const OpCall& call);

// The launch: computes the plan's output synchronously, splitting large
// tensors over `pool` (null = the calling thread only). 161002 when
// `workspace_size` is below plan.workspace_size(), 161001 when a needed
// workspace is null. `out` may alias an input with the identical layout.
// With `cancelled`, the launch checks it between pieces of about a million
// elements and, once it is set, stops early with CANCELLED (the output then
// partly written): so a stream that is destroyed, or a server that shuts
// down, need not wait for a launch of billions of elements.
absl::Status RunPlan(const Plan& plan, void* workspace, uint64_t workspace_size,
                     ThreadPool* pool,
                     const std::atomic<bool>* cancelled = nullptr);

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_OPS_H_
