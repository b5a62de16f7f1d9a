#include "runtime/op_requests.h"

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

}  // namespace

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

absl::StatusOr<v1::ValueTensor> RunEvaluate(const v1::EvaluateRequest& request,
                                            Device* device,
                                            uint32_t max_values) {
  kernels::OpCall call;
  ASSIGN_OR_RETURN(const OpInfo* op,
                   BeginOpCall(request.op(), request.params(), &call));
  RETURN_IF_ERROR(CheckDeviceSupports(*device, op->kind));
  for (const auto& [name, t] : request.inputs()) {
    bool known = false;
    for (const auto& arg : op->tensors) {
      known |= !arg.is_output && arg.name == name;
    }
    if (!known) {
      return kernels::ParamInvalid(
          absl::StrCat(op->name, " has no input '", name, "'"));
    }
  }
  // A transient device stream per call rather than a shared default one:
  // Evaluate needs no session, up to --max_concurrent_evaluates run at once
  // on RPC threads, and a DeviceStream is not thread-safe, so a shared one
  // would serialize them behind a lock; a private one keeps them
  // independent, and its work ends with the call. Creating one is an
  // allocation on the CPU device (a device where it is costly can pool them
  // behind CreateStream).
  //
  // What the stream's operations use is declared before it, so that on
  // every return it is destroyed first: an asynchronous device's stream
  // destructor waits for its work. The host copies of the inputs stay until
  // then too (an asynchronous CopyToDevice reads them later), in place: a
  // deque, because a vector's growth would move them, and a short string's
  // bytes move with it (multi_device_test's Evaluate on a FakeDevice read
  // zeros).
  std::deque<std::string> staged;
  std::vector<std::unique_ptr<ScratchBuffer>> scratch;
  ScratchBuffer workspace(device);
  std::unique_ptr<DevicePlan> plan;
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceStream> stream,
                   device->CreateStream());
  void* output_data = nullptr;
  int64_t output_numel = 0;
  DType output_dtype = DType::kFloat;
  for (const auto& arg : op->tensors) {
    const std::string name(arg.name);
    const v1::ValueTensor* t = nullptr;
    if (arg.is_output) {
      if (request.has_output()) t = &request.output();
    } else {
      auto it = request.inputs().find(name);
      if (it != request.inputs().end()) t = &it->second;
    }
    if (t == nullptr) continue;  // Validate reports the missing argument.
    ASSIGN_OR_RETURN(const DType dtype, ToDType(t->dtype(), name));
    ASSIGN_OR_RETURN(const int64_t numel,
                     CheckValueShape(*t, name, max_values));
    std::string bytes;
    if (arg.is_output) {
      bytes.assign(numel * kernels::DTypeSize(dtype), '\0');
    } else {
      if (t->values_size() != numel) {
        return kernels::ParamInvalid(absl::StrCat(name, " has shape of ", numel,
                                                  " elements but ",
                                                  t->values_size(), " values"));
      }
      absl::StatusOr<std::string> encoded = EncodeValues(
          dtype, absl::MakeConstSpan(t->values().data(), t->values_size()));
      if (!encoded.ok()) {
        return kernels::ParamInvalid(
            absl::StrCat(name, ": ", encoded.status().message()));
      }
      bytes = *std::move(encoded);
    }
    scratch.push_back(std::make_unique<ScratchBuffer>(device));
    RETURN_IF_ERROR(scratch.back()->Allocate(bytes.size()));
    staged.push_back(std::move(bytes));
    RETURN_IF_ERROR(stream->CopyToDevice(
        scratch.back()->data(), staged.back().data(), staged.back().size()));
    kernels::TensorView view;
    view.dtype = dtype;
    view.shape.assign(t->shape().begin(), t->shape().end());
    view.data = scratch.back()->data();
    if (arg.is_output) {
      output_data = view.data;
      output_numel = numel;
      output_dtype = dtype;
    }
    RETURN_IF_ERROR(PlaceTensor(*op, name, std::move(view), &call));
  }
  ASSIGN_OR_RETURN(kernels::ValidCall valid, kernels::Validate(call));
  ASSIGN_OR_RETURN(plan, device->Prepare(std::move(valid)));
  const uint64_t workspace_size = plan->workspace_size();
  if (workspace_size > 0) {
    RETURN_IF_ERROR(workspace.Allocate(workspace_size));
  }
  RETURN_IF_ERROR(stream->Launch(*plan, workspace.data(), workspace_size));
  std::string host(output_numel * kernels::DTypeSize(output_dtype), '\0');
  RETURN_IF_ERROR(stream->CopyFromDevice(host.data(), output_data, host.size()));
  // Before `host` is read.
  RETURN_IF_ERROR(stream->Synchronize());
  std::vector<double> values =
      DecodeValues(output_dtype, host.data(), output_numel);
  v1::ValueTensor out;
  out.set_dtype(static_cast<v1::DataType>(output_dtype));
  *out.mutable_shape() = request.output().shape();
  out.mutable_values()->Add(values.begin(), values.end());
  return out;
}

}  // namespace opserver
