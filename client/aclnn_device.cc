// The C API's device queries, host memory and asynchronous copies (CANN's
// acl/acl_rt.h beyond what the aclnn samples use; what InfiniCore's and
// torch_npu's runtime layers call). Declared in include/acl/acl_rt.h.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "acl/acl.h"
#include "client/aclnn_state.h"

namespace opserver {
namespace {

// The session to call on, pinned (see Pinned), or the error to return.
absl::StatusOr<Pinned> PinSession(State& state) {
  absl::MutexLock lock(&state.mu);
  absl::StatusOr<remote::Session*> current = SessionOf(state);
  if (!current.ok()) return current.status();
  return state.Pin();
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
  *count = 1;
  return ACL_SUCCESS;
}

aclError aclrtGetDevice(int32_t* deviceId) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  if (deviceId == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDevice: deviceId is NULL");
  }
  if (!state.initialized || state.session == nullptr) {
    return Fail(ACL_ERROR_RT_CONTEXT_NULL,
                "aclrtGetDevice: no device is set (call aclrtSetDevice)");
  }
  *deviceId = 0;
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeDevice(void) {
  State& state = GetState();
  absl::StatusOr<opserver::Pinned> pinned = opserver::PinSession(state);
  if (!pinned.ok()) return opserver::SessionError(pinned.status());
  std::vector<uint64_t> streams = {0};
  {
    absl::MutexLock lock(&state.mu);
    for (const auto& [id, stream] : state.streams) {
      streams.push_back(stream.handle());
    }
  }
  absl::Status first = opserver::WaitPendingReads(state, std::nullopt);
  for (uint64_t stream : streams) {
    absl::Status synchronized = pinned->session->Synchronize(stream);
    if (first.ok() && !absl::IsNotFound(synchronized)) first = synchronized;
  }
  if (!first.ok()) return FailAcl(first);
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
  if (!pinned.ok()) return opserver::SessionError(pinned.status());
  absl::StatusOr<opserver::v1::GetDeviceInfoResponse> info =
      pinned->client->GetDeviceInfo();
  if (!info.ok()) return FailAcl(info.status());
  opserver::v1::ServerStats stats;
  {
    grpc::ClientContext context;
    pinned->client->SetDeadline(&context);
    grpc::Status status = pinned->client->runtime().GetServerStats(
        &context, opserver::v1::GetServerStatsRequest(), &stats);
    if (!status.ok()) {
      return FailAcl(opserver::remote::FromGrpcStatus(
          status, context, "aclrtGetMemInfo: GetServerStats"));
    }
  }
  const uint64_t capacity = info->memory_bytes();
  *total = static_cast<size_t>(capacity);
  *free = static_cast<size_t>(
      capacity > stats.buffer_bytes() ? capacity - stats.buffer_bytes() : 0);
  return ACL_SUCCESS;
}

const char* aclrtGetSocName(void) {
  State& state = GetState();
  absl::StatusOr<opserver::Pinned> pinned = opserver::PinSession(state);
  if (!pinned.ok()) {
    Fail(0, absl::StrCat("aclrtGetSocName: ", pinned.status().message()));
    return nullptr;
  }
  absl::StatusOr<opserver::v1::GetDeviceInfoResponse> info =
      pinned->client->GetDeviceInfo();
  if (!info.ok()) {
    Fail(0, absl::StrCat("aclrtGetSocName: ", info.status().message()));
    return nullptr;
  }
  absl::MutexLock lock(&state.mu);
  // Written once per aclInit: a pointer handed out earlier stays valid.
  if (state.soc_name.empty()) {
    state.soc_name = absl::StrCat("opserver-", info->kind());
  }
  return state.soc_name.c_str();
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
  {
    absl::MutexLock lock(&state.mu);
    auto current = opserver::SessionOf(state);
    if (!current.ok()) return opserver::SessionError(current.status());
    absl::StatusOr<uint64_t> stream_handle =
        opserver::StreamHandle(state, stream);
    if (!stream_handle.ok()) {
      return Fail(
          ACL_ERROR_INVALID_PARAM,
          absl::StrCat("aclrtMemcpyAsync: ", stream_handle.status().message()));
    }
    handle = *stream_handle;
    if (absl::Status s = opserver::ResolveCopy(state, __func__, dst, src, count,
                                               kind, &from, &to);
        !s.ok()) {
      return FailAcl(s);
    }
    pinned = state.Pin();
  }
  absl::Status status;
  switch (kind) {
    case ACL_MEMCPY_HOST_TO_HOST:
      std::memmove(dst, src, count);
      break;
    case ACL_MEMCPY_HOST_TO_DEVICE:
      status =
          pinned.session->WriteAsync(to.buffer, to.offset, src, count, handle);
      break;
    case ACL_MEMCPY_DEVICE_TO_HOST: {
      absl::StatusOr<opserver::remote::PendingRead> read =
          pinned.session->ReadAsync(from.buffer, from.offset, dst, count,
                                    handle);
      if (!read.ok()) {
        status = read.status();
        break;
      }
      absl::MutexLock lock(&state.mu);
      if (state.session != pinned.session) {
        return Fail(ACL_ERROR_RT_FAILURE,
                    "aclrtMemcpyAsync: the device was reset during the call");
      }
      state.pending_reads[handle].push_back(*std::move(read));
      break;
    }
    default: {
      // Device to device: through the host, ordered on the stream; done
      // before the call returns (the server has no device-side copy yet).
      std::vector<char> bounce(count);
      status = pinned.session->Download(from.buffer, from.offset, bounce.data(),
                                        count, handle);
      if (status.ok()) {
        status = pinned.session->Upload(to.buffer, to.offset, bounce.data(),
                                        count, handle);
      }
    }
  }
  if (!status.ok()) return FailAcl(status);
  return ACL_SUCCESS;
}

}  // extern "C"
