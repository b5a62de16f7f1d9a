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
#include <thread>
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
#include "client/etcd_pool.h"

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

// Where the opaque stream, executor, context and event handles start
// (device addresses are DeviceAddressSpace's, below these).
inline constexpr uintptr_t kStreamBase = uintptr_t{0x20} << 40;
inline constexpr uintptr_t kExecutorBase = uintptr_t{0x30} << 40;
inline constexpr uintptr_t kContextBase = uintptr_t{0x40} << 40;
inline constexpr uintptr_t kEventBase = uintptr_t{0x50} << 40;
inline constexpr uintptr_t kModelBase = uintptr_t{0x60} << 40;

// The calling thread's last error, what aclGetRecentErrMsg returns. A
// function, not an extern thread_local, so the variable stays local to
// aclnn_state.cc (libaclnn_remote.so's dynamic symbols are the API's only).
std::string& LastError();
// The calling thread's last failed call's code (aclrtPeekAtLastError,
// aclrtGetLastError); ACL_SUCCESS when none.
int& LastErrorCode();

// The calling thread's current context (aclrtSetDevice,
// aclrtSetCurrentContext, aclrtCreateContext); 0: none. A handle, looked
// up on use, so a context destroyed by another thread is recognised.
uintptr_t& CurrentContext();

// An error that carries the exact aclError to return for it (AclErrorOf
// prefers it to the mapping from the canonical code).
absl::Status WithAclError(absl::Status status, aclError code);

// `status` with `prefix` before its message, payloads (the aclError, the
// aclnn status) kept.
absl::Status Prefixed(const absl::Status& status, absl::string_view prefix);

// One opserver of OPSERVER_ADDRESS's list.
struct ServerSlot {
  std::string address;
  // Connected on first use; replaced when a lost device reconnects.
  std::shared_ptr<Client> client;
  // Its device count, learned once: device ordinals count the servers'
  // devices in the order the servers are listed, so they never change.
  std::optional<uint32_t> devices;
  // Why it could not be reached when its devices were counted (OK: it
  // was). Such a server counts as one device, whose aclrtSetDevice tries
  // it again and fails naming it while it stays down: one dead host of a
  // list does not stop the jobs on the others.
  absl::Status unreachable;
};

// One device ordinal: device `local` of server `server`.
struct DeviceSlot {
  size_t server = 0;
  uint32_t local = 0;
  // The session aclrtSetDevice (or aclrtCreateContext) opened on it, and
  // the client it was made on (which must outlive it). Null when the
  // device is not set or was reset.
  std::shared_ptr<Client> client;
  std::shared_ptr<remote::Session> session;
  // The default context aclrtSetDevice binds threads to (0: none yet).
  uintptr_t default_context = 0;
  // aclrtGetSocName's answer, kept until aclFinalize.
  std::string soc_name;
  // aclrtSetDeviceSatMode's mode (aclrtFloatOverflowMode), kept only.
  int sat_mode = 1;  // ACL_RT_OVERFLOW_MODE_INFNAN
};

struct ContextEntry {
  uint32_t device = 0;
  bool is_default = false;
};

struct StreamEntry {
  uint32_t device = 0;
  remote::Stream stream;
};

struct ExecutorEntry {
  uint32_t device = 0;
  remote::Executor executor;
  // The operator it plans (aclmdlRIDebugJsonPrint names launches by it).
  std::string op;
};

struct EventEntry {
  uint32_t device = 0;
  uint64_t handle = 0;  // The server's event handle in the device's session.
};

// The client and session a call goes on with once it let go of State::mu,
// so that another thread's aclrtResetDevice or aclFinalize cannot destroy
// them under it. `client` is declared first so it outlives `session`, whose
// destructor calls through it.
struct Pinned {
  std::shared_ptr<Client> client;
  std::shared_ptr<remote::Session> session;
  uint32_t device = 0;
  std::string address;
  // `status` with the device and its server named when it is the
  // connection's or the session's error (unavailable, deadline, lost), so
  // an error of a call on one device says which server failed it; other
  // errors are returned as they are.
  absl::Status Named(const absl::Status& status) const;
};

// One capture sequence (aclmdlRICaptureBegin to End): what was recorded
// instead of sent. Its streams are the one it began on and those that
// joined it by waiting on an event recorded in it (fork); see
// docs/graphs.md.
struct Capture {
  uint32_t device = 0;
  uintptr_t origin = 0;  // The stream Begin was called on.
  aclmdlRICaptureMode mode = ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;  // The thread that began it.
  uintptr_t model = 0;     // The aclmdlRI GetInfo and End return.
  // Why it was invalidated (OK: it was not).
  absl::Status invalidated;
  // The recorded tasks, in order, and the operator of each launch (empty
  // for other tasks).
  std::vector<v1::PipelineCommand> tasks;
  std::vector<std::string> ops;
  // The executors its launches consumed: released once the server took
  // them into the graph, destroyed when it did not.
  std::vector<remote::Executor> executors;
  // By stream key: tasks recorded on it so far, and the count at which
  // another stream of the capture last waited on an event it recorded
  // (joined back when the two are equal).
  std::map<uintptr_t, uint64_t> work;
  std::map<uintptr_t, uint64_t> joined_at;
  // By event handle: the stream that recorded it in this capture, and that
  // stream's task count then.
  std::map<uint64_t, std::pair<uintptr_t, uint64_t>> recorded;
};

// A model (aclmdlRI) once its capture ended: a graph of its device's
// session.
struct ModelEntry {
  // Its device's session owns the graph (models die with it: DropCaptures).
  uint32_t device = 0;
  uint64_t graph = 0;
  std::vector<v1::PipelineCommand> tasks;  // For aclmdlRIDebugJsonPrint.
  std::vector<std::string> ops;
};

// Everything between aclInit and aclFinalize.
struct State {
  absl::Mutex mu;
  bool initialized = false;
  // OPSERVER_ADDRESS as given (a comma-separated list).
  std::string address;
  std::vector<ServerSlot> servers;
  // One per ordinal learned so far (see ServerSlot::devices).
  std::vector<DeviceSlot> devices;
  // OPSERVER_ADDRESS=etcd://...'s claim (OPSERVER_CLAIM), held until
  // aclFinalize; null without one (JoinPool).
  std::unique_ptr<PoolClaim> claim;
  absl::Duration timeout = absl::Seconds(5);
  absl::Duration sync_timeout = absl::Seconds(600);
  // TLS files, token and transfer connections from the environment
  // (timeouts are set on use).
  opserver::ConnectOptions security;
  uint64_t max_message_bytes = 64ull << 20;
  // Kept across aclFinalize: a pointer from before must never name an
  // allocation made after the next aclInit.
  DeviceAddressSpace addresses;
  uint64_t next_stream = 1;
  std::map<uintptr_t, StreamEntry> streams;
  uint64_t next_executor = 1;
  std::map<uintptr_t, ExecutorEntry> executors;
  uint64_t next_context = 1;
  std::map<uintptr_t, ContextEntry> contexts;
  uint64_t next_event = 1;
  std::map<uintptr_t, EventEntry> events;
  // aclrtMemcpyAsync device-to-host copies not yet waited for, by device
  // and stream handle: their bytes land when the stream is synchronized.
  std::map<std::pair<uint32_t, uint64_t>, std::vector<remote::PendingRead>>
      pending_reads;
  // Large aclrtMemcpyAsync copies from or into aclrtMallocHost memory
  // whose bytes may still be moving (Session::UploadAsync, DownloadAsync):
  // waited for with the reads of their stream, and by aclrtFreeHost of
  // their block, by its start (which leaves their status for the
  // synchronize).
  struct BlockCopy {
    uint32_t device;
    uint64_t stream;
    uintptr_t block;
    remote::PendingRead copy;
  };
  std::vector<BlockCopy> block_copies;
  // aclrtMallocHost blocks and their sizes.
  std::map<void*, size_t> host_blocks;
  // Captures by model handle, the capture each capturing stream is in (by
  // stream key), and models whose capture ended.
  uint64_t next_model = 1;
  std::map<uintptr_t, std::shared_ptr<Capture>> captures;
  std::map<uintptr_t, uintptr_t> capturing;
  std::map<uintptr_t, ModelEntry> models;
  // aclrtSetOpExecuteTimeOut and aclrtSetOpWaitTimeout, in milliseconds
  // (0: none): sent to every device session open now and opened later.
  uint64_t op_execute_timeout_ms = 0;
  uint64_t op_wait_timeout_ms = 0;

  // The slot of device `ordinal`, learning the device counts of the
  // servers listed before it (connecting to them) as needed.
  // ACL_ERROR_INVALID_DEVICE past the last device; the connection's error
  // (naming the server) when a server it must ask cannot be reached.
  absl::StatusOr<DeviceSlot*> Device(int64_t ordinal);
  // The total over every server (connecting to each); a server that cannot
  // be reached counts as one device (ServerSlot::unreachable). The error
  // of the first server when none can be reached.
  absl::StatusOr<uint32_t> DeviceCount();
  // Lists the devices of the first server not asked yet (connecting to
  // it) and appends their slots (one for a server that cannot be reached,
  // its ServerSlot::unreachable set); false when every server was asked.
  // Other errors (a bad TLS file, a server's refusal) are returned.
  absl::StatusOr<bool> LearnNextServer();
  // The client of server `index`, connected now if it is not.
  absl::StatusOr<std::shared_ptr<Client>> Connect(size_t index);
  // Both, for use after `mu` is released; call with `mu` held.
  Pinned Pin(uint32_t device) const;

  // Closes device `device`'s session and forgets its handles (what was
  // queued is delivered first, and a deferred error still pending is
  // returned; a session the server no longer has has nothing left to
  // report: NOT_FOUND is not an error of the reset).
  absl::Status DropSession(uint32_t device);
};

// OPSERVER_ADDRESS=etcd://HOST:PORT/PREFIX (client/etcd_pool.h): fills
// `servers` and `devices` with the registered devices, or with
// OPSERVER_CLAIM=N the N devices it claims (kept in `claim`), every
// server's device count known, so that ordinals never ask etcd again.
absl::Status JoinPool(State& state);

State& GetState();

// Records `message` as the thread's last error and returns `code`.
template <typename Code>
Code Fail(Code code, absl::string_view message) {
  LastError() = std::string(message);
  // 0: a constructor's failure (it returns NULL, not a code).
  if (code != 0) LastErrorCode() = static_cast<int>(code);
  return code;
}

aclError AclErrorOf(const absl::Status& status);
aclError FailAcl(const absl::Status& status);
aclnnStatus FailAclnn(const absl::Status& status);

// The device of the calling thread's current context, with a session:
// ACL_ERROR_UNINITIALIZE before aclInit, ACL_ERROR_RT_CONTEXT_NULL for a
// thread with no context (or whose device was reset), and NOT_FOUND for a
// session the server lost. Call with `state.mu` held.
absl::StatusOr<uint32_t> CurrentDevice(State& state);
// The same, pinned for a call made after `state.mu` is released.
absl::StatusOr<Pinned> PinCurrent(State& state);
// Whether device `device` still has the session `pinned` was made on (it
// was not reset meanwhile). Call with `state.mu` held.
bool StillCurrent(const State& state, const Pinned& pinned);

aclError SessionError(const absl::Status& status);

using DeviceRange = DeviceAddressSpace::Range;

absl::StatusOr<DeviceRange> Resolve(State& state, const void* pointer,
                                    absl::string_view what);

// The server handle of `stream` (0, the default stream, for NULL), which
// must be on device `device`: ACL_ERROR_RT_STREAM_CONTEXT otherwise.
absl::StatusOr<uint64_t> StreamHandle(State& state, aclrtStream stream,
                                      uint32_t device);

// The stream `stream` (NULL: the current context's default stream) of
// `function`, pinned: a created stream is usable from any thread, as
// aclrtSynchronizeStream's. The error to return otherwise (recorded by the
// caller). Call without `state.mu`.
struct PinnedStream {
  Pinned pinned;
  uint64_t handle = 0;
};
absl::StatusOr<PinnedStream> PinStreamOf(State& state, const char* function,
                                         aclrtStream stream);

// Host callbacks (aclnn_callbacks.cc): aclFinalize calls this first,
// without `state.mu`: it stops the library's host-function thread (after
// the function it runs now) and forgets every subscription and every
// callback not yet run.
void EndHostCallbacks();

// A stream's deferred error collected from device `device`'s session
// (a status naming its stream: common/task_position.h) is handed to the
// exception callback (aclrtSetExceptionInfoCallback), if one is set, on
// the calling thread; any other status is ignored. Call once per collected
// status, without `state.mu` (aclnn_exceptions.cc).
void ReportDeferred(uint32_t device, const absl::Status& status);

// What aclrtMemcpy and aclrtMemcpyAsync (`function`) check before anything
// is resolved: NULL pointers, `count` over `destMax`, an unknown kind.
// ACL_SUCCESS, else the error (recorded).
aclError CheckCopyArguments(const char* function, const void* dst,
                            size_t destMax, const void* src, size_t count,
                            aclrtMemcpyKind kind);

// Under `state.mu`: the device ranges a copy of `count` bytes of `kind`
// reads (`from`, for a device source) and writes (`to`, for a device
// destination), each within one allocation (on any device: the caller
// checks which).
absl::Status ResolveCopy(State& state, const char* function, const void* dst,
                         const void* src, size_t count, aclrtMemcpyKind kind,
                         DeviceRange* from, DeviceRange* to);

// Waits for the aclrtMemcpyAsync reads and page-locked uploads queued on
// stream `handle` of device `device` (every stream's of it when `handle` is
// nullopt) and returns the first error; call without `state.mu` (it is
// taken to collect them). A read's error is its stream's deferred error,
// which the read consumed: the caller reports it.
absl::Status WaitPendingReads(State& state, uint32_t device,
                              std::optional<uint64_t> handle);

// The descriptor of `tensor`, whose data must be on device `device`.
absl::StatusOr<remote::TensorDesc> ToDesc(State& state, const aclTensor* tensor,
                                          absl::string_view name,
                                          uint32_t device);

aclOpExecutor* AddExecutor(State& state, uint32_t device,
                           remote::Executor executor, std::string op);

// ---- Capture (client/aclnn_graph.cc has the aclmdlRI calls) ----

// The calling thread's capture mode (aclmdlRICaptureThreadExchangeMode).
aclmdlRICaptureMode& ThreadCaptureMode();

// The capture `stream` is in (begun on it or joined), or null. Under
// `state.mu`.
Capture* CaptureOf(State& state, aclrtStream stream);

// Records `task` (a launch, memset, copy, record or wait command whose
// stream is the captured stream's handle) in `capture`, on stream `key`.
void Record(Capture& capture, uintptr_t key, v1::PipelineCommand task,
            std::string op = "");

// Marks `capture` invalidated by `why` (the first reason stays) and
// returns `why`, for a call refused during it.
absl::Status Invalidate(Capture& capture, absl::Status why);

// `function` may not be called while `stream` is capturing (a synchronize,
// a query, a destroy): ACL_ERROR_RT_STREAM_CAPTURED, invalidating the
// capture; OK when it is not capturing. Under `state.mu`.
absl::Status RefuseIfCapturing(State& state, const char* function,
                               aclrtStream stream);

// The capture (not ended) that recorded event `handle` of device
// `device`, or null. Under `state.mu`.
Capture* CaptureRecording(State& state, uint32_t device, uint64_t handle);

// `function` (a query or synchronize of the event) is refused while a
// capture recorded the event: its record was never sent, so it completes
// only in a replay. ACL_ERROR_RT_EVENT_CAPTURED, invalidating the capture;
// OK otherwise. Under `state.mu`.
absl::Status RefuseIfEventCaptured(State& state, const char* function,
                                   uint32_t device, uint64_t handle);

// An unsafe call (synchronous copies and memsets, device synchronizes)
// while captures are going on: allowed or not by the calling thread's mode
// and the captures' modes, as CANN rules (docs/graphs.md).
// ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT when not, invalidating the
// captures that forbid it. Takes `state.mu`.
absl::Status CheckUnsafeCall(State& state, const char* function);

// Forgets the captures and models of device `device` (its session is
// going: their graphs and executors die with it). Under `state.mu`.
void DropCaptures(State& state, uint32_t device);

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
