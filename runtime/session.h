#ifndef OPSERVER_RUNTIME_SESSION_H_
#define OPSERVER_RUNTIME_SESSION_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "devices/device.h"
#include "runtime/event.h"
#include "runtime/host_callbacks.h"
#include "runtime/memory_charge.h"
#include "runtime/observer.h"
#include "runtime/stream.h"

namespace opserver {

class Graph;

// Limits on what clients may hold; each is a server flag.
struct SessionLimits {
  uint64_t session_memory_bytes = 16ull << 30;
  uint32_t max_sessions = 64;
  uint32_t max_handles_per_session = 65536;
  // Each stream owns a thread, hence a much smaller limit than for handles.
  // Destroyed streams count until their thread is gone.
  uint32_t max_streams_per_session = 16;
  // Launches waiting on one stream (each holds its executor's buffers).
  uint32_t max_queued_per_stream = 16384;
  // Elements one launch may compute: bounds the time one launch holds a
  // stream (and teardown or shutdown waiting for it); ~1-2 s at 2^31.
  uint64_t max_launch_elements = 1ull << 31;
  // ExecuteStream replies waiting for a client that does not read them;
  // reading stops at this many.
  uint32_t max_pending_replies = 1024;
  // Evaluate calls computing at once (they need no session); more are
  // RESOURCE_EXHAUSTED.
  uint32_t max_concurrent_evaluates = 4;
  // Operators.Pipeline: channels open on one session, and what one batch
  // (one PipelineRequest) may hold. A batch is parsed and applied on the
  // server's workers, so these bound the memory and the time one message
  // can cost: a parsed batch takes about 15 times its wire size.
  uint32_t max_pipelines_per_session = 8;
  uint64_t max_pipeline_batch_bytes = 4ull << 20;
  uint32_t max_pipeline_batch_commands = 65536;
  // Attach calls open on one session (the documented use is one, tying the
  // session to a process); each holds a call's state on the server.
  uint32_t max_attach_per_session = 4;
  // SynchronizeStream and SynchronizeEvent calls waiting on one session:
  // each holds a call's state (about 12 KiB) until answered, far more than
  // the event budget's unit, so they have a much smaller limit of their
  // own. A call cancelled or past its deadline stops counting at once.
  uint32_t max_pending_synchronizes_per_session = 256;
  // Graphs (runtime/graph.h) defined and not destroyed on one session, and
  // their tasks together: each task holds a prepared plan or a write's
  // bytes, charged to the session's memory as well.
  uint32_t max_graphs_per_session = 64;
  uint64_t max_graph_tasks_per_session = 65536;
  absl::Duration idle_timeout = absl::Minutes(5);
  // How long a blocking host callback may hold its stream after the server
  // told the client it was reached (runtime/host_callbacks.h).
  absl::Duration callback_block_timeout = absl::Seconds(60);
  // Per owner identity (a token's tenant, a client certificate), so one
  // tenant cannot starve the others; 0 = no limit beyond the ones above.
  uint32_t max_sessions_per_tenant = 0;
  uint64_t tenant_memory_bytes = 0;
};

// What one owner identity holds across its sessions.
struct TenantUsage {
  // Device memory reserved by its sessions' buffers.
  std::atomic<uint64_t> bytes{0};
  // Open sessions; guarded by the SessionManager's mutex.
  uint32_t sessions = 0;
};

// CreateSession's client_name is for logs and stats: at most this long.
inline constexpr size_t kMaxClientNameBytes = 256;

// Errors the server keeps for a client until they are reported (a Pipeline
// channel's deferred errors, refused plans) are cut to this many bytes:
// they may quote what the client sent, such as an op name of megabytes.
inline constexpr size_t kMaxKeptErrorBytes = 1024;

// Accounting of device memory held by buffers: one per device, each
// counting into the server-wide one (its `parent`), so the totals and the
// per-device figures cannot disagree.
struct MemoryAccounting {
  explicit MemoryAccounting(MemoryAccounting* parent = nullptr)
      : parent(parent) {}
  // Adds (or, with `sign` -1, removes) one buffer of `size` bytes here and
  // in every parent.
  void Add(uint64_t size, int sign);

  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> buffers{0};
  MemoryAccounting* const parent;
};

// A block of device memory. Shared by the session's handle table and by any
// queued work that uses it, so freeing a buffer that queued work still needs
// releases the memory only after that work ran. `charged` bytes are taken
// from `session_bytes` and `tenant_bytes` until then: a session's (and its
// owner's) memory is refunded only when it is really released, not when its
// handle is freed.
class Buffer {
 public:
  Buffer(Device* device, void* data, uint64_t size, MemoryAccounting* account,
         std::shared_ptr<std::atomic<uint64_t>> session_bytes = nullptr,
         uint64_t charged = 0,
         std::shared_ptr<std::atomic<uint64_t>> tenant_bytes = nullptr);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The device the memory is on (its session's): transfers address and
  // copy it through this one.
  Device* device() const { return device_; }
  // Its handle was freed (Session::Free): work that still holds the memory
  // may finish, but a graph replayed after this refuses to run on it.
  void MarkFreed() { freed_.store(true, std::memory_order_relaxed); }
  bool freed() const { return freed_.load(std::memory_order_relaxed); }

 private:
  Device* const device_;
  void* const data_;
  const uint64_t size_;
  MemoryAccounting* const account_;
  const std::shared_ptr<std::atomic<uint64_t>> session_bytes_;
  const uint64_t charged_;
  const std::shared_ptr<std::atomic<uint64_t>> tenant_bytes_;
  std::atomic<bool> freed_{false};
};

// A planned operator (aclOpExecutor): the plan the session's device
// prepared and the buffers its tensors live in, kept alive for as long as
// the executor or a launch of it.
struct Executor {
  std::unique_ptr<DevicePlan> plan;
  std::vector<std::shared_ptr<Buffer>> buffers;
};

// Executor ids a client chooses (Pipeline) start here; the server's own
// handles count up from 1 and never get near it.
inline constexpr uint64_t kClientExecutorBase = uint64_t{1} << 62;

// Handles are session-local, unique across kinds, never reused.
struct SessionStatsSnapshot {
  uint64_t buffers = 0;
  uint64_t buffer_bytes = 0;
  uint64_t streams = 0;  // Besides the default stream.
  uint64_t executors = 0;
  uint64_t events = 0;
  // What the session's EventBudget holds (see runtime/event.h).
  uint64_t pending_event_operations = 0;
  uint64_t attach_streams = 0;
  uint64_t pending_synchronizes = 0;
  uint64_t graphs = 0;
  uint64_t graph_tasks = 0;
};

// One unit of a count a session bounds (its open Attach calls, its
// pending synchronizes), held by the call that took it and given back when
// destroyed, with the call's state charged to the session's memory
// (kCallStateBytes) meanwhile. It shares only the counters, not the
// session, so a call that outlives its session keeps no session memory
// alive. Move-only.
class SessionSlot {
 public:
  SessionSlot() = default;
  SessionSlot(std::shared_ptr<std::atomic<uint64_t>> count,
              MemoryCharge charge)
      : count_(std::move(count)), charge_(std::move(charge)) {}
  SessionSlot(SessionSlot&& other) = default;
  SessionSlot& operator=(SessionSlot&& other) {
    Give();
    count_ = std::move(other.count_);
    charge_ = std::move(other.charge_);
    return *this;
  }
  ~SessionSlot() { Give(); }

 private:
  void Give() {
    if (count_ != nullptr) count_->fetch_sub(1);
    count_ = nullptr;
    charge_ = MemoryCharge();
  }
  std::shared_ptr<std::atomic<uint64_t>> count_;
  MemoryCharge charge_;
};

// Everything one client owns. Thread-safe. Lookups of another session's
// handle fail exactly like unknown handles: sessions cannot see each other.
class Session {
 public:
  // `serial` tags the session's device memory (Device::Allocate's owner).
  // `owner` is the identity that created it (see CallerIdentity); `tenant`
  // accounts its memory against --tenant_memory_bytes. Every stream's
  // device stream comes from `device->CreateStream()`; the default
  // stream's is `default_device_stream`, which SessionManager creates first
  // so that a device out of streams fails CreateSession cleanly. Left null,
  // the session creates it here, and a failure (or a null `device`, for
  // tests of the handle tables) leaves the default stream host-only:
  // launches on it fail. `device_index` is `device`'s number on the server
  // (SessionManager's list), for stats; `account` is that device's.
  Session(std::string id, uint64_t serial, std::string client_name,
          Device* device, const SessionLimits* limits,
          MemoryAccounting* account,
          std::shared_ptr<StreamThreads> manager_threads,
          std::string owner = "anonymous",
          std::shared_ptr<TenantUsage> tenant = nullptr,
          std::unique_ptr<DeviceStream> default_device_stream = nullptr,
          uint32_t device_index = 0);
  // Cancels the streams' queued work (it does not wait for running work),
  // then drops the handles.
  ~Session();

  const std::string& id() const { return id_; }
  const std::string& client_name() const { return client_name_; }
  const std::string& owner() const { return owner_; }
  // The device everything of this session runs on (buffers, streams,
  // launches, transfers), and its index on the server.
  Device* device() const { return device_; }
  uint32_t device_index() const { return device_index_; }
  const SessionLimits& limits() const { return *limits_; }
  // Who watches the runtime: the server's metrics (null in tests that make
  // sessions by hand).
  RuntimeObserver* observer() const { return observer_; }
  void set_observer(RuntimeObserver* observer) { observer_ = observer; }
  // The routing key (common/session_routing.h) the session was created
  // with; empty when CreateSession carried none. Set before the session is
  // listed, never after.
  const std::string& routing_key() const { return routing_key_; }
  void set_routing_key(std::string key) { routing_key_ = std::move(key); }
  // The WorkPool owner of this session's heavy requests (Pipeline batches,
  // large Mallocs): they share one turn, whichever call made them.
  std::string work_owner() const { return absl::StrCat("session:", id_); }

  // Drops the work queued on every stream; later launches fail. For Close.
  void CancelWork();
  // True while any stream has work queued or running, or a Malloc is
  // allocating: such a session is in use even when no call names it.
  bool Busy() const;

  // RESOURCE_EXHAUSTED past the session's memory or handle limit, or its
  // owner's memory limit (memory of freed buffers that queued work or
  // executors still hold counts against both).
  absl::StatusOr<uint64_t> Malloc(uint64_t size);
  absl::Status Free(uint64_t buffer);
  absl::StatusOr<std::shared_ptr<Buffer>> GetBuffer(uint64_t buffer) const;

  // A new stream on a new device stream (Device::CreateStream, whose error
  // is returned as is). RESOURCE_EXHAUSTED past --max_streams_per_session.
  absl::StatusOr<uint64_t> CreateStream();
  // Removes the stream; the caller destroys it (which drains it) off the RPC
  // thread. Stream 0 cannot be destroyed.
  absl::StatusOr<std::shared_ptr<Stream>> TakeStream(uint64_t stream);
  // 0 is the default stream.
  absl::StatusOr<std::shared_ptr<Stream>> GetStream(uint64_t stream) const;
  // The default stream and every created one.
  std::vector<std::shared_ptr<Stream>> AllStreams() const;

  // aclrtSetOpExecuteTimeOut and aclrtSetOpWaitTimeout (OpTimeoutsCommand),
  // in milliseconds (0: none): every stream's tasks from now on
  // (Stream::SetTaskTimeout), and the waits on events queued from now on
  // (op_wait_timeout()). INVALID_ARGUMENT above kMaxOpTimeoutMs, changing
  // nothing.
  absl::Status SetOpTimeouts(uint64_t execute_ms, uint64_t wait_ms);
  absl::Duration op_wait_timeout() const;

  absl::StatusOr<uint64_t> AddExecutor(std::shared_ptr<Executor> executor);
  // The same under `handle`, an id the client chose (Pipeline's plans): at
  // least kClientExecutorBase and larger than every id it chose before, so
  // ids are never reused and never meet the server's own. 161002 otherwise.
  absl::Status AddExecutorAs(uint64_t handle,
                             std::shared_ptr<Executor> executor);
  // For a launch: with `consume`, a single-use executor is removed (a
  // repeatable one stays); without, it is only looked up. Unknown or consumed
  // executors fail with aclnn 561103. `*consumed` (if given) says whether
  // this call removed it.
  // `*repeatable` (if given) says whether it is repeatable.
  absl::StatusOr<std::shared_ptr<Executor>> ExecutorForLaunch(
      uint64_t executor, bool consume, bool* consumed = nullptr,
      bool* repeatable = nullptr);
  // Queues executor `handle` on `stream` as the task `make_task` makes of it
  // (Stream::Enqueue's `inline_if_idle`), consuming a single-use executor.
  // A launch the stream refuses leaves the executor as it was, also when the
  // stream filled up, was destroyed or lost its session after the room
  // check and the executor was already taken (other calls race for the
  // stream): it is put back then.
  absl::Status Launch(
      uint64_t handle, Stream& stream, bool inline_if_idle,
      const std::function<Stream::Task(std::shared_ptr<Executor>)>& make_task);
  absl::Status SetExecutorRepeatable(uint64_t executor);
  absl::Status DestroyExecutor(uint64_t executor);

  // Graphs (runtime/graph.h), stored here so they end with the session.
  // AddGraph takes `graph` under `id` (the rules of AddExecutorAs, sharing
  // its counter), within --max_graphs_per_session and
  // --max_graph_tasks_per_session (RESOURCE_EXHAUSTED), and consumes the
  // single-use executors `consume` names (FAILED_PRECONDITION, and nothing
  // consumed, when one is gone meanwhile). All or nothing.
  absl::Status AddGraph(uint64_t id, std::shared_ptr<Graph> graph,
                        uint64_t tasks, const std::vector<uint64_t>& consume);
  // NOT_FOUND like any unknown handle.
  absl::StatusOr<std::shared_ptr<Graph>> GetGraph(uint64_t id) const;
  // Removes graph `id` from the session; replays queued keep it until they
  // ran (they hold it).
  absl::Status DestroyGraph(uint64_t id);
  // Every graph, by increasing id.
  std::vector<std::pair<uint64_t, std::shared_ptr<Graph>>> AllGraphs() const;
  // `bytes` of the session's memory (--session_memory_bytes) for what the
  // server keeps for it besides buffers (a graph's plans and bytes), held
  // until the charge is destroyed. RESOURCE_EXHAUSTED naming `what`.
  absl::StatusOr<MemoryCharge> ChargeMemory(uint64_t bytes,
                                            absl::string_view what);
  // The handle of each live buffer, by its object.
  absl::flat_hash_map<const Buffer*, uint64_t> BufferHandles() const;

  // Pipeline plans the server refused, under the id the client chose for
  // them, until that id is destroyed or the session ends. They count as
  // handles (--max_handles_per_session), and `error` is kept truncated, so a
  // client cannot grow the server with refused plans. RESOURCE_EXHAUSTED
  // past the handle limit, ALREADY_EXISTS when `id` is refused already.
  absl::Status AddRefusedPlan(uint64_t id, absl::Status error);
  // The error of refused plan `id`, if it is one; with `launch`, it counts
  // as reported (its launch's stream reports it).
  std::optional<absl::Status> RefusedPlan(uint64_t id, bool launch);
  // Removes refused plan `id`. nullopt if it is not one; else OK if its
  // error was reported already, or the error, which the caller reports.
  std::optional<absl::Status> TakeRefusedPlan(uint64_t id);
  // The error of the first refused plan not yet reported (OK if none),
  // which counts as reported now: a session fence reports it.
  absl::Status TakeUnreportedRefusal();

  // Events (runtime/event.h), handles like the others: counted against
  // --max_handles_per_session, never reused. `flags` must pass
  // CheckEventFlags (INVALID_ARGUMENT otherwise).
  absl::StatusOr<uint64_t> CreateEvent(uint32_t flags);
  // The same under `id`, an id the client chose (Pipeline's create_event),
  // under the rules of AddExecutorAs and sharing its counter, so a client's
  // ids are unique across kinds: INVALID_ARGUMENT unless `id` is at least
  // kClientExecutorBase and larger than every id the session chose before.
  absl::Status CreateEventAs(uint64_t id, uint32_t flags);
  // NOT_FOUND like any unknown handle.
  absl::StatusOr<std::shared_ptr<Event>> GetEvent(uint64_t event) const;
  // Removes the event and releases its waiters (Event::Destroy); records
  // and resets still queued do nothing when reached.
  absl::Status DestroyEvent(uint64_t event);

  // Pipeline channels on this session. `on_close` runs once, when the
  // session's work is cancelled (CloseSession, the idle timeout, shutdown),
  // so a channel ends then, whether or not its client reads. The channel
  // calls CloseChannel when it ends first. RESOURCE_EXHAUSTED past
  // --max_pipelines_per_session; CANCELLED after the session's work was
  // cancelled.
  absl::StatusOr<uint64_t> OpenChannel(std::function<void()> on_close);
  void CloseChannel(uint64_t channel);

  SessionStatsSnapshot Stats() const;

  // The session's host callbacks (CallbackCommand).
  HostCallbacks& callbacks() { return callbacks_; }

  // A slot for an Attach call, held for as long as the call is open.
  // RESOURCE_EXHAUSTED past --max_attach_per_session.
  absl::StatusOr<SessionSlot> TakeAttachSlot();
  // A slot for a SynchronizeStream or SynchronizeEvent call, held until it
  // is answered or cancelled. RESOURCE_EXHAUSTED past
  // --max_pending_synchronizes_per_session.
  absl::StatusOr<SessionSlot> TakeSynchronizeSlot();
  // A stream of the session and a synchronize slot (TakeSynchronizeSlot)
  // for a call that waits on it: SynchronizeStream's and LaunchCallback's
  // lookup, in one place. NOT_FOUND for a stream the session does not have
  // (no slot is taken then), else TakeSynchronizeSlot's refusal.
  struct StreamSlot {
    std::shared_ptr<Stream> stream;
    SessionSlot slot;
  };
  absl::StatusOr<StreamSlot> TakeStreamSynchronizeSlot(uint64_t stream);

  // Idle bookkeeping for the manager.
  void Touch();
  absl::Time last_used() const;
  // An Attach call holds a slot (TakeAttachSlot): such a session ends with
  // its calls, not by the idle timeout.
  bool attached() const;

 private:
  uint64_t HandleCountLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckHandleLimitLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UnknownHandle(absl::string_view kind, uint64_t handle) const;
  // Whether `executor` was handed out (by AddExecutor or AddExecutorAs).
  bool IssuedExecutorLocked(uint64_t executor) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckExecutorLimitLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `id` as the session's latest client-chosen id, or refuses it.
  absl::Status UseClientIdLocked(uint64_t id, absl::string_view kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A new stream whose thread is counted in live_streams_ until it exits.
  absl::StatusOr<std::shared_ptr<Stream>> NewStream();

  const std::string id_;
  const uint64_t serial_;
  const std::string client_name_;
  const std::string owner_;
  std::string routing_key_;
  const std::shared_ptr<TenantUsage> tenant_;
  Device* const device_;
  const uint32_t device_index_;
  const SessionLimits* const limits_;
  MemoryAccounting* const account_;
  // This session's stream threads (a child of the manager's group): a
  // destroyed stream counts toward --max_streams_per_session until its
  // thread has finished its running launch.
  const std::shared_ptr<StreamThreads> threads_;
  // Bytes of this session's buffers still allocated (page-rounded), freed
  // handles included until the memory is released, and of the state its
  // open calls and pending event operations hold (runtime/memory_charge.h).
  const std::shared_ptr<std::atomic<uint64_t>> held_bytes_ =
      std::make_shared<std::atomic<uint64_t>>(0);

  mutable absl::Mutex mu_;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  // The largest client-chosen id so far, executor or event (0: none).
  uint64_t last_client_executor_ ABSL_GUARDED_BY(mu_) = 0;
  // Requested bytes of the buffers with live handles (for stats).
  uint64_t buffer_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Buffer>> buffers_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Stream>> streams_
      ABSL_GUARDED_BY(mu_);
  struct ExecutorEntry {
    std::shared_ptr<Executor> executor;
    bool repeatable = false;
  };
  absl::flat_hash_map<uint64_t, ExecutorEntry> executors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Event>> events_
      ABSL_GUARDED_BY(mu_);
  // What the session's events may have outstanding (see EventBudget),
  // each operation charged to the session's memory.
  const std::shared_ptr<EventBudget> event_budget_ =
      std::make_shared<EventBudget>(kMaxPendingEventOperations, held_bytes_,
                                    limits_->session_memory_bytes);
  // Blocking ones charge the session's memory.
  HostCallbacks callbacks_{limits_->callback_block_timeout, held_bytes_,
                           limits_->session_memory_bytes};
  struct RefusedPlanEntry {
    absl::Status error;
    bool reported = false;
  };
  // std::map: TakeUnreportedRefusal reports the earliest id first.
  std::map<uint64_t, RefusedPlanEntry> refused_plans_ ABSL_GUARDED_BY(mu_);
  size_t unreported_refusals_ ABSL_GUARDED_BY(mu_) = 0;
  struct GraphEntry {
    std::shared_ptr<Graph> graph;
    uint64_t tasks = 0;
  };
  // std::map: ListGraphs answers in id order.
  std::map<uint64_t, GraphEntry> graphs_ ABSL_GUARDED_BY(mu_);
  uint64_t graph_tasks_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::function<void()>> channels_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_channel_ ABSL_GUARDED_BY(mu_) = 1;
  // SetOpTimeouts; zero: none.
  absl::Duration execute_timeout_ ABSL_GUARDED_BY(mu_);
  absl::Duration wait_timeout_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_used_ ABSL_GUARDED_BY(mu_);
  // Open Attach calls and pending synchronizes (SessionSlot's counts).
  const std::shared_ptr<std::atomic<uint64_t>> attach_calls_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  const std::shared_ptr<std::atomic<uint64_t>> synchronizes_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  // Mallocs in progress: populating or clearing gigabytes takes longer than
  // a short idle timeout, and the reaper must not take the session
  // meanwhile.
  std::atomic<int> allocating_{0};
  RuntimeObserver* observer_ = nullptr;
  // Declared last: destroyed first, so queued work finishes while the
  // buffers it may use are still registered.
  std::shared_ptr<Stream> default_stream_;
};

// Owns all sessions: creation under the limits, lookup by id, closing, the
// idle timeout, and tearing sessions down off the RPC threads (a session's
// streams finish their queued work first).
class SessionManager {
 public:
  // Sessions on `devices` (at least one, index 0 first; they must outlive
  // the manager). `observer` (may be null) is told what the sessions do.
  SessionManager(std::vector<Device*> devices, SessionLimits limits,
                 RuntimeObserver* observer = nullptr);
  // The same over one device.
  SessionManager(Device* device, SessionLimits limits,
                 RuntimeObserver* observer = nullptr)
      : SessionManager(std::vector<Device*>{device}, limits, observer) {}
  ~SessionManager();  // Closes every session and waits for the teardown.

  const SessionLimits& limits() const { return limits_; }
  RuntimeObserver* observer() const { return observer_; }

  // The devices sessions are created on, by index (CreateSession's device).
  uint32_t device_count() const {
    return static_cast<uint32_t>(devices_.size());
  }
  // `index` < device_count().
  Device* device(uint32_t index) const { return devices_[index]; }
  // Device `index`, a number from the wire (CreateSessionRequest.device,
  // EvaluateRequest.device): INVALID_ARGUMENT naming it and the count when
  // there is no such device.
  absl::StatusOr<Device*> FindDevice(uint32_t index) const;

  // A session on device `device` owned by `owner` (the caller's identity).
  // INVALID_ARGUMENT naming the device and the count when there is no such
  // device; RESOURCE_EXHAUSTED past --max_sessions or the owner's
  // --max_sessions_per_tenant. `routing_key` (the call's
  // x-opserver-session, when it has one) is remembered for Get and Close;
  // INVALID_ARGUMENT when it is not a well-formed key.
  absl::StatusOr<std::shared_ptr<Session>> Create(
      std::string client_name, std::string owner, uint32_t device = 0,
      std::optional<std::string> routing_key = std::nullopt);
  // NOT_FOUND for unknown, closed or timed-out sessions, and for another
  // owner's, with the same message: a stolen session name is useless to a
  // different identity, and probing reveals nothing. Marks it used.
  // A call that carries a routing key (`routing_key`) gets NOT_FOUND
  // naming that key (SessionRoutingKeyNotFound) instead, also when the
  // session exists but was created with another key or none: the call was
  // misrouted. Without one, the key is not checked (grpcurl, older
  // clients).
  absl::StatusOr<std::shared_ptr<Session>> Get(
      absl::string_view id, absl::string_view caller,
      std::optional<absl::string_view> routing_key = std::nullopt);
  // The same for a caller whose identity could not be resolved
  // (CallerIdentity's UNAUTHENTICATED): that error, as it is.
  absl::StatusOr<std::shared_ptr<Session>> GetForCaller(
      absl::string_view id, const absl::StatusOr<std::string>& caller,
      std::optional<absl::string_view> routing_key = std::nullopt) {
    if (!caller.ok()) return caller.status();
    return Get(id, *caller, routing_key);
  }
  // Ends the session if `caller` owns it (else NOT_FOUND as for an unknown
  // one, and for a routing key as Get says); `on_freed` (if given) runs on
  // the teardown thread once its streams have drained and its memory is
  // released, so a caller can report completion only when everything is
  // gone.
  absl::Status Close(
      absl::string_view id, absl::string_view caller, absl::string_view why,
      std::function<void()> on_freed = nullptr,
      std::optional<absl::string_view> routing_key = std::nullopt);

  // Drops the work queued on every session's streams (Session::CancelWork),
  // so calls waiting for it (synchronizes, fences, transfers behind it)
  // are answered now. For shutdown, once the grace period is over.
  void CancelAllWork();

  // Destroys `stream` (draining it) on the teardown thread.
  void DestroyLater(std::shared_ptr<Stream> stream);

  uint64_t session_count() const;
  // Open sessions on each device, by index (device_count() entries).
  std::vector<uint64_t> SessionsPerDevice() const;
  // What each owner's sessions on one device hold now, for metrics: one
  // entry per owner and device it has sessions on.
  struct OwnerStats {
    std::string owner;
    uint32_t device = 0;
    uint64_t sessions = 0;
    uint64_t streams = 0;
    uint64_t executors = 0;
    uint64_t buffers = 0;
    uint64_t buffer_bytes = 0;
    uint64_t queued_launches = 0;
    uint64_t events = 0;
    uint64_t pending_event_operations = 0;
    uint64_t attach_streams = 0;
    uint64_t pending_synchronizes = 0;
    uint64_t graphs = 0;
    uint64_t graph_tasks = 0;
  };
  std::vector<OwnerStats> StatsByOwner() const;
  // Buffers on all devices together.
  const MemoryAccounting& accounting() const { return account_; }
  // Buffers on device `index` (< device_count()).
  const MemoryAccounting& device_accounting(uint32_t index) const {
    return *device_accounts_[index];
  }

  // Blocks until everything handed to the teardown thread so far is gone.
  // For tests and shutdown.
  void WaitForTeardown();

 private:
  void ReaperLoop();
  // Removes the session from the table and from its owner's session count;
  // the caller hands it to the reaper.
  std::shared_ptr<Session> UnlistLocked(
      absl::flat_hash_map<std::string, std::shared_ptr<Session>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<Device*> devices_;
  const SessionLimits limits_;
  RuntimeObserver* const observer_;
  MemoryAccounting account_;
  // One per device, counting into account_ (atomics do not move: hence
  // the pointers).
  std::vector<std::unique_ptr<MemoryAccounting>> device_accounts_;
  // Every session's stream threads (see the destructor).
  const std::shared_ptr<StreamThreads> stream_threads_ =
      std::make_shared<StreamThreads>();

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, std::shared_ptr<TenantUsage>> tenants_
      ABSL_GUARDED_BY(mu_);
  // Sessions and streams waiting to be destroyed by the reaper thread, each
  // with what to run once it is gone.
  struct Doomed {
    std::shared_ptr<void> object;
    std::function<void()> on_freed;
  };
  void BuryLocked(std::shared_ptr<void> object,
                  std::function<void()> on_freed = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::deque<Doomed> graveyard_ ABSL_GUARDED_BY(mu_);
  uint64_t buried_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t destroyed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_SESSION_H_
