// The C API's device queries, host memory and asynchronous copies (CANN's
// acl/acl_rt.h beyond what the aclnn samples use; what InfiniCore's and
// torch_npu's runtime layers call). Declared in include/acl/acl_rt.h.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "acl/acl.h"
#include "client/aclnn_state.h"
#include "common/status_macros.h"

namespace opserver {
namespace {

// The current context's device, pinned (see Pinned), or the error to
// return.
absl::StatusOr<Pinned> PinSession(State& state) {
  absl::MutexLock lock(&state.mu);
  return PinCurrent(state);
}

// Under state.mu: the current context's device, pinned, and the handle of
// `stream` on it (NULL: its default stream), for `function`'s queued
// operations; the error to return otherwise.
absl::Status PinStream(State& state, const char* function, aclrtStream stream,
                       Pinned* pinned, uint64_t* handle) {
  ASSIGN_OR_RETURN(Pinned current, PinCurrent(state));
  absl::StatusOr<uint64_t> stream_handle =
      StreamHandle(state, stream, current.device);
  if (!stream_handle.ok()) {
    return Prefixed(stream_handle.status(), absl::StrCat(function, ": "));
  }
  *pinned = std::move(current);
  *handle = *stream_handle;
  return absl::OkStatus();
}

// This device's entry in its server's device list (GetDeviceInfo), or in
// its stats (GetServerStats): the server's own list, or its one device
// for a server that predates the lists.
template <typename Entry>
const Entry* LocalEntry(const google::protobuf::RepeatedPtrField<Entry>& list,
                        uint32_t local) {
  return local < static_cast<uint32_t>(list.size()) ? &list[local] : nullptr;
}

// Records `task` (the command a call made on a capturing stream would
// have sent) in `capture`; an invalidated capture takes nothing more.
// Under state.mu.
aclError RecordOrFail(Capture& capture, aclrtStream stream,
                      absl::StatusOr<v1::PipelineCommand> task,
                      const Pinned& pinned) {
  if (!capture.invalidated.ok()) {
    return Fail(ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
                absl::StrCat("the capture of this stream was invalidated: ",
                             capture.invalidated.message()));
  }
  if (!task.ok()) return FailAcl(pinned.Named(task.status()));
  Record(capture, reinterpret_cast<uintptr_t>(stream), *std::move(task));
  return ACL_SUCCESS;
}

// The start of the aclrtMallocHost block that holds all of [host, host +
// count), if one does. Under state.mu.
std::optional<uintptr_t> HostBlockOf(const State& state, const void* host,
                                     size_t count) {
  auto block = state.host_blocks.upper_bound(const_cast<void*>(host));
  if (block == state.host_blocks.begin()) return std::nullopt;
  --block;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(block->first);
  const uintptr_t at = reinterpret_cast<uintptr_t>(host);
  if (at - begin > block->second || count > block->second - (at - begin)) {
    return std::nullopt;
  }
  return begin;
}

// A large aclrtMemcpyAsync between the aclrtMallocHost block `block` and
// device memory on stream `handle`, as Session::UploadAsync or
// DownloadAsync returned it (ordered on the server, its bytes moving on):
// the stream's synchronize waits for it as for its reads, and
// aclrtFreeHost of the block too.
absl::Status KeepBlockCopy(State& state, const Pinned& pinned, uint64_t handle,
                           uintptr_t block,
                           absl::StatusOr<remote::PendingRead> queued) {
  ASSIGN_OR_RETURN(remote::PendingRead copy, std::move(queued));
  absl::MutexLock lock(&state.mu);
  if (!StillCurrent(state, pinned)) {
    // Dropped after the lock: the copy is cancelled.
    return WithAclError(
        absl::AbortedError(
            "aclrtMemcpyAsync: the device was reset during the call"),
        ACL_ERROR_RT_FAILURE);
  }
  state.block_copies.push_back(
      {pinned.device, handle, block, std::move(copy)});
  return absl::OkStatus();
}

// Waits for the copies still using the aclrtMallocHost block at `block`,
// so it can be freed; their status stays for their stream's synchronize.
// Without state.mu.
void WaitCopiesOf(State& state, void* block) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(block);
  std::vector<State::BlockCopy> using_it;
  {
    absl::MutexLock lock(&state.mu);
    auto& copies = state.block_copies;
    auto first = std::stable_partition(
        copies.begin(), copies.end(),
        [&](const State::BlockCopy& c) { return c.block != at; });
    std::move(first, copies.end(), std::back_inserter(using_it));
    copies.erase(first, copies.end());
  }
  std::vector<State::BlockCopy> failed;
  for (State::BlockCopy& copy : using_it) {
    absl::Status moved = copy.copy.Wait();
    if (moved.ok()) continue;  // Nothing left to report.
    copy.copy = remote::PendingRead(std::move(moved));
    failed.push_back(std::move(copy));
  }
  absl::MutexLock lock(&state.mu);
  for (State::BlockCopy& copy : failed) {
    state.block_copies.push_back(std::move(copy));
  }
}

// A host<->device aclrtMemcpyAsync on a capturing stream: refused, as
// CANN refuses pageable host memory (ACL_ERROR_RT_PARAM_INVALID); a
// page-locked (aclrtMallocHost) block too, with
// ACL_ERROR_RT_FEATURE_NOT_SUPPORT, since the server cannot read this
// process's memory at each replay. The capture is invalidated: its graph
// would lack the copy. Under state.mu.
absl::Status HostCopyInCapture(State& state, Capture& capture,
                               aclrtMemcpyKind kind, const void* host) {
  const char* direction =
      kind == ACL_MEMCPY_HOST_TO_DEVICE ? "host-to-device" : "device-to-host";
  const bool pinned = HostBlockOf(state, host, 1).has_value();
  absl::Status refused =
      pinned
          ? WithAclError(
                absl::FailedPreconditionError(absl::StrCat(
                    "aclrtMemcpyAsync: a ", direction,
                    " copy of aclrtMallocHost memory cannot be captured: the "
                    "server cannot read this process's memory at each "
                    "replay; copy before aclmdlRIExecuteAsync instead (the "
                    "capture is invalidated)")),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
          : WithAclError(
                absl::InvalidArgumentError(absl::StrCat(
                    "aclrtMemcpyAsync: a ", direction,
                    " copy of pageable host memory does not support graph "
                    "capture (the capture is invalidated)")),
                ACL_ERROR_RT_PARAM_INVALID);
  return Invalidate(capture, refused);
}

aclError QueueMemset(const char* function, void* devPtr, size_t maxCount,
                     int32_t value, size_t count, aclrtStream stream) {
  if (devPtr == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat(function, ": devPtr is NULL"));
  }
  if (count > maxCount) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat(function, ": count ", count,
                             " is larger than maxCount ", maxCount));
  }
  State& state = GetState();
  Pinned pinned;
  DeviceRange range{};
  uint64_t handle = 0;
  {
    absl::MutexLock lock(&state.mu);
    if (absl::Status s = PinStream(state, function, stream, &pinned, &handle);
        !s.ok()) {
      return FailAcl(s);
    }
    absl::StatusOr<DeviceRange> resolved =
        Resolve(state, devPtr, absl::StrCat(function, ": devPtr"));
    if (!resolved.ok()) return FailAcl(resolved.status());
    range = *resolved;
    if (range.available < count) {
      return Fail(ACL_ERROR_INVALID_PARAM,
                  absl::StrCat(function, ": ", count,
                               " bytes at devPtr run past the end of its "
                               "allocation (",
                               range.available, " bytes left)"));
    }
    if (range.device != pinned.device) {
      return Fail(ACL_ERROR_INVALID_PARAM,
                  absl::StrCat(function, ": devPtr is on device ", range.device,
                               ", the stream on device ", pinned.device));
    }
    if (Capture* capture = CaptureOf(state, stream); capture != nullptr) {
      return RecordOrFail(
          *capture, stream,
          pinned.session->MemsetCommand(range.buffer, range.offset, count,
                                        static_cast<uint8_t>(value), handle),
          pinned);
    }
  }
  absl::Status status = pinned.session->Memset(
      range.buffer, range.offset, count, static_cast<uint8_t>(value), handle);
  if (!status.ok()) return FailAcl(pinned.Named(status));
  return ACL_SUCCESS;
}

}  // namespace
}  // namespace opserver

using opserver::Fail;
using opserver::FailAcl;
using opserver::GetState;
using opserver::State;

extern "C" {

aclError aclrtGetDeviceCount(uint32_t* count) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  if (!state.initialized) {
    return Fail(ACL_ERROR_UNINITIALIZE,
                "aclrtGetDeviceCount: aclInit was not called");
  }
  if (count == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount: count is NULL");
  }
  absl::StatusOr<uint32_t> devices = state.DeviceCount();
  if (!devices.ok()) {
    return Fail(ACL_ERROR_RT_FAILURE, absl::StrCat("aclrtGetDeviceCount: ",
                                                   devices.status().message()));
  }
  *count = *devices;
  return ACL_SUCCESS;
}

aclError aclrtGetDevice(int32_t* deviceId) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  if (deviceId == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDevice: deviceId is NULL");
  }
  auto context = state.contexts.find(opserver::CurrentContext());
  if (!state.initialized || context == state.contexts.end()) {
    return Fail(ACL_ERROR_RT_CONTEXT_NULL,
                "aclrtGetDevice: the calling thread has no context (call "
                "aclrtSetDevice)");
  }
  *deviceId = static_cast<int32_t>(context->second.device);
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeDevice(void) {
  State& state = GetState();
  if (absl::Status s = opserver::CheckUnsafeCall(state, __func__); !s.ok()) {
    return FailAcl(s);
  }
  absl::StatusOr<opserver::Pinned> pinned = opserver::PinSession(state);
  if (!pinned.ok()) return FailAcl(pinned.status());
  std::vector<uint64_t> streams = {0};
  {
    absl::MutexLock lock(&state.mu);
    for (const auto& [id, entry] : state.streams) {
      if (entry.device == pinned->device) {
        streams.push_back(entry.stream.handle());
      }
    }
  }
  absl::Status first =
      opserver::WaitPendingReads(state, pinned->device, std::nullopt);
  for (uint64_t stream : streams) {
    absl::Status synchronized = pinned->session->Synchronize(stream);
    opserver::ReportDeferred(pinned->device, synchronized);
    if (first.ok() && !absl::IsNotFound(synchronized)) first = synchronized;
  }
  if (!first.ok()) return FailAcl(pinned->Named(first));
  return ACL_SUCCESS;
}

aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtGetMemInfo: ",
                             free == nullptr ? "free" : "total", " is NULL"));
  }
  if (attr < ACL_DDR_MEM || attr > ACL_HBM_MEM_P2P_NORMAL) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtGetMemInfo: unknown aclrtMemAttr ",
                             static_cast<int>(attr)));
  }
  State& state = GetState();
  absl::StatusOr<opserver::Pinned> pinned = opserver::PinSession(state);
  if (!pinned.ok()) return FailAcl(pinned.status());
  uint32_t local;
  {
    absl::MutexLock lock(&state.mu);
    local = state.devices[pinned->device].local;
  }
  opserver::v1::ServerStats stats;
  grpc::ClientContext context;
  pinned->client->SetDeadline(&context);
  // Routed as the session is: behind a proxy, the stats of its server.
  pinned->session->Route(&context);
  grpc::Status status = pinned->client->runtime().GetServerStats(
      &context, opserver::v1::GetServerStatsRequest(), &stats);
  if (!status.ok()) {
    return FailAcl(pinned->Named(pinned->client->CallStatus(
        status, context, "aclrtGetMemInfo: GetServerStats")));
  }
  const opserver::v1::DeviceStats* device =
      opserver::LocalEntry(stats.devices(), local);
  if (device == nullptr) {
    return Fail(ACL_ERROR_RT_FAILURE,
                absl::StrCat("aclrtGetMemInfo: the server reports no stats "
                             "for its device ",
                             local));
  }
  *total = static_cast<size_t>(device->capacity_bytes());
  *free = static_cast<size_t>(device->free_bytes());
  return ACL_SUCCESS;
}

const char* aclrtGetSocName(void) {
  State& state = GetState();
  absl::StatusOr<opserver::Pinned> pinned = opserver::PinSession(state);
  if (!pinned.ok()) {
    Fail(0, absl::StrCat("aclrtGetSocName: ", pinned.status().message()));
    return nullptr;
  }
  uint32_t local;
  {
    absl::MutexLock lock(&state.mu);
    const opserver::DeviceSlot& slot = state.devices[pinned->device];
    // Written once per aclInit: a pointer handed out earlier stays valid.
    if (!slot.soc_name.empty()) return slot.soc_name.c_str();
    local = slot.local;
  }
  absl::StatusOr<std::vector<opserver::v1::DeviceInfo>> devices =
      pinned->client->ListDevices();
  if (!devices.ok() || local >= devices->size()) {
    Fail(0, absl::StrCat("aclrtGetSocName: ",
                         devices.ok() ? "the server lists no such device"
                                      : devices.status().message()));
    return nullptr;
  }
  absl::MutexLock lock(&state.mu);
  if (!opserver::StillCurrent(state, *pinned)) {
    Fail(0, "aclrtGetSocName: the device was reset during the call");
    return nullptr;
  }
  opserver::DeviceSlot& slot = state.devices[pinned->device];
  if (slot.soc_name.empty()) {
    slot.soc_name = absl::StrCat("opserver-", (*devices)[local].kind());
  }
  return slot.soc_name.c_str();
}

aclError aclrtCreateStreamWithConfig(aclrtStream* stream, uint32_t priority,
                                     uint32_t flag) {
  constexpr uint32_t kKnownFlags =
      ACL_STREAM_FAST_LAUNCH | ACL_STREAM_FAST_SYNC | ACL_STREAM_PERSISTENT |
      ACL_STREAM_HUGE | ACL_STREAM_CPU_SCHEDULE | ACL_STREAM_DEVICE_USE_ONLY;
  if (priority > 7) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtCreateStreamWithConfig: priority ", priority,
                             " is not in 0..7"));
  }
  if ((flag & ~kKnownFlags) != 0) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtCreateStreamWithConfig: unknown flags 0x",
                             absl::Hex(flag & ~kKnownFlags)));
  }
  // Every server stream is alike: priority and flags change nothing.
  return aclrtCreateStream(stream);
}

aclError aclrtMallocHost(void** hostPtr, size_t size) {
  if (hostPtr == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: hostPtr is NULL");
  }
  if (size == 0) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: size is 0");
  }
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  if (!state.initialized) {
    return Fail(ACL_ERROR_UNINITIALIZE,
                "aclrtMallocHost: aclInit was not called");
  }
  constexpr size_t kAlign = 64;
  if (size > SIZE_MAX - kAlign) {
    return Fail(ACL_ERROR_BAD_ALLOC, "aclrtMallocHost: size is too large");
  }
  void* block =
      std::aligned_alloc(kAlign, (size + kAlign - 1) / kAlign * kAlign);
  if (block == nullptr) {
    return Fail(ACL_ERROR_BAD_ALLOC,
                absl::StrCat("aclrtMallocHost: ", size,
                             " bytes of host memory are not available"));
  }
  state.host_blocks[block] = size;
  *hostPtr = block;
  return ACL_SUCCESS;
}

aclError aclrtFreeHost(void* hostPtr) {
  if (hostPtr == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtFreeHost: hostPtr is NULL");
  }
  State& state = GetState();
  opserver::WaitCopiesOf(state, hostPtr);
  absl::MutexLock lock(&state.mu);
  auto it = state.host_blocks.find(hostPtr);
  if (it == state.host_blocks.end()) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclrtFreeHost: not a pointer aclrtMallocHost returned (or "
                "already freed)");
  }
  std::free(it->first);
  state.host_blocks.erase(it);
  return ACL_SUCCESS;
}

aclError aclrtMallocAlign32(void** devPtr, size_t size,
                            aclrtMemMallocPolicy policy) {
  if (size > SIZE_MAX - 31) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclrtMallocAlign32: size is too large");
  }
  return aclrtMalloc(devPtr, (size + 31) / 32 * 32, policy);
}

aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src,
                          size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream) {
  if (aclError error = opserver::CheckCopyArguments(__func__, dst, destMax, src,
                                                    count, kind);
      error != ACL_SUCCESS) {
    return error;
  }
  State& state = GetState();
  opserver::Pinned pinned;
  opserver::DeviceRange from{}, to{};
  uint64_t handle = 0;
  // The aclrtMallocHost block of a large host copy, if it is in one.
  std::optional<uintptr_t> block;
  {
    absl::MutexLock lock(&state.mu);
    if (absl::Status s =
            opserver::PinStream(state, __func__, stream, &pinned, &handle);
        !s.ok()) {
      return FailAcl(s);
    }
    if (absl::Status s = opserver::ResolveCopy(state, __func__, dst, src, count,
                                               kind, &from, &to);
        !s.ok()) {
      return FailAcl(s);
    }
    // The device ends must be the stream's device: an asynchronous copy
    // is ordered on that device's stream.
    for (auto [used, range, what] :
         {std::tuple{kind == ACL_MEMCPY_DEVICE_TO_HOST ||
                         kind == ACL_MEMCPY_DEVICE_TO_DEVICE,
                     from, "src"},
          std::tuple{kind == ACL_MEMCPY_HOST_TO_DEVICE ||
                         kind == ACL_MEMCPY_DEVICE_TO_DEVICE,
                     to, "dst"}}) {
      if (used && range.device != pinned.device) {
        return Fail(
            ACL_ERROR_INVALID_PARAM,
            absl::StrCat("aclrtMemcpyAsync: ", what, " is on device ",
                         range.device, ", the stream on device ", pinned.device,
                         " (copy between devices with aclrtMemcpy)"));
      }
    }
    // A large copy from or into page-locked memory moves its bytes while
    // the caller goes on, as an NPU's DMA does (pageable memory, CANN
    // copies before it returns, and so does this library).
    if (count > opserver::remote::kMaxPipelinedBytes &&
        (kind == ACL_MEMCPY_HOST_TO_DEVICE ||
         kind == ACL_MEMCPY_DEVICE_TO_HOST)) {
      block = opserver::HostBlockOf(
          state, kind == ACL_MEMCPY_HOST_TO_DEVICE ? src : dst, count);
    }
    if (opserver::Capture* capture = opserver::CaptureOf(state, stream);
        capture != nullptr && kind != ACL_MEMCPY_HOST_TO_HOST) {
      if (kind == ACL_MEMCPY_DEVICE_TO_DEVICE) {
        return opserver::RecordOrFail(
            *capture, stream,
            pinned.session->CopyCommand(to.buffer, to.offset, from.buffer,
                                        from.offset, count, handle),
            pinned);
      }
      return FailAcl(opserver::HostCopyInCapture(
          state, *capture, kind,
          kind == ACL_MEMCPY_HOST_TO_DEVICE ? src : dst));
    }
  }
  absl::Status status;
  switch (kind) {
    case ACL_MEMCPY_HOST_TO_HOST:
      std::memmove(dst, src, count);
      break;
    case ACL_MEMCPY_HOST_TO_DEVICE:
      if (!block.has_value()) {
        status = pinned.session->WriteAsync(to.buffer, to.offset, src, count,
                                            handle);
        break;
      }
      status = opserver::KeepBlockCopy(
          state, pinned, handle, *block,
          pinned.session->UploadAsync(to.buffer, to.offset, src, count,
                                      handle));
      break;
    case ACL_MEMCPY_DEVICE_TO_HOST: {
      if (block.has_value()) {
        status = opserver::KeepBlockCopy(
            state, pinned, handle, *block,
            pinned.session->DownloadAsync(from.buffer, from.offset, dst,
                                          count, handle));
        break;
      }
      absl::StatusOr<opserver::remote::PendingRead> read =
          pinned.session->ReadAsync(from.buffer, from.offset, dst, count,
                                    handle);
      if (!read.ok()) {
        status = read.status();
        break;
      }
      absl::MutexLock lock(&state.mu);
      if (!opserver::StillCurrent(state, pinned)) {
        return Fail(ACL_ERROR_RT_FAILURE,
                    "aclrtMemcpyAsync: the device was reset during the call");
      }
      state.pending_reads[{pinned.device, handle}].push_back(*std::move(read));
      break;
    }
    default:
      // Device to device: on the server, ordered on the stream.
      status = pinned.session->CopyOnDevice(to.buffer, to.offset, from.buffer,
                                            from.offset, count, handle);
  }
  if (!status.ok()) return FailAcl(pinned.Named(status));
  return ACL_SUCCESS;
}

aclError aclrtMemsetAsync(void* devPtr, size_t maxCount, int32_t value,
                          size_t count, aclrtStream stream) {
  return opserver::QueueMemset(__func__, devPtr, maxCount, value, count,
                               stream);
}

aclError aclrtMemset(void* devPtr, size_t maxCount, int32_t value,
                     size_t count) {
  if (absl::Status s = opserver::CheckUnsafeCall(GetState(), __func__);
      !s.ok()) {
    return FailAcl(s);
  }
  if (aclError error = opserver::QueueMemset(__func__, devPtr, maxCount, value,
                                             count, nullptr);
      error != ACL_SUCCESS) {
    return error;
  }
  // Synchronous: returns once the bytes are set (the default stream has
  // reached the memset).
  return aclrtSynchronizeStream(nullptr);
}

}  // extern "C"
