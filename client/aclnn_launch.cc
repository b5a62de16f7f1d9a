// The aclnn C API's operator calls' two phases, shared by every shim
// (aclnn_state.h): a tensor's description, Plan (phase one: an executor)
// and Launch (phase two, or its record in a capture).

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "client/aclnn_state.h"
#include "client/client.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"

namespace opserver {

using kernels::DType;
using remote::Executor;
using remote::Session;
using remote::TensorDesc;

absl::StatusOr<TensorDesc> ToDesc(State& state, const aclTensor* tensor,
                                  absl::string_view name, uint32_t device) {
  if (tensor == nullptr) {
    return kernels::ParamNullptr(absl::StrCat(name, " is nullptr"));
  }
  TensorDesc desc;
  if (!kernels::IsKnownDType(tensor->dtype)) {
    return kernels::ParamInvalid(absl::StrCat(name,
                                              " has unsupported aclDataType ",
                                              static_cast<int>(tensor->dtype)));
  }
  auto range = Resolve(state, reinterpret_cast<const void*>(tensor->data),
                       absl::StrCat(name, "'s data"));
  if (!range.ok()) return kernels::ParamInvalid(range.status().message());
  if (range->device != device) {
    return kernels::ParamInvalid(
        absl::StrCat(name, "'s data is on device ", range->device,
                     ", not on the current context's device ", device));
  }
  desc.buffer = range->buffer;
  desc.buffer_offset = range->offset;
  desc.dtype = static_cast<DType>(tensor->dtype);
  desc.shape = tensor->shape;
  desc.strides = tensor->strides;
  desc.offset = tensor->offset;
  desc.storage_shape = tensor->storage_shape;
  return desc;
}

aclOpExecutor* AddExecutor(State& state, uint32_t device, Executor executor,
                           std::string op) {
  const uintptr_t id = kExecutorBase + 16 * state.next_executor++;
  state.executors.emplace(
      id, ExecutorEntry{device, std::move(executor), std::move(op)});
  return reinterpret_cast<aclOpExecutor*>(id);
}

// Phase one of every operator: nullptr checks, descriptors, the call. The
// call runs without `state.mu`, so one thread's slow call does not stop the
// others.
aclnnStatus Plan(const char* function, const std::string& op,
                 const v1::OpParams& params,
                 std::vector<std::pair<const char*, const aclTensor*>> tensors,
                 uint64_t* workspace_size, aclOpExecutor** executor) {
  State& state = GetState();
  Pinned pinned;
  std::map<std::string, TensorDesc> descs;
  {
    absl::MutexLock lock(&state.mu);
    auto current = PinCurrent(state);
    if (!current.ok()) {
      return Fail(ACLNN_ERR_RUNTIME_ERROR,
                  absl::StrCat(function, ": ", current.status().message()));
    }
    pinned = *std::move(current);
    if (workspace_size == nullptr || executor == nullptr) {
      return Fail(
          ACLNN_ERR_PARAM_NULLPTR,
          absl::StrCat(function, ": ",
                       workspace_size == nullptr ? "workspaceSize" : "executor",
                       " is nullptr"));
    }
    for (const auto& [name, tensor] : tensors) {
      auto desc = ToDesc(state, tensor, name, pinned.device);
      if (!desc.ok()) {
        return Fail(kernels::GetAclnnStatus(desc.status()),
                    absl::StrCat(function, ": ", desc.status().message()));
      }
      descs.emplace(name, *std::move(desc));
    }
  }
  auto planned = pinned.session->GetWorkspaceSize(op, params, descs);
  if (!planned.ok()) return FailAclnn(pinned.Named(planned.status()));
  absl::MutexLock lock(&state.mu);
  if (!StillCurrent(state, pinned)) {
    // The device was reset meanwhile: the executor died with its session.
    planned->Release();
    return Fail(
        ACLNN_ERR_RUNTIME_ERROR,
        absl::StrCat(function, ": the device was reset during the call"));
  }
  *workspace_size = planned->workspace_size();
  *executor = AddExecutor(state, pinned.device, *std::move(planned), op);
  return ACLNN_SUCCESS;
}

namespace {

// Phase two on a capturing stream: the launch is recorded, checked as a
// sent one would be. A single-use executor moves into the capture (the
// graph owns it once defined); a repeatable one stays the program's, as it
// stays the session's on the server. Under `state.mu`.
aclnnStatus CaptureLaunch(State& state, const char* function,
                          const Pinned& pinned, Capture& capture,
                          std::map<uintptr_t, ExecutorEntry>::iterator it,
                          aclrtStream stream, uint64_t stream_handle,
                          uint64_t buffer, uint64_t offset,
                          uint64_t workspace_size) {
  if (!capture.invalidated.ok()) {
    return Fail(ACLNN_ERR_RUNTIME_ERROR,
                absl::StrCat(function,
                             ": the capture of this stream was "
                             "invalidated: ",
                             capture.invalidated.message()));
  }
  absl::StatusOr<v1::PipelineCommand> task =
      pinned.session->LaunchCommand(it->second.executor.handle(), stream_handle,
                                    buffer, offset, workspace_size);
  if (!task.ok()) return FailAclnn(pinned.Named(task.status()));
  Record(capture, reinterpret_cast<uintptr_t>(stream), *std::move(task),
         it->second.op);
  if (!it->second.executor.repeatable()) {
    capture.executors.push_back(std::move(it->second.executor));
    state.executors.erase(it);
  }
  return ACLNN_SUCCESS;
}

}  // namespace

// Phase two of every operator.
aclnnStatus Launch(const char* function, void* workspace,
                   uint64_t workspace_size, aclOpExecutor* executor,
                   aclrtStream stream) {
  State& state = GetState();
  absl::ReleasableMutexLock lock(&state.mu);
  auto current = PinCurrent(state);
  if (!current.ok()) {
    return Fail(ACLNN_ERR_RUNTIME_ERROR,
                absl::StrCat(function, ": ", current.status().message()));
  }
  Pinned pinned = *std::move(current);
  auto it = state.executors.find(reinterpret_cast<uintptr_t>(executor));
  if (it == state.executors.end()) {
    return Fail(ACLNN_ERR_INNER_NULLPTR,
                absl::StrCat(function, ": executor ",
                             absl::Hex(reinterpret_cast<uintptr_t>(executor)),
                             " is unknown, destroyed or already consumed by "
                             "an earlier launch (only executors made "
                             "repeatable can be launched again)"));
  }
  if (it->second.device != pinned.device) {
    return Fail(
        ACLNN_ERR_PARAM_INVALID,
        absl::StrCat(function, ": executor ",
                     absl::Hex(reinterpret_cast<uintptr_t>(executor)),
                     " was planned on device ", it->second.device,
                     ", not on the current context's device ", pinned.device));
  }
  auto stream_handle = StreamHandle(state, stream, pinned.device);
  if (!stream_handle.ok()) {
    return Fail(ACLNN_ERR_PARAM_INVALID,
                absl::StrCat(function, ": ", stream_handle.status().message()));
  }
  uint64_t buffer = 0, offset = 0;
  if (workspace_size > 0) {
    if (workspace == nullptr) {
      return Fail(ACLNN_ERR_PARAM_NULLPTR,
                  absl::StrCat(function,
                               ": workspace is nullptr but "
                               "workspaceSize is ",
                               workspace_size));
    }
    auto range = Resolve(state, workspace, "workspace");
    if (!range.ok()) {
      return Fail(ACLNN_ERR_PARAM_INVALID,
                  absl::StrCat(function, ": ", range.status().message()));
    }
    if (range->device != pinned.device) {
      return Fail(
          ACLNN_ERR_PARAM_INVALID,
          absl::StrCat(function, ": the workspace is on device ", range->device,
                       ", not on device ", pinned.device));
    }
    if (range->available < workspace_size) {
      return Fail(ACLNN_ERR_PARAM_INVALID,
                  absl::StrCat(function, ": workspaceSize ", workspace_size,
                               " runs past the end of its allocation (",
                               range->available, " bytes left)"));
    }
    buffer = range->buffer;
    offset = range->offset;
  }
  if (Capture* capture = CaptureOf(state, stream); capture != nullptr) {
    return CaptureLaunch(state, function, pinned, *capture, it, stream,
                         *stream_handle, buffer, offset, workspace_size);
  }
  // The call runs without the lock. A single-use
  // executor is taken out meanwhile (a second launch of it is an error
  // anyway) and put back if the launch failed.
  const uintptr_t key = it->first;
  const bool repeatable = it->second.executor.repeatable();
  const uint64_t handle = it->second.executor.handle();
  std::string op = it->second.op;
  Executor taken;
  if (!repeatable) {
    taken = std::move(it->second.executor);
    state.executors.erase(it);
  }
  lock.Release();
  absl::Status status =
      repeatable
          ? pinned.session->ExecuteHandle(handle, *stream_handle, buffer,
                                          offset, workspace_size)
          : taken.Execute(*stream_handle, buffer, offset, workspace_size);
  if (!status.ok() && !repeatable) {
    absl::MutexLock relock(&state.mu);
    if (StillCurrent(state, pinned)) {
      state.executors.emplace(
          key, ExecutorEntry{pinned.device, std::move(taken), std::move(op)});
    } else {
      taken.Release();  // It died with its session.
    }
  }
  if (!status.ok()) return FailAclnn(pinned.Named(status));
  return ACLNN_SUCCESS;
}

}  // namespace opserver
