#include "runtime/executor.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "common/values.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"
#include "kernels/validate.h"
#include "runtime/byte_range.h"
#include "runtime/observer.h"
#include "runtime/stream.h"

namespace opserver {
namespace {

using kernels::DType;
using kernels::OpInfo;

// The work one launch may ask for is bounded: 161002
// with RESOURCE_EXHAUSTED past --max_launch_elements.
absl::Status CheckLaunchSize(const kernels::ValidCall& valid,
                             uint64_t max_launch_elements) {
  const int64_t numel = kernels::NumElements(valid.out_shape);
  if (static_cast<uint64_t>(numel) <= max_launch_elements) {
    return absl::OkStatus();
  }
  return kernels::AclnnError(
      kernels::kAclnnErrParamInvalid, absl::StatusCode::kResourceExhausted,
      absl::StrCat("the launch computes ", numel,
                   " elements; one launch may compute at most ",
                   max_launch_elements,
                   " (--max_launch_elements): split the tensor"));
}

// Device memory owned by one Evaluate call.
class ScratchBuffer {
 public:
  explicit ScratchBuffer(Device* device) : device_(device) {}
  ~ScratchBuffer() {
    if (data_ != nullptr) device_->Deallocate(data_, size_);
  }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  absl::Status Allocate(uint64_t size) {
    // Owner 0: never another caller's bytes.
    ASSIGN_OR_RETURN(data_, device_->Allocate(size, /*owner=*/0));
    size_ = size;
    return absl::OkStatus();
  }
  void* data() const { return data_; }

 private:
  Device* const device_;
  void* data_ = nullptr;
  uint64_t size_ = 0;
};

// Shape of a ValueTensor: at most 8 non-negative dims whose product fits
// `max_values`.
absl::StatusOr<int64_t> CheckValueShape(const v1::ValueTensor& t,
                                        absl::string_view name,
                                        uint32_t max_values) {
  if (t.shape_size() > kernels::kMaxRank) {
    return kernels::ParamInvalid(absl::StrCat(name, " has ", t.shape_size(),
                                              " dims; at most 8 allowed"));
  }
  int64_t numel = 1;
  for (int64_t d : t.shape()) {
    if (d < 0) {
      return kernels::ParamInvalid(
          absl::StrCat(name, " has a negative dimension ", d));
    }
    if (d != 0 && numel > static_cast<int64_t>(max_values) / d) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name, " has more than the ", max_values,
                       " values one call may carry (--max_values)"));
    }
    numel *= d;
  }
  return numel;
}

// Whether a launch of `plan` on one of `session`'s streams may run on the
// thread that queues it, when the stream is idle (executor.h).
bool LaunchRunsInline(const Session& session, const DevicePlan& plan) {
  if (session.device() == nullptr) return false;
  const int64_t bound = session.device()->inline_launch_elements();
  return bound > 0 && plan.numel() <= bound;
}

}  // namespace

// ---- GetWorkspaceSize ---------------------------------------------------

absl::Status CheckDeviceSupports(const Device& device, kernels::OpKind op) {
  if (device.SupportsOp(op)) return absl::OkStatus();
  const OpInfo& info = kernels::OpRegistry()[static_cast<int>(op)];
  return kernels::AclnnError(
      kernels::kAclnnErrRuntimeError, absl::StatusCode::kUnimplemented,
      absl::StrCat(info.name, " is not available on this server's ",
                   device.Describe().kind,
                   " device (its operator library has "
                   "no ",
                   info.aclnn_name,
                   "); ListOperators lists the "
                   "operators it serves"));
}

absl::StatusOr<std::unique_ptr<DevicePlan>> PlanGetWorkspaceSize(
    const v1::GetWorkspaceSizeRequest& request, BufferLookup lookup,
    uint64_t max_launch_elements, const Device& device) {
  ASSIGN_OR_RETURN(const kernels::OpCall call, ToOpCall(request, lookup));
  ASSIGN_OR_RETURN(kernels::ValidCall valid, kernels::Validate(call));
  RETURN_IF_ERROR(CheckLaunchSize(valid, max_launch_elements));
  return device.Prepare(std::move(valid));
}

absl::StatusOr<std::shared_ptr<Executor>> PlanExecutor(
    const v1::GetWorkspaceSizeRequest& request, Session& session,
    uint64_t max_launch_elements) {
  if (session.device() == nullptr) {
    return absl::FailedPreconditionError(
        "the session has no device to prepare the launch on");
  }
  if (const kernels::OpInfo* op = kernels::FindOp(request.op());
      op != nullptr) {
    RETURN_IF_ERROR(CheckDeviceSupports(*session.device(), op->kind));
  }
  std::vector<std::shared_ptr<Buffer>> buffers;
  auto lookup = [&](uint64_t handle) -> absl::StatusOr<DeviceBytes> {
    ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, session.GetBuffer(handle));
    DeviceBytes bytes{buffer->data(), buffer->size()};
    buffers.push_back(std::move(buffer));
    return bytes;
  };
  absl::StatusOr<std::unique_ptr<DevicePlan>> plan = PlanGetWorkspaceSize(
      request, lookup, max_launch_elements, *session.device());
  if (!plan.ok()) {
    // Counted under the operator's name only when it has one: a made-up
    // name must not become a label.
    if (const kernels::OpInfo* op = kernels::FindOp(request.op());
        op != nullptr && session.observer() != nullptr) {
      session.observer()->PlanRefused(op->kind,
                                      kernels::GetAclnnStatus(plan.status()));
    }
    return plan.status();
  }
  return std::make_shared<Executor>(
      Executor{*std::move(plan), std::move(buffers)});
}

// ---- Execute ------------------------------------------------------------

absl::StatusOr<LaunchWorkspace> CheckWorkspace(
    const v1::ExecuteRequest& request, const Executor& executor,
    Session& session) {
  LaunchWorkspace workspace;
  workspace.size = request.workspace_size();
  const uint64_t needed = executor.plan->workspace_size();
  if (needed == 0) return workspace;
  if (request.workspace_size() < needed) {
    return kernels::ParamInvalid(absl::StrCat(
        "workspaceSize ", request.workspace_size(), " is smaller than the ",
        needed, " bytes GetWorkspaceSize reported"));
  }
  absl::StatusOr<std::shared_ptr<Buffer>> buffer =
      session.GetBuffer(request.workspace_buffer());
  if (!buffer.ok()) {
    return kernels::AclnnError(
        kernels::kAclnnErrParamInvalid, absl::StatusCode::kNotFound,
        absl::StrCat("workspace: ", buffer.status().message()));
  }
  if (absl::Status s =
          CheckRange(request.workspace_offset(), request.workspace_size(),
                     (*buffer)->size(), "workspace");
      !s.ok()) {
    return kernels::ParamInvalid(s.message());
  }
  workspace.buffer = *std::move(buffer);
  workspace.data =
      static_cast<char*>(workspace.buffer->data()) + request.workspace_offset();
  return workspace;
}

absl::Status LaunchExecutor(const v1::ExecuteRequest& request,
                            Session& session) {
  ASSIGN_OR_RETURN(std::shared_ptr<Stream> stream,
                   session.GetStream(request.stream()));
  // The task holds the device stream, not the Stream, which may be
  // destroyed while the task runs.
  std::shared_ptr<DeviceStream> device_stream = stream->device_stream();
  if (device_stream == nullptr) {
    return absl::FailedPreconditionError(
        "the stream has no device stream (the device could not create one)");
  }
  // Validate against the executor before consuming it, so a bad workspace
  // does not cost the caller its executor.
  ASSIGN_OR_RETURN(
      std::shared_ptr<Executor> executor,
      session.ExecutorForLaunch(request.executor(), /*consume=*/false));
  ASSIGN_OR_RETURN(LaunchWorkspace checked,
                   CheckWorkspace(request, *executor, session));
  std::shared_ptr<Buffer> workspace = std::move(checked.buffer);
  void* workspace_data = checked.data;
  // A full or destroyed stream refuses the launch without consuming the
  // executor (Session::Launch).
  return session.Launch(
      request.executor(), *stream,
      /*inline_if_idle=*/LaunchRunsInline(session, *executor->plan),
      [device_stream = std::move(device_stream),
       workspace = std::move(workspace), workspace_data,
       size = request.workspace_size(),
       observer = session.observer()](std::shared_ptr<Executor> executor) {
        if (observer == nullptr) {
          return Stream::Task([device_stream, executor = std::move(executor),
                               workspace, workspace_data, size] {
            return device_stream->Launch(*executor->plan, workspace_data, size);
          });
        }
        const kernels::OpCall& call = executor->plan->call();
        RuntimeObserver::LaunchRecord record = observer->LaunchQueued(
            call.op, call.grad_output.has_value() ? call.grad_output->dtype
                                                  : kernels::DType::kFloat);
        return Stream::Task([device_stream, executor = std::move(executor),
                             workspace, workspace_data, size,
                             record]() mutable {
          record.Started();
          absl::Status status =
              device_stream->Launch(*executor->plan, workspace_data, size);
          record.Finished(kernels::GetAclnnStatus(status));
          return status;
        });
      });
}

// ---- Evaluate -----------------------------------------------------------

namespace {

// 161002 unless every input `request` names is an input of `op`.
absl::Status CheckInputNames(const OpInfo& op,
                             const v1::EvaluateRequest& request) {
  for (const auto& [name, t] : request.inputs()) {
    bool known = false;
    for (const auto& arg : op.tensors) {
      known |= !arg.is_output && arg.name == name;
    }
    if (!known) {
      return kernels::ParamInvalid(
          absl::StrCat(op.name, " has no input '", name, "'"));
    }
  }
  return absl::OkStatus();
}

// The bytes argument `name` starts with: an input's values encoded in
// `dtype`, or zeros for the output.
absl::StatusOr<std::string> ArgumentBytes(const kernels::TensorArgInfo& arg,
                                          const std::string& name,
                                          const v1::ValueTensor& t,
                                          DType dtype, int64_t numel) {
  if (arg.is_output) {
    return std::string(numel * kernels::DTypeSize(dtype), '\0');
  }
  if (t.values_size() != numel) {
    return kernels::ParamInvalid(absl::StrCat(name, " has shape of ", numel,
                                              " elements but ",
                                              t.values_size(), " values"));
  }
  absl::StatusOr<std::string> encoded = EncodeValues(
      dtype, absl::MakeConstSpan(t.values().data(), t.values_size()));
  if (!encoded.ok()) {
    return kernels::ParamInvalid(
        absl::StrCat(name, ": ", encoded.status().message()));
  }
  return encoded;
}

// One Evaluate call's device work. A transient device stream per call
// rather than a shared default one: Evaluate needs no session, up to
// --max_concurrent_evaluates run at once on RPC threads, and a DeviceStream
// is not thread-safe, so a shared one would serialize them behind a lock;
// a private one keeps them independent, and its work ends with the call.
// Creating one is an allocation on the CPU device (a device where it is
// costly can pool them behind CreateStream).
//
// What the stream's operations use is declared before it, so that on
// every return it is destroyed first: an asynchronous device's stream
// destructor waits for its work. The host copies of the inputs stay until
// then too (an asynchronous CopyToDevice reads them later), in place: a
// deque, because a vector's growth would move them, and a short string's
// bytes move with it (multi_device_test's Evaluate on a FakeDevice read
// zeros).
class EvaluateRun {
 public:
  explicit EvaluateRun(Device* device) : device_(device), workspace_(device) {}

  absl::Status Open() {
    ASSIGN_OR_RETURN(stream_, device_->CreateStream());
    return absl::OkStatus();
  }

  // Copies argument `arg` of `op`, given as `t`, to scratch memory and
  // places it in `call`.
  absl::Status Place(const OpInfo& op, const kernels::TensorArgInfo& arg,
                     const v1::ValueTensor& t, uint32_t max_values,
                     kernels::OpCall* call) {
    const std::string name(arg.name);
    ASSIGN_OR_RETURN(const DType dtype, ToDType(t.dtype(), name));
    ASSIGN_OR_RETURN(const int64_t numel,
                     CheckValueShape(t, name, max_values));
    ASSIGN_OR_RETURN(std::string bytes,
                     ArgumentBytes(arg, name, t, dtype, numel));
    scratch_.push_back(std::make_unique<ScratchBuffer>(device_));
    RETURN_IF_ERROR(scratch_.back()->Allocate(bytes.size()));
    staged_.push_back(std::move(bytes));
    RETURN_IF_ERROR(stream_->CopyToDevice(
        scratch_.back()->data(), staged_.back().data(), staged_.back().size()));
    kernels::TensorView view;
    view.dtype = dtype;
    view.shape.assign(t.shape().begin(), t.shape().end());
    view.data = scratch_.back()->data();
    if (arg.is_output) {
      output_data_ = view.data;
      output_numel_ = numel;
      output_dtype_ = dtype;
    }
    return PlaceTensor(op, name, std::move(view), call);
  }

  // Validates and launches `call`, and reads the output back.
  absl::StatusOr<std::vector<double>> Run(const kernels::OpCall& call) {
    ASSIGN_OR_RETURN(kernels::ValidCall valid, kernels::Validate(call));
    ASSIGN_OR_RETURN(plan_, device_->Prepare(std::move(valid)));
    const uint64_t workspace_size = plan_->workspace_size();
    if (workspace_size > 0) {
      RETURN_IF_ERROR(workspace_.Allocate(workspace_size));
    }
    RETURN_IF_ERROR(stream_->Launch(*plan_, workspace_.data(), workspace_size));
    std::string host(output_numel_ * kernels::DTypeSize(output_dtype_), '\0');
    RETURN_IF_ERROR(
        stream_->CopyFromDevice(host.data(), output_data_, host.size()));
    // Before `host` is read.
    RETURN_IF_ERROR(stream_->Synchronize());
    return DecodeValues(output_dtype_, host.data(), output_numel_);
  }

  DType output_dtype() const { return output_dtype_; }

 private:
  Device* const device_;
  std::deque<std::string> staged_;
  std::vector<std::unique_ptr<ScratchBuffer>> scratch_;
  ScratchBuffer workspace_;
  std::unique_ptr<DevicePlan> plan_;
  std::unique_ptr<DeviceStream> stream_;  // Last: destroyed first.
  void* output_data_ = nullptr;
  int64_t output_numel_ = 0;
  DType output_dtype_ = DType::kFloat;
};

}  // namespace

absl::StatusOr<v1::ValueTensor> RunEvaluate(const v1::EvaluateRequest& request,
                                            Device* device,
                                            uint32_t max_values) {
  kernels::OpCall call;
  ASSIGN_OR_RETURN(const OpInfo* op,
                   BeginOpCall(request.op(), request.params(), &call));
  RETURN_IF_ERROR(CheckDeviceSupports(*device, op->kind));
  RETURN_IF_ERROR(CheckInputNames(*op, request));
  EvaluateRun run(device);
  RETURN_IF_ERROR(run.Open());
  for (const auto& arg : op->tensors) {
    const v1::ValueTensor* t = nullptr;
    if (arg.is_output) {
      if (request.has_output()) t = &request.output();
    } else {
      auto it = request.inputs().find(std::string(arg.name));
      if (it != request.inputs().end()) t = &it->second;
    }
    if (t == nullptr) continue;  // Validate reports the missing argument.
    RETURN_IF_ERROR(run.Place(*op, arg, *t, max_values, &call));
  }
  ASSIGN_OR_RETURN(std::vector<double> values, run.Run(call));
  v1::ValueTensor out;
  out.set_dtype(static_cast<v1::DataType>(run.output_dtype()));
  *out.mutable_shape() = request.output().shape();
  out.mutable_values()->Add(values.begin(), values.end());
  return out;
}

}  // namespace opserver
