// The state and helpers the aclnn C API's runtime calls and operator shims
// share (see aclnn_state.h).

#include "client/aclnn_state.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "client/client.h"
#include "client/device_addresses.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"

namespace opserver {

using kernels::DType;
using remote::Executor;
using remote::Session;
using remote::TensorDesc;

namespace {

thread_local std::string last_error;
thread_local uintptr_t current_context = 0;
thread_local int last_error_code = 0;
// CANN's default: the strictest.
thread_local aclmdlRICaptureMode capture_mode =
    ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;

// The payload key WithAclError stores the exact aclError under.
constexpr absl::string_view kAclErrorPayload = "opserver-acl-error";

}  // namespace

std::string& LastError() { return last_error; }
uintptr_t& CurrentContext() { return current_context; }
int& LastErrorCode() { return last_error_code; }
aclmdlRICaptureMode& ThreadCaptureMode() { return capture_mode; }

absl::Status WithAclError(absl::Status status, aclError code) {
  status.SetPayload(kAclErrorPayload, absl::Cord(absl::StrCat(code)));
  return status;
}

absl::Status Pinned::Named(const absl::Status& status) const {
  // Only the errors of the connection or the session: an operator's or an
  // argument's error keeps its exact message.
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAborted:
      break;
    default:
      return status;
  }
  return Prefixed(status, absl::StrCat("device ", device, " (opserver at ",
                                       address, "): "));
}

absl::Status Prefixed(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  absl::Status prefixed(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload([&](absl::string_view key, const absl::Cord& value) {
    prefixed.SetPayload(key, value);
  });
  return prefixed;
}

absl::StatusOr<std::shared_ptr<Client>> State::Connect(size_t index) {
  ServerSlot& server = servers[index];
  if (server.client != nullptr) return server.client;
  opserver::ConnectOptions options = security;
  options.connect_timeout = options.call_timeout = timeout;
  options.wait_timeout = sync_timeout;
  options.max_message_bytes = max_message_bytes;
  auto client = opserver::Client::Connect(server.address, options);
  if (!client.ok()) {
    return absl::Status(
        client.status().code(),
        absl::StrCat(client.status().message(),
                     " (OPSERVER_ADDRESS lists HOST:PORT,HOST:PORT...)"));
  }
  server.client = *std::move(client);
  return server.client;
}

absl::StatusOr<bool> State::LearnNextServer() {
  size_t next = 0;
  while (next < servers.size() && servers[next].devices.has_value()) ++next;
  if (next == servers.size()) return false;
  absl::StatusOr<std::shared_ptr<Client>> client = Connect(next);
  absl::StatusOr<std::vector<v1::DeviceInfo>> listed =
      client.ok()
          ? (*client)->ListDevices()
          : absl::StatusOr<std::vector<v1::DeviceInfo>>(client.status());
  if (absl::IsUnavailable(listed.status()) ||
      absl::IsDeadlineExceeded(listed.status())) {
    // Its device count is unknown; the ordinals of the servers after it
    // must not wait for it.
    servers[next].unreachable = listed.status();
    servers[next].client.reset();
    servers[next].devices = 1;
    DeviceSlot slot;
    slot.server = next;
    devices.push_back(std::move(slot));
    return true;
  }
  if (!listed.ok()) return listed.status();
  servers[next].unreachable = absl::OkStatus();
  servers[next].devices = static_cast<uint32_t>(listed->size());
  for (uint32_t local = 0; local < listed->size(); ++local) {
    DeviceSlot slot;
    slot.server = next;
    slot.local = local;
    devices.push_back(std::move(slot));
  }
  return true;
}

absl::StatusOr<DeviceSlot*> State::Device(int64_t ordinal) {
  const size_t known = devices.size();
  while (ordinal >= 0 && static_cast<uint64_t>(ordinal) >= devices.size()) {
    ASSIGN_OR_RETURN(bool learned, LearnNextServer());
    if (!learned) break;
  }
  // The device of a server this very call found down: its error, rather
  // than a second try at once (aclrtSetDevice tries again next time).
  if (ordinal >= 0 && static_cast<uint64_t>(ordinal) >= known &&
      static_cast<uint64_t>(ordinal) < devices.size()) {
    const absl::Status& down = servers[devices[ordinal].server].unreachable;
    if (!down.ok()) return down;
  }
  if (ordinal < 0 || static_cast<uint64_t>(ordinal) >= devices.size()) {
    return WithAclError(
        absl::InvalidArgumentError(absl::StrCat(
            "device ", ordinal, " does not exist; the opserver",
            servers.size() > 1 ? "s" : "", " at ", address, " ",
            devices.size() == 1
                ? "is device 0"
                : absl::StrCat("have devices 0 to ", devices.size() - 1))),
        ACL_ERROR_INVALID_DEVICE);
  }
  return &devices[ordinal];
}

absl::StatusOr<uint32_t> State::DeviceCount() {
  for (;;) {
    ASSIGN_OR_RETURN(bool learned, LearnNextServer());
    if (!learned) break;
  }
  for (const ServerSlot& server : servers) {
    if (server.unreachable.ok()) return static_cast<uint32_t>(devices.size());
  }
  // Not one server answers: no device to count on.
  return servers.front().unreachable;
}

Pinned State::Pin(uint32_t device) const {
  const DeviceSlot& slot = devices[device];
  return {slot.client, slot.session, device, servers[slot.server].address};
}

absl::Status State::DropSession(uint32_t device) {
  DeviceSlot& slot = devices[device];
  absl::Status pending;
  if (slot.session != nullptr) {
    pending = slot.session->Flush();
    // A session already gone (closed by its server, or its server went
    // away) was reported when it was lost; dropping it is not a new error.
    if (absl::IsNotFound(pending) || absl::IsUnavailable(pending)) {
      pending = absl::OkStatus();
    }
  }
  // Handles die with the session on the server; forget them here without
  // a call each.
  addresses.ReleaseDevice(device);
  for (auto it = streams.begin(); it != streams.end();) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    it->second.stream.Release();
    it = streams.erase(it);
  }
  for (auto it = executors.begin(); it != executors.end();) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    it->second.executor.Release();
    it = executors.erase(it);
  }
  for (auto it = events.begin(); it != events.end();) {
    it = it->second.device == device ? events.erase(it) : std::next(it);
  }
  DropCaptures(*this, device);
  for (auto it = pending_reads.begin(); it != pending_reads.end();) {
    // Their bytes never come: the copies die too.
    it = it->first.first == device ? pending_reads.erase(it) : std::next(it);
  }
  // Copies of page-locked memory still moving are cancelled (what they
  // wrote stays).
  block_copies.erase(
      std::remove_if(block_copies.begin(), block_copies.end(),
                     [&](const BlockCopy& c) { return c.device == device; }),
      block_copies.end());
  // The device's contexts go with it (CANN's aclrtResetDevice destroys
  // the default context); threads bound to them get
  // ACL_ERROR_RT_CONTEXT_NULL until they set a device again.
  for (auto it = contexts.begin(); it != contexts.end();) {
    it = it->second.device == device ? contexts.erase(it) : std::next(it);
  }
  slot.default_context = 0;
  slot.session.reset();  // Closes the session.
  slot.client.reset();
  if (!pending.ok()) return Pin(device).Named(pending);
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
    RETURN_IF_ERROR(check(src, "src", from));
  }
  if (kind == ACL_MEMCPY_HOST_TO_DEVICE ||
      kind == ACL_MEMCPY_DEVICE_TO_DEVICE) {
    RETURN_IF_ERROR(check(dst, "dst", to));
  }
  return absl::OkStatus();
}

absl::Status WaitPendingReads(State& state, uint32_t device,
                              std::optional<uint64_t> handle) {
  std::vector<remote::PendingRead> reads;
  {
    absl::MutexLock lock(&state.mu);
    for (auto it = state.pending_reads.begin();
         it != state.pending_reads.end();) {
      if (it->first.first != device ||
          (handle.has_value() && it->first.second != *handle)) {
        ++it;
        continue;
      }
      for (remote::PendingRead& read : it->second) {
        reads.push_back(std::move(read));
      }
      it = state.pending_reads.erase(it);
    }
    auto ours = [&](const State::BlockCopy& c) {
      return c.device == device && (!handle.has_value() || c.stream == *handle);
    };
    for (State::BlockCopy& copy : state.block_copies) {
      if (ours(copy)) reads.push_back(std::move(copy.copy));
    }
    state.block_copies.erase(
        std::remove_if(state.block_copies.begin(),
                       state.block_copies.end(), ours),
        state.block_copies.end());
  }
  absl::Status first;
  for (remote::PendingRead& read : reads) {
    absl::Status waited = read.Wait();
    ReportDeferred(device, waited);
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
  if (auto code = status.GetPayload(kAclErrorPayload); code.has_value()) {
    int value;
    if (absl::SimpleAtoi(std::string(*code), &value)) return value;
  }
  // A runtime code the server gave (CANN's rt codes, 107xxx and 507xxx,
  // e.g. a blocking callback's time-out) is the call's aclError as it is.
  if (const int32_t aclnn = kernels::GetAclnnStatus(status);
      (aclnn >= 107000 && aclnn < 108000) ||
      (aclnn >= 507000 && aclnn < 508000)) {
    return aclnn;
  }
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

absl::StatusOr<uint32_t> CurrentDevice(State& state) {
  if (!state.initialized) {
    return WithAclError(absl::FailedPreconditionError("aclInit was not called"),
                        ACL_ERROR_UNINITIALIZE);
  }
  auto context = state.contexts.find(CurrentContext());
  if (context == state.contexts.end()) {
    return WithAclError(
        absl::FailedPreconditionError(
            "the calling thread has no context: call aclrtSetDevice (or "
            "aclrtSetCurrentContext) on this thread first"),
        ACL_ERROR_RT_CONTEXT_NULL);
  }
  const uint32_t device = context->second.device;
  const DeviceSlot& slot = state.devices[device];
  if (slot.session == nullptr) {
    return WithAclError(
        absl::FailedPreconditionError(
            absl::StrCat("device ", device, " was reset: call aclrtSetDevice(",
                         device, ") first")),
        ACL_ERROR_RT_CONTEXT_NULL);
  }
  if (absl::Status lost = slot.session->Lost(); !lost.ok()) {
    // Its code kept: a server that went away is UNAVAILABLE
    // (ACL_ERROR_RT_FAILURE), a session the server closed NOT_FOUND.
    return state.Pin(device).Named(absl::Status(
        lost.code(),
        absl::StrCat(lost.message(), "; call aclrtResetDevice(", device,
                     ") and aclrtSetDevice(", device, ") to start a new one")));
  }
  return device;
}

absl::StatusOr<Pinned> PinCurrent(State& state) {
  ASSIGN_OR_RETURN(uint32_t device, CurrentDevice(state));
  return state.Pin(device);
}

bool StillCurrent(const State& state, const Pinned& pinned) {
  return pinned.device < state.devices.size() &&
         state.devices[pinned.device].session == pinned.session;
}

aclError SessionError(const absl::Status& status) { return FailAcl(status); }

absl::StatusOr<DeviceRange> Resolve(State& state, const void* pointer,
                                    absl::string_view what) {
  return state.addresses.Resolve(pointer, what);
}

absl::StatusOr<uint64_t> StreamHandle(State& state, aclrtStream stream,
                                      uint32_t device) {
  if (stream == nullptr) return 0;  // The default stream.
  auto it = state.streams.find(reinterpret_cast<uintptr_t>(stream));
  if (it == state.streams.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream ", absl::Hex(reinterpret_cast<uintptr_t>(stream)),
                     " is not a live aclrtCreateStream stream"));
  }
  if (it->second.device != device) {
    return WithAclError(
        absl::InvalidArgumentError(absl::StrCat(
            "stream ", absl::Hex(reinterpret_cast<uintptr_t>(stream)),
            " belongs to device ", it->second.device,
            ", not to the current context's device ", device)),
        ACL_ERROR_RT_STREAM_CONTEXT);
  }
  return it->second.stream.handle();
}

absl::StatusOr<PinnedStream> PinStreamOf(State& state, const char* function,
                                         aclrtStream stream) {
  absl::MutexLock lock(&state.mu);
  absl::StatusOr<Pinned> current;
  auto it = state.streams.find(reinterpret_cast<uintptr_t>(stream));
  if (stream != nullptr && it != state.streams.end() && state.initialized) {
    current = state.Pin(it->second.device);
  } else {
    current = PinCurrent(state);
  }
  if (!current.ok()) {
    return Prefixed(current.status(), absl::StrCat(function, ": "));
  }
  absl::StatusOr<uint64_t> handle =
      StreamHandle(state, stream, current->device);
  if (!handle.ok()) {
    return WithAclError(absl::InvalidArgumentError(absl::StrCat(
                            function, ": ", handle.status().message())),
                        ACL_ERROR_INVALID_PARAM);
  }
  // Its captured work was never sent: nothing can wait for it, and a
  // callback cannot be ordered after it.
  RETURN_IF_ERROR(RefuseIfCapturing(state, function, stream));
  return PinnedStream{*std::move(current), *handle};
}

}  // namespace opserver
