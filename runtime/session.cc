#include "runtime/session.h"

#include <algorithm>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/task_position.h"
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

}  // namespace opserver
