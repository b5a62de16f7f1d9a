// The C API's streams, device memory and synchronous copies (acl/acl.h):
// aclrtCreateStream, aclrtDestroyStream, aclrtSynchronizeStream,
// aclrtMalloc, aclrtFree and aclrtMemcpy, forwarded to the device's
// session. The rest of the runtime is in aclnn_runtime.cc.

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "acl/acl.h"
#include "client/aclnn_state.h"
#include "client/client.h"

using opserver::Fail;
using opserver::FailAcl;
using opserver::GetState;
using opserver::State;

extern "C" {

aclError aclrtCreateStream(aclrtStream* stream) {
  State& state = GetState();
  opserver::Pinned pinned;
  {
    absl::MutexLock lock(&state.mu);
    auto current = opserver::PinCurrent(state);
    if (!current.ok()) return FailAcl(current.status());
    if (stream == nullptr) {
      return Fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateStream: stream is NULL");
    }
    pinned = *std::move(current);
  }
  // Calls run without the lock.
  auto created = pinned.session->CreateStream();
  if (!created.ok()) return FailAcl(pinned.Named(created.status()));
  absl::MutexLock lock(&state.mu);
  if (!opserver::StillCurrent(state, pinned)) {
    created->Release();  // It died with its session.
    return Fail(ACL_ERROR_RT_FAILURE,
                "aclrtCreateStream: the device was reset during the call");
  }
  const uintptr_t id = opserver::kStreamBase + 16 * state.next_stream++;
  state.streams.emplace(
      id, opserver::StreamEntry{pinned.device, *std::move(created)});
  *stream = reinterpret_cast<aclrtStream>(id);
  return ACL_SUCCESS;
}

aclError aclrtDestroyStream(aclrtStream stream) {
  State& state = GetState();
  opserver::Pinned pinned;
  opserver::remote::Stream doomed;
  const uintptr_t key = reinterpret_cast<uintptr_t>(stream);
  {
    absl::MutexLock lock(&state.mu);
    if (!state.initialized) {
      return Fail(ACL_ERROR_UNINITIALIZE,
                  "aclrtDestroyStream: aclInit was not called");
    }
    auto it = state.streams.find(key);
    if (it == state.streams.end()) {
      return Fail(ACL_ERROR_INVALID_PARAM,
                  "aclrtDestroyStream: not a live aclrtCreateStream stream");
    }
    if (absl::Status s = opserver::RefuseIfCapturing(state, __func__, stream);
        !s.ok()) {
      return FailAcl(s);
    }
    pinned = state.Pin(it->second.device);
    doomed = std::move(it->second.stream);
    state.streams.erase(it);
  }
  // The call waits for the stream's running launch: not under the lock, so
  // other threads' calls go on meanwhile. Its copies land first.
  const uint64_t handle = doomed.handle();
  opserver::WaitPendingReads(state, pinned.device, handle).IgnoreError();
  absl::Status status = doomed.Destroy();
  if (!status.ok()) {
    // Not destroyed (e.g. the deadline passed): the stream stays usable and
    // can be destroyed again, unless the session changed meanwhile.
    absl::MutexLock lock(&state.mu);
    if (opserver::StillCurrent(state, pinned) &&
        status.code() != absl::StatusCode::kNotFound) {
      state.streams.emplace(
          key, opserver::StreamEntry{
                   pinned.device,
                   opserver::remote::Stream(pinned.session.get(), handle)});
    }
    return FailAcl(pinned.Named(status));
  }
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeStream(aclrtStream stream) {
  State& state = GetState();
  opserver::Pinned pinned;
  uint64_t handle;
  {
    absl::MutexLock lock(&state.mu);
    absl::StatusOr<opserver::Pinned> current;
    auto it = state.streams.find(reinterpret_cast<uintptr_t>(stream));
    if (stream != nullptr && it != state.streams.end() && state.initialized) {
      current = state.Pin(it->second.device);  // On any thread.
    } else {
      current = opserver::PinCurrent(state);
    }
    if (!current.ok()) return FailAcl(current.status());
    pinned = *std::move(current);
    auto stream_handle = opserver::StreamHandle(state, stream, pinned.device);
    if (!stream_handle.ok()) {
      return Fail(ACL_ERROR_INVALID_PARAM,
                  absl::StrCat("aclrtSynchronizeStream: ",
                               stream_handle.status().message()));
    }
    if (absl::Status s = opserver::RefuseIfCapturing(state, __func__, stream);
        !s.ok()) {
      return FailAcl(s);
    }
    handle = *stream_handle;
  }
  // Other threads may use the API while this one waits. The stream's
  // aclrtMemcpyAsync reads land first; one that failed took the stream's
  // error with it, so it is the synchronize's.
  absl::Status status =
      opserver::WaitPendingReads(state, pinned.device, handle);
  absl::Status synchronized = pinned.session->Synchronize(handle);
  opserver::ReportDeferred(pinned.device, synchronized);
  if (status.ok()) status = synchronized;
  if (!status.ok()) return FailAcl(pinned.Named(status));
  return ACL_SUCCESS;
}

aclError aclrtMalloc(void** devPtr, size_t size,
                     aclrtMemMallocPolicy /*policy*/) {
  State& state = GetState();
  opserver::Pinned pinned;
  {
    absl::MutexLock lock(&state.mu);
    auto current = opserver::PinCurrent(state);
    if (!current.ok()) return FailAcl(current.status());
    if (devPtr == nullptr) {
      return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: devPtr is NULL");
    }
    if (size == 0) {
      return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: size is 0");
    }
    pinned = *std::move(current);
  }
  // Calls run without the lock.
  auto buffer = pinned.session->Malloc(size);
  if (!buffer.ok()) return FailAcl(pinned.Named(buffer.status()));
  absl::MutexLock lock(&state.mu);
  if (!opserver::StillCurrent(state, pinned)) {
    buffer->Release();  // It died with its session.
    return Fail(ACL_ERROR_RT_FAILURE,
                "aclrtMalloc: the device was reset during the call");
  }
  absl::StatusOr<void*> address =
      state.addresses.Add(size, *buffer, pinned.device);
  if (!address.ok()) return FailAcl(address.status());
  *devPtr = *address;
  return ACL_SUCCESS;
}

aclError aclrtFree(void* devPtr) {
  State& state = GetState();
  opserver::Pinned pinned;
  opserver::remote::DeviceBuffer doomed;
  {
    absl::MutexLock lock(&state.mu);
    if (!state.initialized) {
      return Fail(ACL_ERROR_UNINITIALIZE, "aclrtFree: aclInit was not called");
    }
    absl::StatusOr<opserver::DeviceRange> range =
        state.addresses.Resolve(devPtr, "aclrtFree: devPtr");
    absl::StatusOr<opserver::remote::DeviceBuffer> removed =
        state.addresses.Remove(devPtr);
    if (!removed.ok()) {
      return Fail(ACL_ERROR_INVALID_PARAM,
                  absl::StrCat("aclrtFree: ", removed.status().message()));
    }
    pinned = state.Pin(range->device);
    doomed = *std::move(removed);
  }
  // The call runs without the lock (on the pointer's device, from any
  // thread).
  absl::Status status = doomed.Free();
  if (!status.ok()) return FailAcl(pinned.Named(status));
  return ACL_SUCCESS;
}

aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count,
                     aclrtMemcpyKind kind) {
  if (aclError error = opserver::CheckCopyArguments(__func__, dst, destMax, src,
                                                    count, kind);
      error != ACL_SUCCESS) {
    return error;
  }
  if (absl::Status s = opserver::CheckUnsafeCall(GetState(), __func__);
      !s.ok()) {
    return FailAcl(s);
  }
  if (kind == ACL_MEMCPY_HOST_TO_HOST) {
    std::memmove(dst, src, count);
    return ACL_SUCCESS;
  }
  State& state = GetState();
  // The device side of each end: the pointer's own device, whichever
  // context is current (as CANN's copies address device memory by
  // pointer).
  opserver::Pinned source, target;
  opserver::DeviceRange from{}, to{};
  {
    absl::MutexLock lock(&state.mu);
    if (!state.initialized) {
      return Fail(ACL_ERROR_UNINITIALIZE,
                  "aclrtMemcpy: aclInit was not called");
    }
    if (absl::Status s = opserver::ResolveCopy(state, __func__, dst, src, count,
                                               kind, &from, &to);
        !s.ok()) {
      return FailAcl(s);
    }
    if (kind != ACL_MEMCPY_HOST_TO_DEVICE) source = state.Pin(from.device);
    if (kind != ACL_MEMCPY_DEVICE_TO_HOST) target = state.Pin(to.device);
  }
  // The transfer runs without the lock: other threads may use the API.
  absl::Status status;
  const opserver::Pinned& named =
      kind == ACL_MEMCPY_HOST_TO_DEVICE ? target : source;
  if (kind == ACL_MEMCPY_HOST_TO_DEVICE) {
    status = target.session->Upload(to.buffer, to.offset, src, count);
  } else if (kind == ACL_MEMCPY_DEVICE_TO_HOST) {
    status = source.session->Download(from.buffer, from.offset, dst, count);
  } else if (from.device == to.device) {
    // On the server, ordered after the default stream's work, then waited
    // for: aclrtMemcpy returns once the bytes are there.
    status = source.session->CopyOnDevice(to.buffer, to.offset, from.buffer,
                                          from.offset, count);
    if (status.ok()) {
      status = source.session->Synchronize(0);
      opserver::ReportDeferred(source.device, status);
    }
  } else {
    // Between devices (sessions, possibly servers): through the host.
    std::vector<char> bounce(count);
    status = source.session->Download(from.buffer, from.offset, bounce.data(),
                                      count);
    if (status.ok()) {
      status =
          target.session->Upload(to.buffer, to.offset, bounce.data(), count);
      if (!status.ok()) return FailAcl(target.Named(status));
    }
  }
  if (!status.ok()) return FailAcl(named.Named(status));
  return ACL_SUCCESS;
}

}  // extern "C"
