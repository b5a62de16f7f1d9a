// The state and helpers the aclnn C API's runtime calls and operator shims
// share (see aclnn_state.h).

#include "client/aclnn_state.h"

#include <cstdint>
#include <map>
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
#include "client/client.h"
#include "client/device_addresses.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"

namespace opserver {

using kernels::DType;
using remote::Executor;
using remote::Session;
using remote::TensorDesc;

namespace {

thread_local std::string last_error;

}  // namespace

std::string& LastError() { return last_error; }

absl::Status State::DropSession() {
  absl::Status pending;
  if (session != nullptr) {
    pending = session->Flush();
    if (absl::IsNotFound(pending)) pending = absl::OkStatus();
  }
  // Handles die with the session on the server; forget them here without
  // a call each.
  addresses.ReleaseAll();
  for (auto& [id, stream] : streams) stream.Release();
  for (auto& [id, entry] : executors) entry.executor.Release();
  streams.clear();
  executors.clear();
  pending_reads.clear();  // Their bytes never come: the copies die too.
  session.reset();        // Closes the session.
  return pending;
}

aclError CheckCopyArguments(const char* function, const void* dst,
                            size_t destMax, const void* src, size_t count,
                            aclrtMemcpyKind kind) {
  if (dst == nullptr || src == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat(function, ": ", dst == nullptr ? "dst" : "src",
                             " is NULL"));
  }
  if (count > destMax) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat(function, ": count ", count,
                             " is larger than destMax ", destMax));
  }
  if (kind != ACL_MEMCPY_HOST_TO_HOST && kind != ACL_MEMCPY_HOST_TO_DEVICE &&
      kind != ACL_MEMCPY_DEVICE_TO_HOST &&
      kind != ACL_MEMCPY_DEVICE_TO_DEVICE) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat(function, ": unknown aclrtMemcpyKind ",
                             static_cast<int>(kind)));
  }
  return ACL_SUCCESS;
}

absl::Status ResolveCopy(State& state, const char* function, const void* dst,
                         const void* src, size_t count, aclrtMemcpyKind kind,
                         DeviceRange* from, DeviceRange* to) {
  auto check = [&](const void* pointer, const char* what,
                   DeviceRange* range) -> absl::Status {
    auto resolved = Resolve(state, pointer, absl::StrCat(function, ": ", what));
    if (!resolved.ok()) return resolved.status();
    if (resolved->available < count) {
      return absl::InvalidArgumentError(
          absl::StrCat(function, ": ", count, " bytes at ", what,
                       " run past the end of its allocation (",
                       resolved->available, " bytes left)"));
    }
    *range = *resolved;
    return absl::OkStatus();
  };
  if (kind == ACL_MEMCPY_DEVICE_TO_HOST ||
      kind == ACL_MEMCPY_DEVICE_TO_DEVICE) {
    if (absl::Status s = check(src, "src", from); !s.ok()) return s;
  }
  if (kind == ACL_MEMCPY_HOST_TO_DEVICE ||
      kind == ACL_MEMCPY_DEVICE_TO_DEVICE) {
    if (absl::Status s = check(dst, "dst", to); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status WaitPendingReads(State& state, std::optional<uint64_t> handle) {
  std::vector<remote::PendingRead> reads;
  {
    absl::MutexLock lock(&state.mu);
    for (auto it = state.pending_reads.begin();
         it != state.pending_reads.end();) {
      if (handle.has_value() && it->first != *handle) {
        ++it;
        continue;
      }
      for (remote::PendingRead& read : it->second) {
        reads.push_back(std::move(read));
      }
      it = state.pending_reads.erase(it);
    }
  }
  absl::Status first;
  for (remote::PendingRead& read : reads) {
    absl::Status waited = read.Wait();
    if (first.ok()) first = waited;
  }
  return first;
}

State& GetState() {
  // Never destroyed: a program that exits without aclFinalize must not make
  // calls from static destructors.
  static State* const state = new State;
  return *state;
}

aclError AclErrorOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return ACL_SUCCESS;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return ACL_ERROR_INVALID_PARAM;
    case absl::StatusCode::kNotFound:
      return ACL_ERROR_INVALID_RESOURCE_HANDLE;
    case absl::StatusCode::kResourceExhausted:
      return ACL_ERROR_BAD_ALLOC;
    default:
      return ACL_ERROR_RT_FAILURE;
  }
}

aclError FailAcl(const absl::Status& status) {
  return Fail(AclErrorOf(status), status.message());
}

aclnnStatus FailAclnn(const absl::Status& status) {
  return Fail(kernels::GetAclnnStatus(status), status.message());
}

// The session, or an error saying which call was missing.
absl::StatusOr<Session*> SessionOf(State& state) {
  if (!state.initialized) {
    return absl::FailedPreconditionError("aclInit was not called");
  }
  if (state.session == nullptr) {
    return absl::FailedPreconditionError(
        "no device is set: call aclrtSetDevice(0) first");
  }
  if (absl::Status lost = state.session->Lost(); !lost.ok()) {
    return absl::NotFoundError(absl::StrCat(
        lost.message(),
        "; call aclrtResetDevice(0) and aclrtSetDevice(0) to start a new one"));
  }
  return state.session.get();
}

aclError SessionError(const absl::Status& status) {
  if (!GetState().initialized) {
    return Fail(ACL_ERROR_UNINITIALIZE, status.message());
  }
  // A lost session: its handles are gone, as when the server answers "no
  // session".
  if (status.code() == absl::StatusCode::kNotFound) {
    return Fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, status.message());
  }
  return Fail(ACL_ERROR_RT_FAILURE, status.message());
}

absl::StatusOr<DeviceRange> Resolve(State& state, const void* pointer,
                                    absl::string_view what) {
  return state.addresses.Resolve(pointer, what);
}

absl::StatusOr<uint64_t> StreamHandle(State& state, aclrtStream stream) {
  if (stream == nullptr) return 0;  // The default stream.
  auto it = state.streams.find(reinterpret_cast<uintptr_t>(stream));
  if (it == state.streams.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream ", absl::Hex(reinterpret_cast<uintptr_t>(stream)),
                     " is not a live aclrtCreateStream stream"));
  }
  return it->second.handle();
}

absl::StatusOr<TensorDesc> ToDesc(State& state, const aclTensor* tensor,
                                  absl::string_view name) {
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
  desc.buffer = range->buffer;
  desc.buffer_offset = range->offset;
  desc.dtype = static_cast<DType>(tensor->dtype);
  desc.shape = tensor->shape;
  desc.strides = tensor->strides;
  desc.offset = tensor->offset;
  desc.storage_shape = tensor->storage_shape;
  return desc;
}

aclOpExecutor* AddExecutor(State& state, Executor executor) {
  const uintptr_t id = kExecutorBase + 16 * state.next_executor++;
  state.executors.emplace(id, ExecutorEntry{std::move(executor)});
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
    auto current = SessionOf(state);
    if (!current.ok()) {
      return Fail(ACLNN_ERR_RUNTIME_ERROR,
                  absl::StrCat(function, ": ", current.status().message()));
    }
    if (workspace_size == nullptr || executor == nullptr) {
      return Fail(
          ACLNN_ERR_PARAM_NULLPTR,
          absl::StrCat(function, ": ",
                       workspace_size == nullptr ? "workspaceSize" : "executor",
                       " is nullptr"));
    }
    for (const auto& [name, tensor] : tensors) {
      auto desc = ToDesc(state, tensor, name);
      if (!desc.ok()) {
        return Fail(kernels::GetAclnnStatus(desc.status()),
                    absl::StrCat(function, ": ", desc.status().message()));
      }
      descs.emplace(name, *std::move(desc));
    }
    pinned = state.Pin();
  }
  auto planned = pinned.session->GetWorkspaceSize(op, params, descs);
  if (!planned.ok()) return FailAclnn(planned.status());
  absl::MutexLock lock(&state.mu);
  if (state.session != pinned.session) {
    // The device was reset meanwhile: the executor died with its session.
    planned->Release();
    return Fail(
        ACLNN_ERR_RUNTIME_ERROR,
        absl::StrCat(function, ": the device was reset during the call"));
  }
  *workspace_size = planned->workspace_size();
  *executor = AddExecutor(state, *std::move(planned));
  return ACLNN_SUCCESS;
}

// Phase two of every operator.
aclnnStatus Launch(const char* function, void* workspace,
                   uint64_t workspace_size, aclOpExecutor* executor,
                   aclrtStream stream) {
  State& state = GetState();
  absl::ReleasableMutexLock lock(&state.mu);
  auto current = SessionOf(state);
  if (!current.ok()) {
    return Fail(ACLNN_ERR_RUNTIME_ERROR,
                absl::StrCat(function, ": ", current.status().message()));
  }
  auto it = state.executors.find(reinterpret_cast<uintptr_t>(executor));
  if (it == state.executors.end()) {
    return Fail(ACLNN_ERR_INNER_NULLPTR,
                absl::StrCat(function, ": executor ",
                             absl::Hex(reinterpret_cast<uintptr_t>(executor)),
                             " is unknown, destroyed or already consumed by "
                             "an earlier launch (only executors made "
                             "repeatable can be launched again)"));
  }
  auto stream_handle = StreamHandle(state, stream);
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
    if (range->available < workspace_size) {
      return Fail(ACLNN_ERR_PARAM_INVALID,
                  absl::StrCat(function, ": workspaceSize ", workspace_size,
                               " runs past the end of its allocation (",
                               range->available, " bytes left)"));
    }
    buffer = range->buffer;
    offset = range->offset;
  }
  // The call runs without the lock. A single-use
  // executor is taken out meanwhile (a second launch of it is an error
  // anyway) and put back if the launch failed.
  const uintptr_t key = it->first;
  const bool repeatable = it->second.executor.repeatable();
  const uint64_t handle = it->second.executor.handle();
  Executor taken;
  if (!repeatable) {
    taken = std::move(it->second.executor);
    state.executors.erase(it);
  }
  Pinned pinned = state.Pin();
  lock.Release();
  absl::Status status =
      repeatable
          ? pinned.session->ExecuteHandle(handle, *stream_handle, buffer,
                                          offset, workspace_size)
          : taken.Execute(*stream_handle, buffer, offset, workspace_size);
  if (!status.ok() && !repeatable) {
    absl::MutexLock relock(&state.mu);
    if (state.session == pinned.session) {
      state.executors.emplace(key, ExecutorEntry{std::move(taken)});
    } else {
      taken.Release();  // It died with its session.
    }
  }
  if (!status.ok()) return FailAclnn(status);
  return ACLNN_SUCCESS;
}

}  // namespace opserver
