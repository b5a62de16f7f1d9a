// The state and helpers shared by the aclnn-compatible C API's two halves:
// the runtime calls (aclnn_runtime.cc) and the operator shims
// (aclnn_ops.cc). Internal to //client.
//
// Device pointers: each aclrtMalloc reserves a range of a fake address space
// (never dereferenced) and remembers the server buffer behind it, so a
// pointer anywhere inside an allocation resolves to (buffer, byte offset).
// Streams and executors are likewise opaque numbers that are never reused,
// so a stale or consumed handle is recognised instead of dereferenced.
#ifndef OPSERVER_CLIENT_ACLNN_STATE_H_
#define OPSERVER_CLIENT_ACLNN_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "client/client.h"
#include "client/device_addresses.h"

struct aclTensor {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  std::vector<int64_t> storage_shape;
  aclDataType dtype;
  aclFormat format;  // Kept and reported back (aclGetFormat); not used.
  int64_t offset;
  uintptr_t data;
};

struct aclScalar {
  aclDataType dtype;
  double value;
};

namespace opserver {

// Where the opaque stream and executor handles start (device addresses are
// DeviceAddressSpace's, below these).
inline constexpr uintptr_t kStreamBase = uintptr_t{0x20} << 40;
inline constexpr uintptr_t kExecutorBase = uintptr_t{0x30} << 40;

// The calling thread's last error, what aclGetRecentErrMsg returns. A
// function, not an extern thread_local, so the variable stays local to
// aclnn_state.cc (libaclnn_remote.so's dynamic symbols are the API's only).
std::string& LastError();

struct ExecutorEntry {
  remote::Executor executor;
};

// Everything between aclInit and aclFinalize.
// The client and session a call goes on with once it let go of State::mu,
// so that another thread's aclrtResetDevice or aclFinalize cannot destroy
// them under it. `client` is declared first so it outlives `session`, whose
// destructor calls through it.
struct Pinned {
  std::shared_ptr<Client> client;
  std::shared_ptr<remote::Session> session;
};

struct State {
  absl::Mutex mu;
  bool initialized = false;
  std::string address;
  absl::Duration timeout = absl::Seconds(5);
  absl::Duration sync_timeout = absl::Seconds(600);
  // TLS files, token and transfer connections from the environment
  // (timeouts are set on use).
  opserver::ConnectOptions security;
  uint64_t max_message_bytes = 64ull << 20;
  // Shared so that a long call (synchronize, a transfer) can run without
  // holding `mu`, keeping both alive even if another thread resets them.
  std::shared_ptr<Client> client;
  std::shared_ptr<opserver::remote::Session> session;
  // Both, for use after `mu` is released; call with `mu` held.
  Pinned Pin() const { return {client, session}; }
  // Kept across aclFinalize: a pointer from before must never name an
  // allocation made after the next aclInit.
  DeviceAddressSpace addresses;
  uint64_t next_stream = 1;
  std::map<uintptr_t, remote::Stream> streams;
  uint64_t next_executor = 1;
  std::map<uintptr_t, ExecutorEntry> executors;
  // aclrtMemcpyAsync device-to-host copies not yet waited for, by stream
  // handle: their bytes land when the stream is synchronized.
  std::map<uint64_t, std::vector<remote::PendingRead>> pending_reads;
  // aclrtMallocHost blocks and their sizes.
  std::map<void*, size_t> host_blocks;
  // aclrtGetSocName's answer, kept until aclFinalize.
  std::string soc_name;

  // Closes the session. What was queued is delivered first, and a deferred
  // error still pending is returned (a session the server no longer has
  // has nothing left to report: NOT_FOUND is not an error of the reset).
  absl::Status DropSession();
};

State& GetState();

// Records `message` as the thread's last error and returns `code`.
template <typename Code>
Code Fail(Code code, absl::string_view message) {
  LastError() = std::string(message);
  return code;
}

aclError AclErrorOf(const absl::Status& status);
aclError FailAcl(const absl::Status& status);
aclnnStatus FailAclnn(const absl::Status& status);

// The session, or an error saying which call was missing.
absl::StatusOr<remote::Session*> SessionOf(State& state);

aclError SessionError(const absl::Status& status);

using DeviceRange = DeviceAddressSpace::Range;

absl::StatusOr<DeviceRange> Resolve(State& state, const void* pointer,
                                    absl::string_view what);

absl::StatusOr<uint64_t> StreamHandle(State& state, aclrtStream stream);

// What aclrtMemcpy and aclrtMemcpyAsync (`function`) check before anything
// is resolved: NULL pointers, `count` over `destMax`, an unknown kind.
// ACL_SUCCESS, else the error (recorded).
aclError CheckCopyArguments(const char* function, const void* dst,
                            size_t destMax, const void* src, size_t count,
                            aclrtMemcpyKind kind);

// Under `state.mu`: the device ranges a copy of `count` bytes of `kind`
// reads (`from`, for a device source) and writes (`to`, for a device
// destination), each within one allocation.
absl::Status ResolveCopy(State& state, const char* function, const void* dst,
                         const void* src, size_t count, aclrtMemcpyKind kind,
                         DeviceRange* from, DeviceRange* to);

// Waits for the aclrtMemcpyAsync reads queued on stream `handle` (every
// stream's when `handle` is nullopt) and returns the first error; call
// without `state.mu` (it is taken to collect them). A read's error is its
// stream's deferred error, which the read consumed: the caller reports it.
absl::Status WaitPendingReads(State& state, std::optional<uint64_t> handle);

absl::StatusOr<remote::TensorDesc> ToDesc(State& state, const aclTensor* tensor,
                                          absl::string_view name);

aclOpExecutor* AddExecutor(State& state, remote::Executor executor);

// Phase one of every operator: nullptr checks, descriptors, the call. The
// call runs without `state.mu`, so one thread's slow call does not stop the
// others.
aclnnStatus Plan(const char* function, const std::string& op,
                 const v1::OpParams& params,
                 std::vector<std::pair<const char*, const aclTensor*>> tensors,
                 uint64_t* workspace_size, aclOpExecutor** executor);

// Phase two of every operator.
aclnnStatus Launch(const char* function, void* workspace,
                   uint64_t workspace_size, aclOpExecutor* executor,
                   aclrtStream stream);

}  // namespace opserver

#endif  // OPSERVER_CLIENT_ACLNN_STATE_H_
