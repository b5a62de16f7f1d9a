// The aclnn-compatible C API's runtime calls (acl/acl.h, aclnn/acl_meta.h):
// init and finalize, the device, streams, memory, tensors, scalars and
// executors. Every call is forwarded to the opserver named by
// OPSERVER_ADDRESS through the C++ client; the operators are in
// aclnn_ops.cc.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "client/aclnn_state.h"
#include "client/client.h"
#include "client/device_set.h"
#include "common/etcd_address.h"
#include "common/status_macros.h"
#include "kernels/dtype.h"
#include "kernels/scalar.h"

namespace opserver {
namespace {

absl::Duration DurationFromEnv(const char* name, absl::Duration fallback) {
  const char* value = std::getenv(name);
  int64_t ms;
  if (value == nullptr || !absl::SimpleAtoi(value, &ms) || ms <= 0) {
    return fallback;
  }
  return absl::Milliseconds(ms);
}

// A switch from the environment: 1/on/true or 0/off/false (any case);
// `fallback` when unset or empty.
absl::StatusOr<bool> BoolFromEnv(const char* name, bool fallback) {
  const char* raw = std::getenv(name);
  const std::string value = absl::AsciiStrToLower(raw != nullptr ? raw : "");
  if (value.empty()) return fallback;
  if (value == "1" || value == "on" || value == "true") return true;
  if (value == "0" || value == "off" || value == "false") return false;
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": '", value, "' is not 0/off/false or 1/on/true"));
}

// The connection's options from the environment: TLS files and token named
// by OPSERVER_TLS_CA_FILE, OPSERVER_TLS_CERT_FILE, OPSERVER_TLS_KEY_FILE and
// OPSERVER_TOKEN (or OPSERVER_TOKEN_FILE), OPSERVER_PIPELINE,
// OPSERVER_DATA_PATH and OPSERVER_TRANSFER_CONNECTIONS. Files are checked now
// so a typo fails aclInit, not the first call.
absl::StatusOr<ConnectOptions> ConnectOptionsFromEnv() {
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value != nullptr ? value : "";
  };
  ConnectOptions options;
  for (auto [name, field] :
       {std::pair<const char*, std::string*>{"OPSERVER_TLS_CA_FILE",
                                             &options.tls_ca_file},
        {"OPSERVER_TLS_CERT_FILE", &options.tls_cert_file},
        {"OPSERVER_TLS_KEY_FILE", &options.tls_key_file}}) {
    *field = env(name);
    if (!field->empty() && !std::ifstream(*field)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": cannot read ", *field));
    }
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "OPSERVER_TLS_CERT_FILE and OPSERVER_TLS_KEY_FILE: set both or "
        "neither");
  }
  // Pipelined execution is the default; OPSERVER_PIPELINE=0 makes every
  // call a blocking unary RPC (for debugging).
  ASSIGN_OR_RETURN(bool pipeline, BoolFromEnv("OPSERVER_PIPELINE", true));
  options.pipeline = pipeline;
  // The data path for large transfers is the default where the server has
  // one; OPSERVER_DATA_PATH=0 keeps every transfer on gRPC.
  ASSIGN_OR_RETURN(bool data_path, BoolFromEnv("OPSERVER_DATA_PATH", true));
  options.data_path = data_path;
  options.token = env("OPSERVER_TOKEN");
  if (options.token.empty() && !env("OPSERVER_TOKEN_FILE").empty()) {
    absl::StatusOr<std::string> token =
        opserver::remote::ReadTokenFile(env("OPSERVER_TOKEN_FILE"));
    if (!token.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("OPSERVER_TOKEN_FILE: ", token.status().message()));
    }
    options.token = *std::move(token);
  }
  // Connections a large copy, either way, is split over (1 = one call).
  if (const std::string raw = env("OPSERVER_TRANSFER_CONNECTIONS");
      !raw.empty()) {
    if (!absl::SimpleAtoi(raw, &options.transfer_connections) ||
        options.transfer_connections < 1 ||
        options.transfer_connections > remote::kMaxTransferConnections) {
      return absl::InvalidArgumentError(absl::StrCat(
          "OPSERVER_TRANSFER_CONNECTIONS: '", raw,
          "' is not a number from 1 to ", remote::kMaxTransferConnections));
    }
  }
  return options;
}

// What to add to a message of a server that wants a token.
const char* TokenHint(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnauthenticated
             ? " (set OPSERVER_TOKEN or OPSERVER_TOKEN_FILE)"
             : "";
}

// The slot of device `device_id` for `function` (aclrtSetDevice,
// aclrtResetDevice, aclrtCreateContext), under state.mu: the error to
// return otherwise (recorded).
absl::StatusOr<DeviceSlot*> CheckDevice(State& state, const char* function,
                                        int32_t device_id) {
  if (!state.initialized) {
    return WithAclError(absl::FailedPreconditionError(
                            absl::StrCat(function, ": aclInit was not called")),
                        ACL_ERROR_UNINITIALIZE);
  }
  absl::StatusOr<DeviceSlot*> slot = state.Device(device_id);
  if (!slot.ok()) {
    if (AclErrorOf(slot.status()) == ACL_ERROR_INVALID_DEVICE) {
      return WithAclError(
          absl::Status(slot.status().code(),
                       absl::StrCat(function, ": ", slot.status().message())),
          ACL_ERROR_INVALID_DEVICE);
    }
    return WithAclError(
        absl::Status(slot.status().code(),
                     absl::StrCat(function, ": ", slot.status().message(),
                                  TokenHint(slot.status()))),
        ACL_ERROR_RT_FAILURE);
  }
  return slot;
}

// Opens device `device_id`'s session unless it has a live one, for
// `function` (aclrtSetDevice, aclrtCreateContext): a session the server
// lost (it restarted, or the network dropped) is replaced by a new one on
// a new connection, so a device whose server is back works again; its old
// handles are gone. The connection and the session are made without
// state.mu, so other threads' calls on other devices go on meanwhile.
absl::Status OpenDevice(State& state, const char* function, int32_t device_id) {
  size_t server;
  uint32_t local;
  std::string address;
  {
    absl::MutexLock lock(&state.mu);
    ASSIGN_OR_RETURN(DeviceSlot * slot,
                     CheckDevice(state, function, device_id));
    if (slot->session != nullptr) {
      if (slot->session->Lost().ok()) return absl::OkStatus();
      // Lost: start over on a new connection (the old one may be waiting
      // out a reconnection backoff).
      state.DropSession(device_id).IgnoreError();
      state.servers[slot->server].client.reset();
    }
    server = slot->server;
    local = slot->local;
    address = state.servers[server].address;
  }
  std::shared_ptr<Client> client;
  {
    absl::MutexLock lock(&state.mu);
    client = state.servers[server].client;
  }
  if (client == nullptr) {
    ConnectOptions options;
    {
      absl::MutexLock lock(&state.mu);
      options = state.security;
      options.connect_timeout = options.call_timeout = state.timeout;
      options.wait_timeout = state.sync_timeout;
      options.max_message_bytes = state.max_message_bytes;
    }
    auto connected = Client::Connect(address, options);
    if (!connected.ok()) {
      return WithAclError(
          absl::Status(connected.status().code(),
                       absl::StrCat(function, ": device ", device_id, ": ",
                                    connected.status().message(),
                                    " (set OPSERVER_ADDRESS=HOST:PORT)")),
          ACL_ERROR_RT_FAILURE);
    }
    client = *std::move(connected);
  }
  auto session = client->CreateSession("aclnn_remote", /*attach=*/true, local);
  if (session.status().code() == absl::StatusCode::kUnauthenticated) {
    return WithAclError(
        absl::Status(session.status().code(),
                     absl::StrCat(function, ": ", session.status().message(),
                                  TokenHint(session.status()))),
        ACL_ERROR_RT_FAILURE);
  }
  if (!session.ok()) {
    return absl::Status(
        session.status().code(),
        absl::StrCat(function, ": device ", device_id, " (opserver at ",
                     address, "): ", session.status().message()));
  }
  absl::MutexLock lock(&state.mu);
  if (!state.initialized ||
      static_cast<size_t>(device_id) >= state.devices.size()) {
    return WithAclError(absl::FailedPreconditionError(absl::StrCat(
                            function, ": aclFinalize was called meanwhile")),
                        ACL_ERROR_UNINITIALIZE);
  }
  DeviceSlot& slot = state.devices[device_id];
  if (state.servers[server].client == nullptr) {
    state.servers[server].client = client;
  }
  state.servers[server].unreachable = absl::OkStatus();  // It is back.
  if (slot.session == nullptr) {
    // Another thread may have opened it meanwhile: theirs stays.
    slot.client = std::move(client);
    slot.session = std::shared_ptr<remote::Session>(std::move(*session));
    // The operator time-outs set before hold for it too (queued, no wait;
    // a session without the command channel has none, as
    // aclrtSetOpExecuteTimeOut said when they were set).
    if (state.op_execute_timeout_ms != 0 || state.op_wait_timeout_ms != 0) {
      slot.session
          ->SetOpTimeouts(state.op_execute_timeout_ms, state.op_wait_timeout_ms)
          .IgnoreError();
    }
  }
  return absl::OkStatus();
}

// After OpenDevice, under state.mu: ACL_SUCCESS unless another thread
// reset the device (or finalized) meanwhile (recorded).
aclError CheckStillOpen(const State& state, const char* function,
                        int32_t device_id) {
  if (!state.initialized ||
      static_cast<size_t>(device_id) >= state.devices.size() ||
      state.devices[device_id].session == nullptr) {
    return Fail(ACL_ERROR_RT_CONTEXT_NULL,
                absl::StrCat(function, ": device ", device_id,
                             " was reset or finalized meanwhile"));
  }
  return ACL_SUCCESS;
}

// Under state.mu, for `function`: ACL_SUCCESS when `id` is a live context,
// else the error (recorded).
aclError CheckContext(const State& state, const char* function, uintptr_t id) {
  if (!state.initialized) {
    return Fail(ACL_ERROR_UNINITIALIZE,
                absl::StrCat(function, ": aclInit was not called"));
  }
  if (id == 0 || state.contexts.count(id) == 0) {
    return Fail(
        ACL_ERROR_INVALID_PARAM,
        absl::StrCat(function, ": ", absl::Hex(id), " is not a live context"));
  }
  return ACL_SUCCESS;
}

// The default context of device `device_id` (made now if it has none);
// call with state.mu held, after OpenDevice.
uintptr_t DefaultContext(State& state, uint32_t device_id) {
  DeviceSlot& slot = state.devices[device_id];
  if (slot.default_context == 0) {
    slot.default_context = kContextBase + 16 * state.next_context++;
    state.contexts.emplace(slot.default_context,
                           ContextEntry{device_id, /*is_default=*/true});
  }
  return slot.default_context;
}

}  // namespace
}  // namespace opserver

using opserver::Fail;
using opserver::FailAcl;
using opserver::GetState;
using opserver::State;

extern "C" {

const char* aclGetRecentErrMsg(void) { return opserver::LastError().c_str(); }

aclError aclInit(const char* /*configPath*/) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  if (state.initialized) {
    return Fail(ACL_ERROR_REPEAT_INITIALIZE, "aclInit was already called");
  }
  const char* address = std::getenv("OPSERVER_ADDRESS");
  state.address =
      address != nullptr && *address != '\0' ? address : "127.0.0.1:50051";
  const bool pool = opserver::IsEtcdAddress(state.address);
  absl::StatusOr<std::vector<std::string>> addresses =
      pool ? std::vector<std::string>()
           : opserver::remote::DeviceSet::ParseAddresses(state.address);
  if (!addresses.ok()) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclInit: OPSERVER_ADDRESS: ",
                             addresses.status().message()));
  }
  state.servers.clear();
  state.devices.clear();
  state.claim.reset();
  for (std::string& one : *addresses) {
    state.servers.push_back(opserver::ServerSlot{std::move(one)});
  }
  state.timeout =
      opserver::DurationFromEnv("OPSERVER_TIMEOUT_MS", absl::Seconds(5));
  state.sync_timeout =
      opserver::DurationFromEnv("OPSERVER_SYNC_TIMEOUT_MS", absl::Seconds(600));
  absl::StatusOr<opserver::ConnectOptions> security =
      opserver::ConnectOptionsFromEnv();
  if (!security.ok()) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclInit: ", security.status().message()));
  }
  state.security = *std::move(security);
  // Abseil's Mutex deadlock detection (on in Debian's Abseil build) records
  // every lock order in a process-wide graph and halved the pipelined
  // launch rate: off unless OPSERVER_DETECT_MUTEX_DEADLOCKS=1 (a debugging
  // aid; the setting is the process's, shared with the program if it uses
  // the same Abseil).
  absl::StatusOr<bool> detect =
      opserver::BoolFromEnv("OPSERVER_DETECT_MUTEX_DEADLOCKS", false);
  if (!detect.ok()) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclInit: ", detect.status().message()));
  }
  if (!*detect) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  // For a server run with a --max_message_bytes above the 64 MiB default.
  state.max_message_bytes = 64ull << 20;
  if (const char* bytes = std::getenv("OPSERVER_MAX_MESSAGE_BYTES");
      bytes != nullptr) {
    uint64_t value;
    if (absl::SimpleAtoi(bytes, &value) && value > 0 && value < (1ull << 31)) {
      state.max_message_bytes = value;
    }
  }
  // Last: a claim is taken only when nothing else can fail.
  if (pool) {
    if (absl::Status joined = opserver::JoinPool(state); !joined.ok()) {
      return Fail(absl::IsInvalidArgument(joined) ? ACL_ERROR_INVALID_PARAM
                                                  : ACL_ERROR_RT_FAILURE,
                  absl::StrCat("aclInit: OPSERVER_ADDRESS=", state.address,
                               ": ", joined.message()));
    }
  }
  state.initialized = true;
  return ACL_SUCCESS;
}

aclError aclFinalize(void) {
  State& state = GetState();
  // First and without the lock: the host-function thread may be inside a
  // function that calls the API.
  opserver::EndHostCallbacks();
  absl::MutexLock lock(&state.mu);
  if (!state.initialized) {
    return Fail(ACL_ERROR_REPEAT_FINALIZE,
                "aclFinalize without a matching aclInit");
  }
  absl::Status pending;
  for (uint32_t device = 0; device < state.devices.size(); ++device) {
    absl::Status dropped = state.DropSession(device);
    if (pending.ok()) pending = dropped;
  }
  state.devices.clear();
  state.servers.clear();
  state.claim.reset();  // The claimed devices are free again.
  state.contexts.clear();
  // The addresses are kept: a pointer from before aclFinalize must never
  // name an allocation made after the next aclInit.
  state.initialized = false;
  if (!pending.ok()) return FailAcl(pending);
  return ACL_SUCCESS;
}

aclError aclrtSetDevice(int32_t deviceId) {
  State& state = GetState();
  if (absl::Status opened = opserver::OpenDevice(state, __func__, deviceId);
      !opened.ok()) {
    return FailAcl(opened);
  }
  absl::MutexLock lock(&state.mu);
  if (aclError error = opserver::CheckStillOpen(state, __func__, deviceId);
      error != ACL_SUCCESS) {
    return error;
  }
  opserver::CurrentContext() = opserver::DefaultContext(state, deviceId);
  return ACL_SUCCESS;
}

aclError aclrtResetDevice(int32_t deviceId) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  absl::StatusOr<opserver::DeviceSlot*> slot =
      opserver::CheckDevice(state, __func__, deviceId);
  if (!slot.ok()) return FailAcl(slot.status());
  if (absl::Status pending = state.DropSession(deviceId); !pending.ok()) {
    return FailAcl(pending);
  }
  return ACL_SUCCESS;
}

aclError aclrtCreateContext(aclrtContext* context, int32_t deviceId) {
  if (context == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateContext: context is NULL");
  }
  State& state = GetState();
  if (absl::Status opened = opserver::OpenDevice(state, __func__, deviceId);
      !opened.ok()) {
    return FailAcl(opened);
  }
  absl::MutexLock lock(&state.mu);
  if (aclError error = opserver::CheckStillOpen(state, __func__, deviceId);
      error != ACL_SUCCESS) {
    return error;
  }
  const uintptr_t id = opserver::kContextBase + 16 * state.next_context++;
  state.contexts.emplace(
      id, opserver::ContextEntry{static_cast<uint32_t>(deviceId), false});
  opserver::CurrentContext() = id;
  *context = reinterpret_cast<aclrtContext>(id);
  return ACL_SUCCESS;
}

aclError aclrtDestroyContext(aclrtContext context) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  const auto id = reinterpret_cast<uintptr_t>(context);
  if (aclError error = opserver::CheckContext(state, __func__, id);
      error != ACL_SUCCESS) {
    return error;
  }
  auto it = state.contexts.find(id);
  if (it->second.is_default) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtDestroyContext: ", absl::Hex(id),
                             " is device ", it->second.device,
                             "'s default context (aclrtResetDevice "
                             "destroys it)"));
  }
  state.contexts.erase(it);
  if (opserver::CurrentContext() == id) opserver::CurrentContext() = 0;
  return ACL_SUCCESS;
}

aclError aclrtSetCurrentContext(aclrtContext context) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  const auto id = reinterpret_cast<uintptr_t>(context);
  if (aclError error = opserver::CheckContext(state, __func__, id);
      error != ACL_SUCCESS) {
    return error;
  }
  opserver::CurrentContext() = id;
  return ACL_SUCCESS;
}

aclError aclrtGetCurrentContext(aclrtContext* context) {
  if (context == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclrtGetCurrentContext: context is NULL");
  }
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  const uintptr_t id = opserver::CurrentContext();
  if (!state.initialized || state.contexts.count(id) == 0) {
    return Fail(ACL_ERROR_RT_CONTEXT_NULL,
                "aclrtGetCurrentContext: the calling thread has no context "
                "(call aclrtSetDevice or aclrtSetCurrentContext)");
  }
  *context = reinterpret_cast<aclrtContext>(id);
  return ACL_SUCCESS;
}

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

aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum,
                           aclDataType dataType, const int64_t* stride,
                           int64_t offset, aclFormat format,
                           const int64_t* storageDims, uint64_t storageDimsNum,
                           void* tensorData) {
  if (viewDimsNum > 0 && viewDims == nullptr) {
    Fail(0, "aclCreateTensor: viewDims is NULL");
    return nullptr;
  }
  if (viewDimsNum > 8 || storageDimsNum > 8) {
    Fail(0, "aclCreateTensor: more than 8 dimensions");
    return nullptr;
  }
  if (storageDimsNum > 0 && storageDims == nullptr) {
    Fail(0, "aclCreateTensor: storageDims is NULL");
    return nullptr;
  }
  auto* tensor = new aclTensor;
  tensor->shape.assign(viewDims, viewDims + viewDimsNum);
  if (stride != nullptr) tensor->strides.assign(stride, stride + viewDimsNum);
  if (storageDimsNum > 0) {
    tensor->storage_shape.assign(storageDims, storageDims + storageDimsNum);
  }
  tensor->dtype = dataType;
  tensor->format = format;
  tensor->offset = offset;
  tensor->data = reinterpret_cast<uintptr_t>(tensorData);
  return tensor;
}

aclScalar* aclCreateScalar(void* value, aclDataType dataType) {
  if (value == nullptr) {
    Fail(0, "aclCreateScalar: value is NULL");
    return nullptr;
  }
  // aclCreateScalar copies one element of `dataType` from `value`.
  const auto dtype = static_cast<opserver::kernels::DType>(dataType);
  const int64_t size = opserver::kernels::DTypeSize(dtype);
  absl::StatusOr<opserver::kernels::Scalar> scalar =
      size == 0 ? absl::InvalidArgumentError("unknown dtype")
                : opserver::kernels::Scalar::FromBytes(dtype, value, size);
  if (!scalar.ok()) {
    Fail(0, absl::StrCat("aclCreateScalar: unsupported aclDataType ",
                         static_cast<int>(dataType)));
    return nullptr;
  }
  return new aclScalar{dataType, scalar->AsDouble()};
}

aclnnStatus aclDestroyTensor(const aclTensor* tensor) {
  delete tensor;
  return ACLNN_SUCCESS;
}

aclnnStatus aclDestroyScalar(const aclScalar* scalar) {
  delete scalar;
  return ACLNN_SUCCESS;
}

aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor* executor) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  auto it = state.executors.find(reinterpret_cast<uintptr_t>(executor));
  if (it == state.executors.end()) {
    return Fail(ACLNN_ERR_INNER_NULLPTR,
                "aclSetAclOpExecutorRepeatable: executor is unknown, "
                "destroyed or already consumed");
  }
  absl::Status status = it->second.executor.SetRepeatable();
  if (!status.ok()) return opserver::FailAclnn(status);
  return ACLNN_SUCCESS;
}

aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor* executor) {
  State& state = GetState();
  opserver::Pinned pinned;
  opserver::remote::Executor doomed;
  {
    absl::MutexLock lock(&state.mu);
    auto it = state.executors.find(reinterpret_cast<uintptr_t>(executor));
    if (it == state.executors.end()) {
      return Fail(ACLNN_ERR_INNER_NULLPTR,
                  "aclDestroyAclOpExecutor: executor is unknown, destroyed "
                  "or already consumed");
    }
    pinned = state.Pin(it->second.device);
    doomed = std::move(it->second.executor);
    state.executors.erase(it);
  }
  // The call runs without the lock.
  absl::Status status = doomed.Destroy();
  if (!status.ok()) return opserver::FailAclnn(status);
  return ACLNN_SUCCESS;
}

}  // extern "C"
