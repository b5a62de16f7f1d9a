#include "runtime/session.h"

#include <algorithm>
#include <random>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/session_routing.h"
#include "common/status_macros.h"
#include "common/task_position.h"
#include "common/thread_start.h"
#include "kernels/aclnn_status.h"
#include "runtime/log.h"

namespace opserver {

namespace {

// Devices hand out memory in pages at least; a session is charged for what
// it really holds, so 64K Malloc(0) calls cannot hide 256 MiB.
constexpr uint64_t kChargeGranularity = 4096;

uint64_t Charge(uint64_t size) {
  if (size == 0) return kChargeGranularity;
  return (size + kChargeGranularity - 1) / kChargeGranularity *
         kChargeGranularity;
}

// A client string quoted in an error message: short ones as they are (the
// reply and log path escape and bound them), long ones by their length.
std::string Quoted(absl::string_view text) {
  if (text.size() <= 64) return absl::StrCat("'", text, "'");
  return absl::StrCat("of ", text.size(), " bytes");
}

// The session's default device stream: `given`, or a new one of `device`
// (null when that fails or there is no device; see the constructor).
std::unique_ptr<DeviceStream> DefaultDeviceStream(
    Device* device, std::unique_ptr<DeviceStream> given) {
  if (given != nullptr || device == nullptr) return given;
  absl::StatusOr<std::unique_ptr<DeviceStream>> created =
      device->CreateStream();
  if (!created.ok()) {
    LogLine(absl::StrCat("session default stream has no device stream: ",
                         created.status().ToString()));
    return nullptr;
  }
  return *std::move(created);
}

}  // namespace

void MemoryAccounting::Add(uint64_t size, int sign) {
  for (MemoryAccounting* a = this; a != nullptr; a = a->parent) {
    if (sign > 0) {
      a->bytes += size;
      a->buffers += 1;
    } else {
      a->bytes -= size;
      a->buffers -= 1;
    }
  }
}

Buffer::Buffer(Device* device, void* data, uint64_t size,
               MemoryAccounting* account,
               std::shared_ptr<std::atomic<uint64_t>> session_bytes,
               uint64_t charged,
               std::shared_ptr<std::atomic<uint64_t>> tenant_bytes)
    : device_(device),
      data_(data),
      size_(size),
      account_(account),
      session_bytes_(std::move(session_bytes)),
      charged_(charged),
      tenant_bytes_(std::move(tenant_bytes)) {
  account_->Add(size_, +1);
}

Buffer::~Buffer() {
  device_->Deallocate(data_, size_);
  account_->Add(size_, -1);
  if (session_bytes_ != nullptr) *session_bytes_ -= charged_;
  if (tenant_bytes_ != nullptr) *tenant_bytes_ -= charged_;
}

Session::Session(std::string id, uint64_t serial, std::string client_name,
                 Device* device, const SessionLimits* limits,
                 MemoryAccounting* account,
                 std::shared_ptr<StreamThreads> manager_threads,
                 std::string owner, std::shared_ptr<TenantUsage> tenant,
                 std::unique_ptr<DeviceStream> default_device_stream,
                 uint32_t device_index)
    : id_(std::move(id)),
      serial_(serial),
      client_name_(std::move(client_name)),
      owner_(std::move(owner)),
      tenant_(tenant != nullptr ? std::move(tenant)
                                : std::make_shared<TenantUsage>()),
      device_(device),
      device_index_(device_index),
      limits_(limits),
      account_(account),
      threads_(std::make_shared<StreamThreads>(std::move(manager_threads))),
      last_used_(absl::Now()),
      default_stream_(std::make_shared<Stream>(
          DefaultDeviceStream(device, std::move(default_device_stream)),
          limits->max_queued_per_stream, threads_)) {}

absl::StatusOr<std::shared_ptr<Stream>> Session::NewStream() {
  std::unique_ptr<DeviceStream> device_stream;
  if (device_ != nullptr) {
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceStream> created,
                     device_->CreateStream());
    device_stream = std::move(created);
  }
  try {
    return std::make_shared<Stream>(std::move(device_stream),
                                    limits_->max_queued_per_stream, threads_);
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start a stream thread: ", e.what()));
  }
}

void Session::CancelWork() {
  for (const std::shared_ptr<Stream>& stream : AllStreams()) {
    stream->Cancel("the stream's session was closed");
  }
  absl::flat_hash_map<uint64_t, std::function<void()>> channels;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    channels.swap(channels_);
  }
  // Outside the lock: a channel ending may look at the session.
  for (auto& [id, on_close] : channels) on_close();
}

bool Session::Busy() const {
  if (allocating_.load() > 0) return true;
  for (const std::shared_ptr<Stream>& stream : AllStreams()) {
    if (stream->busy()) return true;
  }
  return false;
}

Session::~Session() {
  // Queued work holds buffer references: drop it first (running work ends
  // on its own), then the tables.
  CancelWork();
  std::vector<std::shared_ptr<Stream>> streams;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [handle, stream] : streams_) streams.push_back(stream);
    streams_.clear();
  }
  streams.clear();
  // Their waiters are released (the streams are cancelled already).
  absl::flat_hash_map<uint64_t, std::shared_ptr<Event>> events;
  {
    absl::MutexLock lock(&mu_);
    events.swap(events_);
  }
  for (auto& [handle, event] : events) event->Destroy();
  events.clear();
  // Their replays were dropped with the streams' queued work.
  std::map<uint64_t, GraphEntry> graphs;
  {
    absl::MutexLock lock(&mu_);
    graphs.swap(graphs_);
    graph_tasks_ = 0;
  }
  graphs.clear();
  default_stream_.reset();
}

uint64_t Session::HandleCountLocked() const {
  return buffers_.size() + streams_.size() + executors_.size() +
         refused_plans_.size() + events_.size();
}

absl::Status Session::CheckHandleLimitLocked() const {
  if (HandleCountLocked() >= limits_->max_handles_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session holds ", HandleCountLocked(),
        " handles, the limit (--max_handles_per_session); free some first"));
  }
  return absl::OkStatus();
}

absl::Status Session::UnknownHandle(absl::string_view kind,
                                    uint64_t handle) const {
  return absl::NotFoundError(
      absl::StrCat("no ", kind, " ", handle,
                   " in this session (never created, freed, or "
                   "another session's)"));
}

absl::StatusOr<uint64_t> Session::Malloc(uint64_t size) {
  const uint64_t limit = limits_->session_memory_bytes;
  const uint64_t charge = size > limit ? size : Charge(size);
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckHandleLimitLocked());
    // held_bytes_ grows outside the lock only by call-state charges (a
    // few KiB each, reserved against the limit themselves), so the check
    // overshoots by those at most.
    const uint64_t held = held_bytes_->load();
    if (charge > limit - std::min(limit, held)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate ", size, " bytes: the session holds ", held,
          " of its ", limit,
          " bytes (--session_memory_bytes; freed buffers count until queued "
          "work and executors using them are gone)"));
    }
    // The owner's budget is shared with its other sessions: reserve with a
    // compare-and-swap so concurrent Mallocs cannot overshoot it together.
    const uint64_t tenant_limit = limits_->tenant_memory_bytes;
    uint64_t tenant_held = tenant_->bytes.load();
    do {
      if (tenant_limit != 0 &&
          charge > tenant_limit - std::min(tenant_held, tenant_limit)) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "cannot allocate ", size, " bytes: this client's sessions hold ",
            tenant_held, " of its ", tenant_limit,
            " bytes (--tenant_memory_bytes)"));
      }
    } while (!tenant_->bytes.compare_exchange_weak(tenant_held,
                                                   tenant_held + charge));
    // Reserve before allocating outside the lock.
    *held_bytes_ += charge;
  }
  ++allocating_;
  absl::StatusOr<void*> data = device_->Allocate(size, serial_);
  // Used until now (the allocation can take seconds).
  Touch();
  --allocating_;
  if (!data.ok()) {
    *held_bytes_ -= charge;
    tenant_->bytes -= charge;
    return data.status();
  }
  auto buffer = std::make_shared<Buffer>(
      device_, *data, size, account_, held_bytes_, charge,
      std::shared_ptr<std::atomic<uint64_t>>(tenant_, &tenant_->bytes));
  absl::MutexLock lock(&mu_);
  buffer_bytes_ += size;
  uint64_t handle = next_handle_++;
  buffers_[handle] = std::move(buffer);
  return handle;
}

absl::Status Session::Free(uint64_t buffer) {
  std::shared_ptr<Buffer> doomed;
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(buffer);
  if (it == buffers_.end()) return UnknownHandle("buffer", buffer);
  buffer_bytes_ -= it->second->size();
  doomed = std::move(it->second);
  doomed->MarkFreed();
  buffers_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Buffer>> Session::GetBuffer(
    uint64_t buffer) const {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(buffer);
  if (it == buffers_.end()) return UnknownHandle("buffer", buffer);
  return it->second;
}

absl::StatusOr<uint64_t> Session::CreateStream() {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckHandleLimitLocked());
  // Every thread but the default stream's.
  const int streams = threads_->count() - 1;
  if (streams >= static_cast<int>(limits_->max_streams_per_session)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session already has ", streams,
        " streams (destroyed ones count until their running work ends), the "
        "limit (--max_streams_per_session)"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Stream> stream, NewStream());
  stream->SetTaskTimeout(execute_timeout_);
  uint64_t handle = next_handle_++;
  streams_[handle] = std::move(stream);
  return handle;
}

absl::Status Session::SetOpTimeouts(uint64_t execute_ms, uint64_t wait_ms) {
  if (execute_ms > kMaxOpTimeoutMs || wait_ms > kMaxOpTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "operator time-outs of ", execute_ms, " ms (execute) and ", wait_ms,
        " ms (wait): at most ", kMaxOpTimeoutMs, " ms each (0: none)"));
  }
  const absl::Duration execute = absl::Milliseconds(execute_ms);
  {
    absl::MutexLock lock(&mu_);
    execute_timeout_ = execute;
    wait_timeout_ = absl::Milliseconds(wait_ms);
  }
  for (const std::shared_ptr<Stream>& stream : AllStreams()) {
    stream->SetTaskTimeout(execute);
  }
  return absl::OkStatus();
}

absl::Duration Session::op_wait_timeout() const {
  absl::MutexLock lock(&mu_);
  return wait_timeout_;
}

absl::StatusOr<std::shared_ptr<Stream>> Session::TakeStream(uint64_t stream) {
  if (stream == 0) {
    return absl::InvalidArgumentError(
        "stream 0 is the session's default stream and cannot be destroyed");
  }
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return UnknownHandle("stream", stream);
  std::shared_ptr<Stream> taken = std::move(it->second);
  streams_.erase(it);
  return taken;
}

absl::StatusOr<std::shared_ptr<Stream>> Session::GetStream(
    uint64_t stream) const {
  if (stream == 0) return default_stream_;
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return UnknownHandle("stream", stream);
  return it->second;
}

std::vector<std::shared_ptr<Stream>> Session::AllStreams() const {
  std::vector<std::shared_ptr<Stream>> all = {default_stream_};
  absl::MutexLock lock(&mu_);
  for (const auto& [handle, stream] : streams_) all.push_back(stream);
  return all;
}

absl::Status Session::CheckExecutorLimitLocked() const {
  if (HandleCountLocked() < limits_->max_handles_per_session) {
    return absl::OkStatus();
  }
  return kernels::AclnnError(
      kernels::kAclnnErrInnerCreateExecutor,
      absl::StatusCode::kResourceExhausted,
      absl::StrCat("cannot create an executor: the session holds ",
                   HandleCountLocked(),
                   " handles, the limit (--max_handles_per_session)"));
}

bool Session::IssuedExecutorLocked(uint64_t executor) const {
  if (executor >= kClientExecutorBase) {
    return executor <= last_client_executor_;
  }
  return executor != 0 && executor < next_handle_;
}

absl::StatusOr<uint64_t> Session::AddExecutor(
    std::shared_ptr<Executor> executor) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckExecutorLimitLocked());
  uint64_t handle = next_handle_++;
  executors_[handle] = ExecutorEntry{std::move(executor), false};
  return handle;
}

absl::Status Session::UseClientIdLocked(uint64_t id, absl::string_view kind) {
  if (id < kClientExecutorBase || id <= last_client_executor_) {
    return kernels::ParamInvalid(absl::StrCat(
        kind, " id ", id,
        " cannot be chosen: client-chosen ids are at "
        "least 2^62 and larger than every id the session chose before (",
        last_client_executor_, ")"));
  }
  last_client_executor_ = id;  // Used, even if refused after this.
  return absl::OkStatus();
}

absl::Status Session::AddExecutorAs(uint64_t handle,
                                    std::shared_ptr<Executor> executor) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(UseClientIdLocked(handle, "executor"));
  RETURN_IF_ERROR(CheckExecutorLimitLocked());
  executors_[handle] = ExecutorEntry{std::move(executor), false};
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Executor>> Session::ExecutorForLaunch(
    uint64_t executor, bool consume, bool* consumed, bool* repeatable) {
  if (consumed != nullptr) *consumed = false;
  absl::MutexLock lock(&mu_);
  auto it = executors_.find(executor);
  if (it == executors_.end()) {
    if (IssuedExecutorLocked(executor)) {
      return kernels::AclnnError(
          kernels::kAclnnErrInnerNullptr, absl::StatusCode::kFailedPrecondition,
          absl::StrCat("executor ", executor,
                       " was already consumed by a launch or destroyed; "
                       "call GetWorkspaceSize again, or make it repeatable "
                       "before its first launch"));
    }
    return kernels::AclnnError(
        kernels::kAclnnErrInnerNullptr, absl::StatusCode::kNotFound,
        absl::StrCat("no executor ", executor, " in this session"));
  }
  std::shared_ptr<Executor> result = it->second.executor;
  if (repeatable != nullptr) *repeatable = it->second.repeatable;
  if (consume && !it->second.repeatable) {
    executors_.erase(it);
    if (consumed != nullptr) *consumed = true;
  }
  return result;
}

absl::Status Session::Launch(
    uint64_t handle, Stream& stream, bool inline_if_idle,
    const std::function<Stream::Task(std::shared_ptr<Executor>)>& make_task) {
  // A full or destroyed stream refuses the launch before the executor is
  // taken...
  RETURN_IF_ERROR(stream.CheckRoom());
  bool consumed = false;
  ASSIGN_OR_RETURN(std::shared_ptr<Executor> executor,
                   ExecutorForLaunch(handle, /*consume=*/true, &consumed));
  absl::Status queued = stream.Enqueue(make_task(executor), inline_if_idle);
  if (!queued.ok() && consumed) {
    // ...and one that changed since gives it back (found by the soak: the
    // launch failed and the executor was gone). Its handle was held a
    // moment ago, so the handle limit is not checked again.
    absl::MutexLock lock(&mu_);
    executors_.emplace(handle, ExecutorEntry{std::move(executor), false});
  }
  return queued;
}

absl::Status Session::SetExecutorRepeatable(uint64_t executor) {
  absl::MutexLock lock(&mu_);
  auto it = executors_.find(executor);
  if (it == executors_.end()) {
    return kernels::AclnnError(
        kernels::kAclnnErrInnerNullptr, absl::StatusCode::kNotFound,
        absl::StrCat("no executor ", executor,
                     " in this session (never created, already consumed, "
                     "or destroyed)"));
  }
  it->second.repeatable = true;
  return absl::OkStatus();
}

absl::Status Session::DestroyExecutor(uint64_t executor) {
  std::shared_ptr<Executor> doomed;
  absl::MutexLock lock(&mu_);
  auto it = executors_.find(executor);
  if (it == executors_.end()) {
    return kernels::AclnnError(
        kernels::kAclnnErrInnerNullptr, absl::StatusCode::kNotFound,
        absl::StrCat("no executor ", executor,
                     " in this session (never created, already consumed, "
                     "or destroyed)"));
  }
  doomed = std::move(it->second.executor);
  executors_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Session::CreateEvent(uint32_t flags) {
  RETURN_IF_ERROR(CheckEventFlags(flags));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckHandleLimitLocked());
  const uint64_t handle = next_handle_++;
  events_[handle] = std::make_shared<Event>(flags, event_budget_);
  return handle;
}

absl::Status Session::CreateEventAs(uint64_t id, uint32_t flags) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(UseClientIdLocked(id, "event"));
  RETURN_IF_ERROR(CheckEventFlags(flags));
  RETURN_IF_ERROR(CheckHandleLimitLocked());
  events_[id] = std::make_shared<Event>(flags, event_budget_);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Event>> Session::GetEvent(uint64_t event) const {
  absl::MutexLock lock(&mu_);
  auto it = events_.find(event);
  if (it == events_.end()) return UnknownHandle("event", event);
  return it->second;
}

absl::Status Session::DestroyEvent(uint64_t event) {
  std::shared_ptr<Event> doomed;
  {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(event);
    if (it == events_.end()) return UnknownHandle("event", event);
    doomed = std::move(it->second);
    events_.erase(it);
  }
  // Outside the lock: releasing a waiter takes its stream's lock, and a
  // synchronize it answers may finish an RPC.
  doomed->Destroy();
  return absl::OkStatus();
}

absl::Status Session::AddRefusedPlan(uint64_t id, absl::Status error) {
  if (error.message().size() > kMaxKeptErrorBytes) {
    error = kernels::AclnnError(kernels::GetAclnnStatus(error), error.code(),
                                Truncated(error.message(), kMaxKeptErrorBytes));
  }
  absl::MutexLock lock(&mu_);
  if (refused_plans_.count(id) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("executor ", id, " is a refused plan already"));
  }
  RETURN_IF_ERROR(CheckHandleLimitLocked());
  refused_plans_[id] = RefusedPlanEntry{std::move(error), false};
  ++unreported_refusals_;
  return absl::OkStatus();
}

std::optional<absl::Status> Session::RefusedPlan(uint64_t id, bool launch) {
  absl::MutexLock lock(&mu_);
  auto it = refused_plans_.find(id);
  if (it == refused_plans_.end()) return std::nullopt;
  if (launch && !it->second.reported) {
    it->second.reported = true;
    --unreported_refusals_;
  }
  return it->second.error;
}

std::optional<absl::Status> Session::TakeRefusedPlan(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = refused_plans_.find(id);
  if (it == refused_plans_.end()) return std::nullopt;
  absl::Status unreported;
  if (!it->second.reported) {
    unreported = std::move(it->second.error);
    --unreported_refusals_;
  }
  refused_plans_.erase(it);
  return unreported;
}

absl::Status Session::TakeUnreportedRefusal() {
  absl::MutexLock lock(&mu_);
  if (unreported_refusals_ == 0) return absl::OkStatus();
  for (auto& [id, entry] : refused_plans_) {
    if (!entry.reported) {
      entry.reported = true;
      --unreported_refusals_;
      return entry.error;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Session::OpenChannel(std::function<void()> on_close) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) {
    return absl::CancelledError("the session was closed");
  }
  if (channels_.size() >= limits_->max_pipelines_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the session already has ", channels_.size(),
        " Pipeline channels open, the limit (--max_pipelines_per_session)"));
  }
  const uint64_t id = next_channel_++;
  channels_[id] = std::move(on_close);
  return id;
}

void Session::CloseChannel(uint64_t channel) {
  std::function<void()> dropped;  // Destroyed outside the lock.
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(channel);
  if (it == channels_.end()) return;
  dropped = std::move(it->second);
  channels_.erase(it);
}

SessionStatsSnapshot Session::Stats() const {
  absl::MutexLock lock(&mu_);
  SessionStatsSnapshot stats;
  stats.buffers = buffers_.size();
  stats.buffer_bytes = buffer_bytes_;
  stats.streams = streams_.size();
  stats.executors = executors_.size();
  stats.events = events_.size();
  stats.pending_event_operations = event_budget_->held();
  stats.attach_streams = attach_calls_->load();
  stats.pending_synchronizes = synchronizes_->load();
  stats.graphs = graphs_.size();
  stats.graph_tasks = graph_tasks_;
  return stats;
}

absl::Status Session::AddGraph(uint64_t id, std::shared_ptr<Graph> graph,
                               uint64_t tasks,
                               const std::vector<uint64_t>& consume) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(UseClientIdLocked(id, "graph"));
  if (graphs_.size() >= limits_->max_graphs_per_session) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the session has ", graphs_.size(),
                     " graphs, the limit (--max_graphs_per_session); destroy "
                     "one first"));
  }
  const uint64_t task_limit = limits_->max_graph_tasks_per_session;
  if (tasks > task_limit - std::min(task_limit, graph_tasks_)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a graph of ", tasks, " tasks does not fit: the session's graphs hold ",
        graph_tasks_, " of ", task_limit,
        " tasks (--max_graph_tasks_per_session)"));
  }
  for (uint64_t executor : consume) {
    if (!executors_.contains(executor)) {
      return kernels::AclnnError(
          kernels::kAclnnErrInnerNullptr, absl::StatusCode::kFailedPrecondition,
          absl::StrCat("executor ", executor,
                       " was consumed or destroyed while the graph was being "
                       "defined"));
    }
  }
  for (uint64_t executor : consume) executors_.erase(executor);
  graphs_[id] = GraphEntry{std::move(graph), tasks};
  graph_tasks_ += tasks;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Graph>> Session::GetGraph(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = graphs_.find(id);
  if (it == graphs_.end()) return UnknownHandle("graph", id);
  return it->second.graph;
}

absl::Status Session::DestroyGraph(uint64_t id) {
  std::shared_ptr<Graph> doomed;  // Released outside the lock.
  absl::MutexLock lock(&mu_);
  auto it = graphs_.find(id);
  if (it == graphs_.end()) return UnknownHandle("graph", id);
  doomed = std::move(it->second.graph);
  graph_tasks_ -= std::min(graph_tasks_, it->second.tasks);
  graphs_.erase(it);
  return absl::OkStatus();
}

std::vector<std::pair<uint64_t, std::shared_ptr<Graph>>> Session::AllGraphs()
    const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<uint64_t, std::shared_ptr<Graph>>> graphs;
  graphs.reserve(graphs_.size());
  for (const auto& [id, entry] : graphs_) graphs.emplace_back(id, entry.graph);
  return graphs;
}

absl::StatusOr<MemoryCharge> Session::ChargeMemory(uint64_t bytes,
                                                   absl::string_view what) {
  RETURN_IF_ERROR(ReserveSessionBytes(
      *held_bytes_, limits_->session_memory_bytes, bytes, what));
  return MemoryCharge(held_bytes_, bytes);
}

absl::flat_hash_map<const Buffer*, uint64_t> Session::BufferHandles() const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<const Buffer*, uint64_t> handles;
  handles.reserve(buffers_.size());
  for (const auto& [handle, buffer] : buffers_) handles[buffer.get()] = handle;
  return handles;
}

namespace {

// A SessionSlot of `count`, unless `limit` are held (then `refusal`), with
// kCallStateBytes charged to `bytes` (the session's, up to `byte_limit`;
// `what` names the call in the refusal).
absl::StatusOr<SessionSlot> TakeSlot(
    const std::shared_ptr<std::atomic<uint64_t>>& count, uint64_t limit,
    const std::function<absl::Status(uint64_t held)>& refusal,
    const std::shared_ptr<std::atomic<uint64_t>>& bytes, uint64_t byte_limit,
    absl::string_view what) {
  uint64_t held = count->load();
  do {
    if (held >= limit) return refusal(held);
  } while (!count->compare_exchange_weak(held, held + 1));
  if (absl::Status s =
          ReserveSessionBytes(*bytes, byte_limit, kCallStateBytes, what);
      !s.ok()) {
    count->fetch_sub(1);
    return s;
  }
  return SessionSlot(count, MemoryCharge(bytes, kCallStateBytes));
}

}  // namespace

absl::StatusOr<SessionSlot> Session::TakeAttachSlot() {
  return TakeSlot(attach_calls_, limits_->max_attach_per_session,
                  [](uint64_t held) {
                    return absl::ResourceExhaustedError(
                        absl::StrCat("the session has ", held,
                                     " Attach calls open, the limit "
                                     "(--max_attach_per_session)"));
                  },
                  held_bytes_, limits_->session_memory_bytes,
                  "an Attach call's state");
}

absl::StatusOr<SessionSlot> Session::TakeSynchronizeSlot() {
  return TakeSlot(
      synchronizes_, limits_->max_pending_synchronizes_per_session,
      [](uint64_t held) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the session has ", held,
            " synchronizes pending, the limit "
            "(--max_pending_synchronizes_per_session); wait for them to be "
            "answered before sending more"));
      },
      held_bytes_, limits_->session_memory_bytes,
      "a pending synchronize's state");
}

absl::StatusOr<Session::StreamSlot> Session::TakeStreamSynchronizeSlot(
    uint64_t stream) {
  ASSIGN_OR_RETURN(std::shared_ptr<Stream> found, GetStream(stream));
  ASSIGN_OR_RETURN(SessionSlot slot, TakeSynchronizeSlot());
  return StreamSlot{std::move(found), std::move(slot)};
}

void Session::Touch() {
  absl::MutexLock lock(&mu_);
  last_used_ = absl::Now();
}

absl::Time Session::last_used() const {
  absl::MutexLock lock(&mu_);
  return last_used_;
}

bool Session::attached() const { return attach_calls_->load() != 0; }

SessionManager::SessionManager(std::vector<Device*> devices,
                               SessionLimits limits, RuntimeObserver* observer)
    : devices_(std::move(devices)), limits_(limits), observer_(observer) {
  for (size_t i = 0; i < devices_.size(); ++i) {
    device_accounts_.push_back(std::make_unique<MemoryAccounting>(&account_));
  }
  // Started last: the reaper reads the members above.
  // Throws std::system_error without a thread (the Server turns it into
  // its start's error).
  reaper_ = NewThread([this] { ReaperLoop(); });
}

std::vector<uint64_t> SessionManager::SessionsPerDevice() const {
  std::vector<uint64_t> counts(devices_.size(), 0);
  absl::MutexLock lock(&mu_);
  for (const auto& [id, session] : sessions_) {
    ++counts[session->device_index()];
  }
  return counts;
}

std::vector<SessionManager::OwnerStats> SessionManager::StatsByOwner() const {
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mu_);
    sessions.reserve(sessions_.size());
    for (const auto& [id, session] : sessions_) sessions.push_back(session);
  }
  std::map<std::pair<std::string, uint32_t>, OwnerStats> owners;
  for (const std::shared_ptr<Session>& session : sessions) {
    OwnerStats& o = owners[{session->owner(), session->device_index()}];
    const SessionStatsSnapshot stats = session->Stats();
    ++o.sessions;
    o.streams += stats.streams;
    o.executors += stats.executors;
    o.buffers += stats.buffers;
    o.buffer_bytes += stats.buffer_bytes;
    o.events += stats.events;
    o.pending_event_operations += stats.pending_event_operations;
    o.attach_streams += stats.attach_streams;
    o.pending_synchronizes += stats.pending_synchronizes;
    o.graphs += stats.graphs;
    o.graph_tasks += stats.graph_tasks;
    for (const std::shared_ptr<Stream>& stream : session->AllStreams()) {
      o.queued_launches += stream->queued();
    }
  }
  std::vector<OwnerStats> result;
  for (auto& [key, stats] : owners) {
    stats.owner = key.first;
    stats.device = key.second;
    result.push_back(std::move(stats));
  }
  return result;
}

SessionManager::~SessionManager() {
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, session] : sessions_) BuryLocked(std::move(session));
    sessions_.clear();
    stopping_ = true;
  }
  reaper_.join();
  // Stream threads finish the task they run after their streams are gone;
  // what those tasks use (the device) must outlive them, so this waits for
  // every one. It is short: the streams were cancelled, and a cancelled
  // launch stops soon (the CPU device checks between pieces of about a
  // million elements).
  while (!stream_threads_->WaitForZero(absl::Seconds(10))) {
    LogLine(absl::StrCat(stream_threads_->count(),
                         " stream threads still running after the sessions "
                         "ended; waiting for them before the device goes"));
  }
}

absl::StatusOr<Device*> SessionManager::FindDevice(uint32_t index) const {
  if (index >= devices_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", index, " does not exist: the server has ", devices_.size(),
        devices_.size() == 1 ? " device (0)" : " devices (0 to ",
        devices_.size() == 1 ? "" : absl::StrCat(devices_.size() - 1, ")"),
        "; GetDeviceInfo lists them"));
  }
  return devices_[index];
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Create(
    std::string client_name, std::string owner, uint32_t device,
    std::optional<std::string> routing_key) {
  // Checked before anything else: `device` comes from the wire.
  if (absl::StatusOr<Device*> d = FindDevice(device); !d.ok()) {
    return d.status();
  }
  if (routing_key.has_value()) {
    RETURN_IF_ERROR(CheckSessionRoutingKey(*routing_key));
  }
  if (client_name.size() > kMaxClientNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_name has ", client_name.size(), " bytes; at most ",
                     kMaxClientNameBytes, " allowed"));
  }
  // 128 random bits: another client cannot guess a session's name.
  std::string id;
  {
    static thread_local std::random_device device;
    uint64_t a = (uint64_t{device()} << 32) | device();
    uint64_t b = (uint64_t{device()} << 32) | device();
    id = absl::StrCat(absl::Hex(a, absl::kZeroPad16),
                      absl::Hex(b, absl::kZeroPad16));
  }
  absl::MutexLock lock(&mu_);
  if (sessions_.size() >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the server already has ", sessions_.size(),
        " sessions, the limit (--max_sessions); close unused ones"));
  }
  std::shared_ptr<TenantUsage>& tenant = tenants_[owner];
  if (tenant == nullptr) tenant = std::make_shared<TenantUsage>();
  if (limits_.max_sessions_per_tenant != 0 &&
      tenant->sessions >= limits_.max_sessions_per_tenant) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this client already has ", tenant->sessions,
        " sessions, the limit (--max_sessions_per_tenant); close unused ones"));
  }
  // The default stream's device stream, so that a device out of streams
  // is this call's error, not a session that cannot launch.
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceStream> default_device_stream,
                   devices_[device]->CreateStream());
  std::shared_ptr<Session> session;
  try {
    session = std::make_shared<Session>(
        id, next_serial_++, std::move(client_name), devices_[device], &limits_,
        device_accounts_[device].get(), stream_threads_, std::move(owner),
        tenant, std::move(default_device_stream), device);
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the session's stream thread: ", e.what()));
  }
  session->set_observer(observer_);
  if (routing_key.has_value()) {
    session->set_routing_key(*std::move(routing_key));
  }
  ++tenant->sessions;
  sessions_[id] = session;
  return session;
}

namespace {

// Whether the listed session `found` (null: none) is the one a call by
// `caller` carrying `routing_key` (if any) may use.
bool Reachable(const Session* found, absl::string_view caller,
               std::optional<absl::string_view> routing_key) {
  if (found == nullptr || found->owner() != caller) return false;
  return !routing_key.has_value() || found->routing_key() == *routing_key;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Get(
    absl::string_view id, absl::string_view caller,
    std::optional<absl::string_view> routing_key) {
  if (id.empty()) {
    return absl::InvalidArgumentError(
        "session is empty; open one with Runtime/CreateSession");
  }
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  const Session* found = it == sessions_.end() ? nullptr : it->second.get();
  if (!Reachable(found, caller, routing_key)) {
    if (routing_key.has_value()) return SessionRoutingKeyNotFound(*routing_key);
    return absl::NotFoundError(
        absl::StrCat("no session ", Quoted(id),
                     " (closed, timed out after inactivity, or never opened)"));
  }
  it->second->Touch();
  return it->second;
}

void SessionManager::BuryLocked(std::shared_ptr<void> object,
                                std::function<void()> on_freed) {
  graveyard_.push_back(Doomed{std::move(object), std::move(on_freed)});
  ++buried_;
}

std::shared_ptr<Session> SessionManager::UnlistLocked(
    absl::flat_hash_map<std::string, std::shared_ptr<Session>>::iterator it) {
  auto tenant = tenants_.find(it->second->owner());
  if (tenant != tenants_.end()) --tenant->second->sessions;
  std::shared_ptr<Session> session = std::move(it->second);
  sessions_.erase(it);
  return session;
}

absl::Status SessionManager::Close(
    absl::string_view id, absl::string_view caller, absl::string_view why,
    std::function<void()> on_freed,
    std::optional<absl::string_view> routing_key) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    const Session* found = it == sessions_.end() ? nullptr : it->second.get();
    if (!Reachable(found, caller, routing_key)) {
      if (routing_key.has_value()) {
        return SessionRoutingKeyNotFound(*routing_key);
      }
      return absl::NotFoundError(
          absl::StrCat("no session ", Quoted(id), " (already closed?)"));
    }
    session = UnlistLocked(it);
  }
  // Its queued work is dropped now, not when the reaper gets to it, so a
  // closing session never waits on its own (or anyone's) queue.
  session->CancelWork();
  {
    absl::MutexLock lock(&mu_);
    BuryLocked(session, std::move(on_freed));
  }
  LogLine(absl::StrCat("session ", id, " (", session->client_name(),
                       ") closed: ", why));
  return absl::OkStatus();
}

void SessionManager::CancelAllWork() {
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, session] : sessions_) sessions.push_back(session);
  }
  for (const std::shared_ptr<Session>& session : sessions) {
    session->CancelWork();
  }
}

void SessionManager::DestroyLater(std::shared_ptr<Stream> stream) {
  absl::MutexLock lock(&mu_);
  BuryLocked(std::move(stream));
}

uint64_t SessionManager::session_count() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

void SessionManager::WaitForTeardown() {
  absl::MutexLock lock(&mu_);
  struct Args {
    SessionManager* manager;
    uint64_t target;
  } args{this, buried_};
  mu_.Await(absl::Condition(
      +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return a->manager->destroyed_ >= a->target;
      },
      &args));
}

void SessionManager::ReaperLoop() {
  const absl::Duration tick =
      std::min(absl::Seconds(1), limits_.idle_timeout / 4);
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](SessionManager* m) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return m->stopping_ || !m->graveyard_.empty();
            },
            this),
        tick);
    while (!graveyard_.empty()) {
      Doomed doomed = std::move(graveyard_.front());
      graveyard_.pop_front();
      mu_.Unlock();
      doomed.object
          .reset();  // Drains streams: may take as long as queued work.
      if (doomed.on_freed) doomed.on_freed();
      mu_.Lock();
      ++destroyed_;
    }
    if (stopping_) return;
    // Idle timeout: sessions bound to an Attach stream end with it instead,
    // and a session whose streams still have work is in use.
    absl::Time cutoff = absl::Now() - limits_.idle_timeout;
    std::vector<std::string> idle;
    for (const auto& [id, session] : sessions_) {
      if (session->attached()) continue;
      // Touched on every tick while busy, not only once it looks idle:
      // otherwise a synchronize that waited for seconds of work left its
      // session looking idle the moment the work ended, and it could be
      // reaped before the client's next call (hardening_test's
      // BusySessionsAreNotIdle saw it under load).
      if (session->Busy()) {
        session->Touch();
      } else if (session->last_used() < cutoff) {
        idle.push_back(id);
      }
    }
    std::vector<std::shared_ptr<Session>> reaped;
    for (const std::string& id : idle) {
      auto it = sessions_.find(id);
      reaped.push_back(it->second);
      BuryLocked(UnlistLocked(it));
    }
    if (!idle.empty()) {
      // Logged outside the lock: a stalled stderr must not stall lookups.
      mu_.Unlock();
      // As for Close: a transfer that started after the idle check would
      // otherwise hold the reaped session; cancelling
      // its stream ends it.
      for (const std::shared_ptr<Session>& session : reaped) {
        session->CancelWork();
      }
      reaped.clear();
      for (const std::string& id : idle) {
        LogLine(absl::StrCat("session ", id, " closed: idle for ",
                             absl::FormatDuration(limits_.idle_timeout)));
      }
      mu_.Lock();
    }
  }
}

}  // namespace opserver
