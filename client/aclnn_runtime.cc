// The aclnn-compatible C API's runtime calls (acl/acl.h): init and
// finalize, the device and its contexts; streams and memory are in
// aclnn_memory.cc, tensors, scalars and executors in aclnn_objects.cc.
// Every call is forwarded to the opserver named by OPSERVER_ADDRESS
// through the C++ client; the operators are in aclnn_ops.cc.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
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
  // A data connection is kept for the next copy unless
  // OPSERVER_KEEP_DATA_CONNECTIONS=0 (ConnectOptions::keep_data_connections).
  ASSIGN_OR_RETURN(bool keep,
                   BoolFromEnv("OPSERVER_KEEP_DATA_CONNECTIONS", true));
  options.keep_data_connections = keep;
  // Async copies go as data_transfer commands unless
  // OPSERVER_PIPELINED_DATA_TRANSFERS=0
  // (ConnectOptions::pipelined_data_transfers).
  ASSIGN_OR_RETURN(bool pipelined,
                   BoolFromEnv("OPSERVER_PIPELINED_DATA_TRANSFERS", true));
  options.pipelined_data_transfers = pipelined;
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

// Where device `device_id`'s session is to be opened: its server (by index
// and address) and the server's own index of the device.
struct DeviceTarget {
  size_t server = 0;
  uint32_t local = 0;
  std::string address;
};

// The device's target when it has no live session (nullopt when it has
// one). A session the server lost is dropped here, with its server's
// connection (which may be waiting out a reconnection backoff).
absl::StatusOr<std::optional<DeviceTarget>> SessionToOpen(State& state,
                                                          const char* function,
                                                          int32_t device_id) {
  absl::MutexLock lock(&state.mu);
  ASSIGN_OR_RETURN(DeviceSlot * slot, CheckDevice(state, function, device_id));
  if (slot->session != nullptr) {
    if (slot->session->Lost().ok()) return std::optional<DeviceTarget>();
    state.DropSession(device_id).IgnoreError();
    state.servers[slot->server].client.reset();
  }
  return std::optional<DeviceTarget>(DeviceTarget{
      slot->server, slot->local, state.servers[slot->server].address});
}

// The target server's connection, made (without state.mu) when it has none.
absl::StatusOr<std::shared_ptr<Client>> ServerClient(
    State& state, const char* function, int32_t device_id,
    const DeviceTarget& target) {
  ConnectOptions options;
  {
    absl::MutexLock lock(&state.mu);
    if (std::shared_ptr<Client> client = state.servers[target.server].client) {
      return client;
    }
    options = state.security;
    options.connect_timeout = options.call_timeout = state.timeout;
    options.wait_timeout = state.sync_timeout;
    options.max_message_bytes = state.max_message_bytes;
  }
  auto connected = Client::Connect(target.address, options);
  if (!connected.ok()) {
    return WithAclError(
        absl::Status(connected.status().code(),
                     absl::StrCat(function, ": device ", device_id, ": ",
                                  connected.status().message(),
                                  " (set OPSERVER_ADDRESS=HOST:PORT)")),
        ACL_ERROR_RT_FAILURE);
  }
  return std::shared_ptr<Client>(*std::move(connected));
}

// Records the opened `session` as device `device_id`'s, unless another
// thread opened one meanwhile (theirs stays), and `client` as its server's
// connection when that has none.
absl::Status InstallSession(State& state, const char* function,
                            int32_t device_id, const DeviceTarget& target,
                            std::shared_ptr<Client> client,
                            std::unique_ptr<remote::Session> session) {
  absl::MutexLock lock(&state.mu);
  if (!state.initialized ||
      static_cast<size_t>(device_id) >= state.devices.size()) {
    return WithAclError(absl::FailedPreconditionError(absl::StrCat(
                            function, ": aclFinalize was called meanwhile")),
                        ACL_ERROR_UNINITIALIZE);
  }
  DeviceSlot& slot = state.devices[device_id];
  if (state.servers[target.server].client == nullptr) {
    state.servers[target.server].client = client;
  }
  state.servers[target.server].unreachable = absl::OkStatus();  // It is back.
  if (slot.session != nullptr) return absl::OkStatus();
  slot.client = std::move(client);
  slot.session = std::shared_ptr<remote::Session>(std::move(session));
  // The operator time-outs set before hold for it too (queued, no wait;
  // a session without the command channel has none, as
  // aclrtSetOpExecuteTimeOut said when they were set).
  if (state.op_execute_timeout_ms != 0 || state.op_wait_timeout_ms != 0) {
    slot.session
        ->SetOpTimeouts(state.op_execute_timeout_ms, state.op_wait_timeout_ms)
        .IgnoreError();
  }
  return absl::OkStatus();
}

// Opens device `device_id`'s session unless it has a live one, for
// `function` (aclrtSetDevice, aclrtCreateContext): a session the server
// lost (it restarted, or the network dropped) is replaced by a new one on
// a new connection, so a device whose server is back works again; its old
// handles are gone. The connection and the session are made without
// state.mu, so other threads' calls on other devices go on meanwhile.
absl::Status OpenDevice(State& state, const char* function, int32_t device_id) {
  ASSIGN_OR_RETURN(std::optional<DeviceTarget> target,
                   SessionToOpen(state, function, device_id));
  if (!target.has_value()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::shared_ptr<Client> client,
                   ServerClient(state, function, device_id, *target));
  auto session =
      client->CreateSession("aclnn_remote", /*attach=*/true, target->local);
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
                     target->address, "): ", session.status().message()));
  }
  return InstallSession(state, function, device_id, *target, std::move(client),
                        *std::move(session));
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

}  // extern "C"
