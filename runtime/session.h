#ifndef OPSERVER_RUNTIME_SESSION_H_
#define OPSERVER_RUNTIME_SESSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "devices/device.h"
#include "runtime/buffer.h"
#include "runtime/event.h"
#include "runtime/host_callbacks.h"
#include "runtime/memory_charge.h"
#include "runtime/observer.h"
#include "runtime/session_limits.h"
#include "runtime/session_slot.h"
#include "runtime/stream.h"

namespace opserver {

class Graph;

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

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_SESSION_H_
