// The operators on the CPU: planning a validated call (kernels::Validate)
// into an iteration over the element kernels (kernel_table.h), and the
// launch. CpuDevice's Prepare and Launch are these; tests, fuzzers and
// benchmarks call them directly.
//
//   OpCall call{OpKind::kThresholdBackward, grad, self, out, params};
//   absl::StatusOr<Plan> plan = PrepareOp(call);    // GetWorkspaceSize
//   if (!plan.ok()) return GetAclnnStatus(plan.status());
//   ... allocate plan->workspace_size() bytes ...
//   absl::Status s = RunPlan(*plan, ws, ws_size, &pool);  // the launch
#ifndef OPSERVER_DEVICES_CPU_PLAN_H_
#define OPSERVER_DEVICES_CPU_PLAN_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "devices/cpu/compute_turns.h"
#include "devices/cpu/kernel_table.h"
#include "devices/cpu/thread_pool.h"
#include "devices/device.h"
#include "kernels/dtype.h"
#include "kernels/op_kind.h"
#include "kernels/op_spec.h"
#include "kernels/tensor.h"
#include "kernels/validate.h"

namespace opserver::cpu {

// The largest launch the CPU runs on the thread that received it when its
// stream is idle (Device::inline_launch_elements): microseconds of work,
// less than handing it to the stream's thread costs (a wake-up, a context
// switch, a cache gone cold). Every device that computes with these plans
// answers it.
inline constexpr int64_t kInlineLaunchElements = 16 * 1024;

// A checked call with its iteration plan (aclnn's executor). Holds the
// call's data pointers and uses them as they are at RunPlan time.
class Plan {
 public:
  Plan(Plan&&) = default;
  Plan& operator=(Plan&&) = default;

  // Bytes of workspace RunPlan needs (0 unless the dropout mask is not
  // contiguous: it is then gathered into the workspace).
  uint64_t workspace_size() const { return workspace_size_; }
  const kernels::OpCall& call() const { return call_; }
  // Shape of the output (the broadcast shape of the inputs).
  const std::vector<int64_t>& out_shape() const { return out_shape_; }
  int64_t numel() const { return numel_; }

 private:
  friend absl::StatusOr<Plan> PlanCall(const kernels::ValidCall& valid);
  friend absl::Status RunPlan(const Plan& plan, void* workspace,
                              uint64_t workspace_size, ThreadPool* pool,
                              const std::atomic<bool>* cancelled,
                              ComputeTurns* turns, int party);
  Plan() = default;

  void RunRange(const char* s_base, int64_t begin, int64_t end,
                bool stream) const;

  kernels::OpCall call_;
  std::vector<int64_t> out_shape_;
  uint64_t workspace_size_ = 0;
  int64_t numel_ = 0;
  const Kernel* kernel_ = nullptr;
  kernels::KernelParams params_;
  // The iteration space after dropping size-1 dims and merging dims that
  // are contiguous in every operand; strides in bytes; at least 1 dim.
  int ndim_ = 0;
  std::array<int64_t, kernels::kMaxRank> dims_{};
  std::array<int64_t, kernels::kMaxRank> g_strides_{};
  std::array<int64_t, kernels::kMaxRank> s_strides_{};
  std::array<int64_t, kernels::kMaxRank> o_strides_{};
  const char* g_base_ = nullptr;
  const char* s_base_ = nullptr;
  char* o_base_ = nullptr;
  bool unit_inner_ = false;   // Innermost dim is unit-stride everywhere.
  bool stream_ = false;       // Output larger than the caches.
  bool gather_mask_ = false;  // Dropout mask not contiguous.
};

// Plans the launch of a call that passed kernels::Validate. Empty tensors
// give a plan with workspace 0 that computes nothing.
absl::StatusOr<Plan> PlanCall(const kernels::ValidCall& valid);

// aclnnXxxGetWorkspaceSize on the CPU: kernels::Validate (161001 for a
// missing tensor or data pointer, 161002 for any other violation, with a
// message naming the argument and the rule), then PlanCall.
absl::StatusOr<Plan> PrepareOp(const kernels::OpCall& call);

// The CPU's DevicePlan (CpuDevice::Prepare; FakeDevice, which computes on
// the host too, uses it as well): the validated call and its Plan.
class HostPlan : public DevicePlan {
 public:
  // A HostPlan of `valid` for `device`'s streams.
  static absl::StatusOr<std::unique_ptr<DevicePlan>> Prepare(
      const Device* device, kernels::ValidCall valid);
  // The Plan inside `plan`, which must be a HostPlan `device` prepared:
  // INTERNAL otherwise (a plan of another device reached this one's
  // stream).
  static absl::StatusOr<const Plan*> Of(const DevicePlan& plan,
                                        const Device* device);

 private:
  HostPlan(const Device* device, kernels::ValidCall valid, Plan plan)
      : DevicePlan(device, std::move(valid)), plan_(std::move(plan)) {}
  const Plan plan_;
};

// The launch: computes the plan's output synchronously, splitting large
// tensors over `pool` (null = the calling thread only). 161002 when
// `workspace_size` is below plan.workspace_size(), 161001 when a needed
// workspace is null. `out` may alias an input with the identical layout.
// With `cancelled`, the launch checks it between pieces of about a million
// elements and, once it is set, stops early with CANCELLED (the output then
// partly written): so a stream that is destroyed, or a server that shuts
// down, need not wait for a launch of billions of elements.
// With `turns`, each such piece also takes a turn at the cores as `party`
// (compute_turns.h), so launches of logical devices sharing the pool
// alternate piece by piece.
absl::Status RunPlan(const Plan& plan, void* workspace, uint64_t workspace_size,
                     ThreadPool* pool,
                     const std::atomic<bool>* cancelled = nullptr,
                     ComputeTurns* turns = nullptr, int party = 0);

}  // namespace opserver::cpu

#endif  // OPSERVER_DEVICES_CPU_PLAN_H_
