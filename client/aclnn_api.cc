// The aclnn-compatible C API (client/include/): every call is forwarded to
// the opserver named by OPSERVER_ADDRESS through the C++ client.
//
// Device pointers: each aclrtMalloc reserves a range of a fake address space
// (never dereferenced) and remembers the server buffer behind it, so a
// pointer anywhere inside an allocation resolves to (buffer, byte offset).
// Streams and executors are likewise opaque numbers that are never reused,
// so a stale or consumed handle is recognised instead of dereferenced.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_dropout_backward.h"
#include "aclnnop/aclnn_hardswish_backward.h"
#include "aclnnop/aclnn_leaky_relu_backward.h"
#include "aclnnop/aclnn_softshrink_backward.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "client/client.h"
#include "client/device_addresses.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"
#include "kernels/scalar.h"

struct aclTensor {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  std::vector<int64_t> storage_shape;
  aclDataType dtype;
  int64_t offset;
  uintptr_t data;
};

struct aclScalar {
  aclDataType dtype;
  double value;
};

namespace opserver {
namespace {

using kernels::DType;
using remote::DeviceBuffer;
using remote::Executor;
using remote::Session;
using remote::Stream;
using remote::TensorDesc;

// Where the opaque stream and executor handles start (device addresses are
// DeviceAddressSpace's, below these).
constexpr uintptr_t kStreamBase = uintptr_t{0x20} << 40;
constexpr uintptr_t kExecutorBase = uintptr_t{0x30} << 40;

thread_local std::string last_error;

struct ExecutorEntry {
  Executor executor;
};

// Everything between aclInit and aclFinalize.
struct State {
  absl::Mutex mu;
  bool initialized = false;
  std::string address;
  absl::Duration timeout = absl::Seconds(5);
  absl::Duration sync_timeout = absl::Seconds(600);
  // TLS files and token from the environment (timeouts are set on use).
  opserver::ConnectOptions security;
  uint64_t max_message_bytes = 64ull << 20;
  // Shared so that a long call (synchronize, a transfer) can run without
  // holding `mu`, keeping both alive even if another thread resets them.
  std::shared_ptr<Client> client;
  std::shared_ptr<opserver::remote::Session> session;
  // Kept across aclFinalize: a pointer from before must never name an
  // allocation made after the next aclInit (review finding 16).
  DeviceAddressSpace addresses;
  uint64_t next_stream = 1;
  std::map<uintptr_t, Stream> streams;
  uint64_t next_executor = 1;
  std::map<uintptr_t, ExecutorEntry> executors;

  // Closes the session. What was queued is delivered first, and a deferred
  // error still pending is returned (a session the server no longer has
  // has nothing left to report: NOT_FOUND is not an error of the reset).
  absl::Status DropSession() {
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
    session.reset();  // Closes the session.
    return pending;
  }
};

State& GetState() {
  // Never destroyed: a program that exits without aclFinalize must not make
  // calls from static destructors.
  static State* const state = new State;
  return *state;
}

// Records `message` as the thread's last error and returns `code`.
template <typename Code>
Code Fail(Code code, absl::string_view message) {
  last_error = std::string(message);
  return code;
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

absl::Duration DurationFromEnv(const char* name, absl::Duration fallback) {
  const char* value = std::getenv(name);
  int64_t ms;
  if (value == nullptr || !absl::SimpleAtoi(value, &ms) || ms <= 0) {
    return fallback;
  }
  return absl::Milliseconds(ms);
}

// TLS files and token named by OPSERVER_TLS_CA_FILE, OPSERVER_TLS_CERT_FILE,
// OPSERVER_TLS_KEY_FILE and OPSERVER_TOKEN (or OPSERVER_TOKEN_FILE). Files
// are checked now so a typo fails aclInit, not the first call.
absl::StatusOr<ConnectOptions> SecurityFromEnv() {
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
  const std::string pipeline = absl::AsciiStrToLower(env("OPSERVER_PIPELINE"));
  if (pipeline == "0" || pipeline == "off" || pipeline == "false") {
    options.pipeline = false;
  } else if (!pipeline.empty() && pipeline != "1" && pipeline != "on" &&
             pipeline != "true") {
    return absl::InvalidArgumentError(absl::StrCat(
        "OPSERVER_PIPELINE: '", pipeline, "' is not 0/off/false or 1/on/true"));
  }
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
  return options;
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

using DeviceRange = DeviceAddressSpace::Range;

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
// others (review finding 16).
aclnnStatus Plan(const char* function, const std::string& op,
                 const v1::OpParams& params,
                 std::vector<std::pair<const char*, const aclTensor*>> tensors,
                 uint64_t* workspace_size, aclOpExecutor** executor) {
  State& state = GetState();
  std::shared_ptr<Client> client;  // Outlives `session`.
  std::shared_ptr<Session> session;
  std::map<std::string, TensorDesc> descs;
  {
    absl::MutexLock lock(&state.mu);
    auto current = SessionOf(state);
    if (!current.ok()) {
      return Fail(ACLNN_ERR_RUNTIME_ERROR,
                  absl::StrCat(function, ": ", current.status().message()));
    }
    if (workspace_size == nullptr || executor == nullptr) {
      return Fail(ACLNN_ERR_PARAM_NULLPTR,
                  absl::StrCat(function, ": ",
                               workspace_size == nullptr ? "workspaceSize"
                                                         : "executor",
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
    client = state.client;
    session = state.session;
  }
  auto planned = session->GetWorkspaceSize(op, params, descs);
  if (!planned.ok()) return FailAclnn(planned.status());
  absl::MutexLock lock(&state.mu);
  if (state.session != session) {
    // The device was reset meanwhile: the executor died with its session.
    planned->Release();
    return Fail(ACLNN_ERR_RUNTIME_ERROR,
                absl::StrCat(function,
                             ": the device was reset during the call"));
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
  // The call runs without the lock (review finding 16). A single-use
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
  std::shared_ptr<Client> client = state.client;  // Outlives `session`.
  std::shared_ptr<Session> session = state.session;
  lock.Release();
  absl::Status status =
      repeatable ? session->ExecuteHandle(handle, *stream_handle, buffer,
                                          offset, workspace_size)
                 : taken.Execute(*stream_handle, buffer, offset,
                                 workspace_size);
  if (!status.ok() && !repeatable) {
    absl::MutexLock relock(&state.mu);
    if (state.session == session) {
      state.executors.emplace(key, ExecutorEntry{std::move(taken)});
    } else {
      taken.Release();  // It died with its session.
    }
  }
  if (!status.ok()) return FailAclnn(status);
  return ACLNN_SUCCESS;
}

}  // namespace
}  // namespace opserver

using opserver::Fail;
using opserver::FailAcl;
using opserver::GetState;
using opserver::State;

extern "C" {

const char* aclGetRecentErrMsg(void) { return opserver::last_error.c_str(); }

aclError aclInit(const char* /*configPath*/) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  if (state.initialized) {
    return Fail(ACL_ERROR_REPEAT_INITIALIZE, "aclInit was already called");
  }
  const char* address = std::getenv("OPSERVER_ADDRESS");
  state.address =
      address != nullptr && *address != '\0' ? address : "127.0.0.1:50051";
  state.timeout =
      opserver::DurationFromEnv("OPSERVER_TIMEOUT_MS", absl::Seconds(5));
  state.sync_timeout =
      opserver::DurationFromEnv("OPSERVER_SYNC_TIMEOUT_MS", absl::Seconds(600));
  absl::StatusOr<opserver::ConnectOptions> security =
      opserver::SecurityFromEnv();
  if (!security.ok()) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclInit: ", security.status().message()));
  }
  state.security = *std::move(security);
  // For a server run with a --max_message_bytes above the 64 MiB default.
  state.max_message_bytes = 64ull << 20;
  if (const char* bytes = std::getenv("OPSERVER_MAX_MESSAGE_BYTES");
      bytes != nullptr) {
    uint64_t value;
    if (absl::SimpleAtoi(bytes, &value) && value > 0 && value < (1ull << 31)) {
      state.max_message_bytes = value;
    }
  }
  state.initialized = true;
  return ACL_SUCCESS;
}

aclError aclFinalize(void) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  if (!state.initialized) {
    return Fail(ACL_ERROR_REPEAT_FINALIZE,
                "aclFinalize without a matching aclInit");
  }
  absl::Status pending = state.DropSession();
  state.client.reset();
  // The addresses are kept: a pointer from before aclFinalize must never
  // name an allocation made after the next aclInit (review finding 16).
  state.initialized = false;
  if (!pending.ok()) return FailAcl(pending);
  return ACL_SUCCESS;
}

aclError aclrtSetDevice(int32_t deviceId) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  if (!state.initialized) {
    return Fail(ACL_ERROR_UNINITIALIZE,
                "aclrtSetDevice: aclInit was not called");
  }
  if (deviceId != 0) {
    return Fail(ACL_ERROR_INVALID_DEVICE,
                absl::StrCat("aclrtSetDevice: device ", deviceId,
                             " does not exist; the opserver at ", state.address,
                             " is device 0"));
  }
  if (state.session != nullptr) {
    // Already set, unless the server lost the session meanwhile: say so
    // rather than pretend the device is usable (review finding 16).
    auto current = opserver::SessionOf(state);
    if (!current.ok()) {
      return opserver::SessionError(absl::Status(
          current.status().code(),
          absl::StrCat("aclrtSetDevice: ", current.status().message())));
    }
    return ACL_SUCCESS;
  }
  if (state.client == nullptr) {
    opserver::ConnectOptions options = state.security;
    options.connect_timeout = options.call_timeout = state.timeout;
    options.wait_timeout = state.sync_timeout;
    options.max_message_bytes = state.max_message_bytes;
    auto client = opserver::Client::Connect(state.address, options);
    if (!client.ok()) {
      return Fail(ACL_ERROR_RT_FAILURE,
                  absl::StrCat("aclrtSetDevice: ", client.status().message(),
                               " (set OPSERVER_ADDRESS=HOST:PORT)"));
    }
    state.client = *std::move(client);
  }
  auto session = state.client->CreateSession("aclnn_remote", /*attach=*/true);
  if (session.status().code() == absl::StatusCode::kUnauthenticated) {
    return Fail(ACL_ERROR_RT_FAILURE,
                absl::StrCat("aclrtSetDevice: ", session.status().message(),
                             " (set OPSERVER_TOKEN or OPSERVER_TOKEN_FILE)"));
  }
  if (!session.ok()) return FailAcl(session.status());
  state.session = *std::move(session);
  return ACL_SUCCESS;
}

aclError aclrtResetDevice(int32_t deviceId) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  if (!state.initialized) {
    return Fail(ACL_ERROR_UNINITIALIZE,
                "aclrtResetDevice: aclInit was not called");
  }
  if (deviceId != 0) {
    return Fail(
        ACL_ERROR_INVALID_DEVICE,
        absl::StrCat("aclrtResetDevice: device ", deviceId, " does not exist"));
  }
  if (absl::Status pending = state.DropSession(); !pending.ok()) {
    return FailAcl(pending);
  }
  return ACL_SUCCESS;
}

aclError aclrtCreateStream(aclrtStream* stream) {
  State& state = GetState();
  std::shared_ptr<opserver::Client> client;  // Outlives `session`.
  std::shared_ptr<opserver::remote::Session> session;
  {
    absl::MutexLock lock(&state.mu);
    auto current = opserver::SessionOf(state);
    if (!current.ok()) return opserver::SessionError(current.status());
    if (stream == nullptr) {
      return Fail(ACL_ERROR_INVALID_PARAM,
                  "aclrtCreateStream: stream is NULL");
    }
    client = state.client;
    session = state.session;
  }
  // Calls run without the lock (review finding 16).
  auto created = session->CreateStream();
  if (!created.ok()) return FailAcl(created.status());
  absl::MutexLock lock(&state.mu);
  if (state.session != session) {
    created->Release();  // It died with its session.
    return Fail(ACL_ERROR_RT_FAILURE,
                "aclrtCreateStream: the device was reset during the call");
  }
  const uintptr_t id = opserver::kStreamBase + 16 * state.next_stream++;
  state.streams.emplace(id, *std::move(created));
  *stream = reinterpret_cast<aclrtStream>(id);
  return ACL_SUCCESS;
}

aclError aclrtDestroyStream(aclrtStream stream) {
  State& state = GetState();
  std::shared_ptr<opserver::Client> client;  // Outlives `session`.
  std::shared_ptr<opserver::remote::Session> session;
  opserver::remote::Stream doomed;
  const uintptr_t key = reinterpret_cast<uintptr_t>(stream);
  {
    absl::MutexLock lock(&state.mu);
    auto current = opserver::SessionOf(state);
    if (!current.ok()) return opserver::SessionError(current.status());
    auto it = state.streams.find(key);
    if (it == state.streams.end()) {
      return Fail(ACL_ERROR_INVALID_PARAM,
                  "aclrtDestroyStream: not a live aclrtCreateStream stream");
    }
    client = state.client;
    session = state.session;
    doomed = std::move(it->second);
    state.streams.erase(it);
  }
  // The call waits for the stream's running launch: not under the lock, so
  // other threads' calls go on meanwhile (review finding 16).
  const uint64_t handle = doomed.handle();
  absl::Status status = doomed.Destroy();
  if (!status.ok()) {
    // Not destroyed (e.g. the deadline passed): the stream stays usable and
    // can be destroyed again, unless the session changed meanwhile.
    absl::MutexLock lock(&state.mu);
    if (state.session == session && status.code() != absl::StatusCode::kNotFound) {
      state.streams.emplace(key,
                            opserver::remote::Stream(session.get(), handle));
    }
    return FailAcl(status);
  }
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeStream(aclrtStream stream) {
  State& state = GetState();
  std::shared_ptr<opserver::Client> client;  // Outlives `session`.
  std::shared_ptr<opserver::remote::Session> session;
  uint64_t handle;
  {
    absl::MutexLock lock(&state.mu);
    auto current = opserver::SessionOf(state);
    if (!current.ok()) return opserver::SessionError(current.status());
    auto stream_handle = opserver::StreamHandle(state, stream);
    if (!stream_handle.ok()) {
      return Fail(ACL_ERROR_INVALID_PARAM,
                  absl::StrCat("aclrtSynchronizeStream: ",
                               stream_handle.status().message()));
    }
    client = state.client;
    session = state.session;
    handle = *stream_handle;
  }
  // Other threads may use the API while this one waits.
  absl::Status status = session->Synchronize(handle);
  if (!status.ok()) return FailAcl(status);
  return ACL_SUCCESS;
}

aclError aclrtMalloc(void** devPtr, size_t size,
                     aclrtMemMallocPolicy /*policy*/) {
  State& state = GetState();
  std::shared_ptr<opserver::Client> client;  // Outlives `session`.
  std::shared_ptr<opserver::remote::Session> session;
  {
    absl::MutexLock lock(&state.mu);
    auto current = opserver::SessionOf(state);
    if (!current.ok()) return opserver::SessionError(current.status());
    if (devPtr == nullptr) {
      return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: devPtr is NULL");
    }
    if (size == 0) {
      return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: size is 0");
    }
    client = state.client;
    session = state.session;
  }
  // Calls run without the lock (review finding 16).
  auto buffer = session->Malloc(size);
  if (!buffer.ok()) return FailAcl(buffer.status());
  absl::MutexLock lock(&state.mu);
  if (state.session != session) {
    buffer->Release();  // It died with its session.
    return Fail(ACL_ERROR_RT_FAILURE,
                "aclrtMalloc: the device was reset during the call");
  }
  absl::StatusOr<void*> address = state.addresses.Add(size, *buffer);
  if (!address.ok()) return FailAcl(address.status());
  *devPtr = *address;
  return ACL_SUCCESS;
}

aclError aclrtFree(void* devPtr) {
  State& state = GetState();
  std::shared_ptr<opserver::Client> client;  // Outlives `session`.
  std::shared_ptr<opserver::remote::Session> session;
  opserver::remote::DeviceBuffer doomed;
  {
    absl::MutexLock lock(&state.mu);
    auto current = opserver::SessionOf(state);
    if (!current.ok()) return opserver::SessionError(current.status());
    absl::StatusOr<opserver::remote::DeviceBuffer> removed =
        state.addresses.Remove(devPtr);
    if (!removed.ok()) {
      return Fail(ACL_ERROR_INVALID_PARAM,
                  absl::StrCat("aclrtFree: ", removed.status().message()));
    }
    client = state.client;
    session = state.session;
    doomed = *std::move(removed);
  }
  // The call runs without the lock (review finding 16).
  absl::Status status = doomed.Free();
  if (!status.ok()) return FailAcl(status);
  return ACL_SUCCESS;
}

aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count,
                     aclrtMemcpyKind kind) {
  if (dst == nullptr || src == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtMemcpy: ", dst == nullptr ? "dst" : "src",
                             " is NULL"));
  }
  if (count > destMax) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtMemcpy: count ", count,
                             " is larger than destMax ", destMax));
  }
  if (kind == ACL_MEMCPY_HOST_TO_HOST) {
    std::memmove(dst, src, count);
    return ACL_SUCCESS;
  }
  if (kind != ACL_MEMCPY_HOST_TO_DEVICE && kind != ACL_MEMCPY_DEVICE_TO_HOST &&
      kind != ACL_MEMCPY_DEVICE_TO_DEVICE) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtMemcpy: unknown aclrtMemcpyKind ",
                             static_cast<int>(kind)));
  }
  State& state = GetState();
  std::shared_ptr<opserver::Client> client;  // Outlives `session`.
  std::shared_ptr<opserver::remote::Session> session;
  opserver::DeviceRange from{}, to{};
  {
    absl::MutexLock lock(&state.mu);
    auto current = opserver::SessionOf(state);
    if (!current.ok()) return opserver::SessionError(current.status());
    auto check = [&](const void* pointer, const char* what,
                     opserver::DeviceRange* range) -> absl::Status {
      auto resolved = opserver::Resolve(state, pointer,
                                        absl::StrCat("aclrtMemcpy: ", what));
      if (!resolved.ok()) return resolved.status();
      if (resolved->available < count) {
        return absl::InvalidArgumentError(
            absl::StrCat("aclrtMemcpy: ", count, " bytes at ", what,
                         " run past the end of its allocation (",
                         resolved->available, " bytes left)"));
      }
      *range = *resolved;
      return absl::OkStatus();
    };
    if (kind != ACL_MEMCPY_HOST_TO_DEVICE) {
      if (absl::Status s = check(src, "src", &from); !s.ok()) return FailAcl(s);
    }
    if (kind != ACL_MEMCPY_DEVICE_TO_HOST) {
      if (absl::Status s = check(dst, "dst", &to); !s.ok()) return FailAcl(s);
    }
    client = state.client;
    session = state.session;
  }
  // The transfer runs without the lock: other threads may use the API.
  absl::Status status;
  if (kind == ACL_MEMCPY_HOST_TO_DEVICE) {
    status = session->Upload(to.buffer, to.offset, src, count);
  } else if (kind == ACL_MEMCPY_DEVICE_TO_HOST) {
    status = session->Download(from.buffer, from.offset, dst, count);
  } else {
    // Through the host: the API has no device-side copy.
    std::vector<char> bounce(count);
    status = session->Download(from.buffer, from.offset, bounce.data(), count);
    if (status.ok()) {
      status = session->Upload(to.buffer, to.offset, bounce.data(), count);
    }
  }
  if (!status.ok()) return FailAcl(status);
  return ACL_SUCCESS;
}

aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum,
                           aclDataType dataType, const int64_t* stride,
                           int64_t offset, aclFormat /*format*/,
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
  std::shared_ptr<opserver::Client> client;  // Outlives `session`.
  std::shared_ptr<opserver::remote::Session> session;
  opserver::remote::Executor doomed;
  {
    absl::MutexLock lock(&state.mu);
    auto it = state.executors.find(reinterpret_cast<uintptr_t>(executor));
    if (it == state.executors.end()) {
      return Fail(ACLNN_ERR_INNER_NULLPTR,
                  "aclDestroyAclOpExecutor: executor is unknown, destroyed "
                  "or already consumed");
    }
    client = state.client;
    session = state.session;
    doomed = std::move(it->second.executor);
    state.executors.erase(it);
  }
  // The call runs without the lock (review finding 16).
  absl::Status status = doomed.Destroy();
  if (!status.ok()) return opserver::FailAclnn(status);
  return ACLNN_SUCCESS;
}

// ---------------------------------------------------------------- operators

aclnnStatus aclnnThresholdBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                   const aclTensor* self,
                                                   const aclScalar* threshold,
                                                   aclTensor* out,
                                                   uint64_t* workspaceSize,
                                                   aclOpExecutor** executor) {
  constexpr char kFunction[] = "aclnnThresholdBackwardGetWorkspaceSize";
  if (threshold == nullptr) {
    return Fail(ACLNN_ERR_PARAM_NULLPTR,
                absl::StrCat(kFunction, ": threshold is nullptr"));
  }
  opserver::v1::OpParams params;
  params.set_threshold(threshold->value);
  return opserver::Plan(
      kFunction, "ThresholdBackward", params,
      {{"gradOutput", gradOutput}, {"self", self}, {"out", out}}, workspaceSize,
      executor);
}

aclnnStatus aclnnThresholdBackward(void* workspace, uint64_t workspaceSize,
                                   aclOpExecutor* executor,
                                   const aclrtStream stream) {
  return opserver::Launch("aclnnThresholdBackward", workspace, workspaceSize,
                          executor, stream);
}

aclnnStatus aclnnSoftshrinkBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclScalar* lambd,
    aclTensor* gradInput, uint64_t* workspaceSize, aclOpExecutor** executor) {
  constexpr char kFunction[] = "aclnnSoftshrinkBackwardGetWorkspaceSize";
  if (lambd == nullptr) {
    return Fail(ACLNN_ERR_PARAM_NULLPTR,
                absl::StrCat(kFunction, ": lambd is nullptr"));
  }
  opserver::v1::OpParams params;
  params.set_lambd(lambd->value);
  return opserver::Plan(
      kFunction, "SoftshrinkBackward", params,
      {{"gradOutput", gradOutput}, {"self", self}, {"gradInput", gradInput}},
      workspaceSize, executor);
}

aclnnStatus aclnnSoftshrinkBackward(void* workspace, uint64_t workspaceSize,
                                    aclOpExecutor* executor,
                                    const aclrtStream stream) {
  return opserver::Launch("aclnnSoftshrinkBackward", workspace, workspaceSize,
                          executor, stream);
}

aclnnStatus aclnnHardswishBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                   const aclTensor* self,
                                                   aclTensor* out,
                                                   uint64_t* workspaceSize,
                                                   aclOpExecutor** executor) {
  return opserver::Plan(
      "aclnnHardswishBackwardGetWorkspaceSize", "HardswishBackward",
      opserver::v1::OpParams(),
      {{"gradOutput", gradOutput}, {"self", self}, {"out", out}}, workspaceSize,
      executor);
}

aclnnStatus aclnnHardswishBackward(void* workspace, uint64_t workspaceSize,
                                   aclOpExecutor* executor,
                                   const aclrtStream stream) {
  return opserver::Launch("aclnnHardswishBackward", workspace, workspaceSize,
                          executor, stream);
}

aclnnStatus aclnnLeakyReluBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self,
    const aclScalar* negativeSlope, bool selfIsResult, aclTensor* out,
    uint64_t* workspaceSize, aclOpExecutor** executor) {
  constexpr char kFunction[] = "aclnnLeakyReluBackwardGetWorkspaceSize";
  if (negativeSlope == nullptr) {
    return Fail(ACLNN_ERR_PARAM_NULLPTR,
                absl::StrCat(kFunction, ": negativeSlope is nullptr"));
  }
  opserver::v1::OpParams params;
  params.mutable_negative_slope()->set_dtype(
      static_cast<opserver::v1::DataType>(negativeSlope->dtype));
  params.mutable_negative_slope()->set_value(negativeSlope->value);
  params.set_self_is_result(selfIsResult);
  return opserver::Plan(
      kFunction, "LeakyReluBackward", params,
      {{"gradOutput", gradOutput}, {"self", self}, {"out", out}}, workspaceSize,
      executor);
}

aclnnStatus aclnnLeakyReluBackward(void* workspace, uint64_t workspaceSize,
                                   aclOpExecutor* executor,
                                   aclrtStream stream) {
  return opserver::Launch("aclnnLeakyReluBackward", workspace, workspaceSize,
                          executor, stream);
}

aclnnStatus aclnnDropoutBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                 const aclTensor* mask,
                                                 double scale, aclTensor* out,
                                                 uint64_t* workspaceSize,
                                                 aclOpExecutor** executor) {
  opserver::v1::OpParams params;
  params.set_scale(scale);
  return opserver::Plan(
      "aclnnDropoutBackwardGetWorkspaceSize", "DropoutBackward", params,
      {{"gradOutput", gradOutput}, {"mask", mask}, {"out", out}}, workspaceSize,
      executor);
}

aclnnStatus aclnnDropoutBackward(void* workspace, uint64_t workspaceSize,
                                 aclOpExecutor* executor, aclrtStream stream) {
  return opserver::Launch("aclnnDropoutBackward", workspace, workspaceSize,
                          executor, stream);
}

}  // extern "C"
