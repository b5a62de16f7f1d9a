#include "server/session.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/aclnn_status.h"
#include "server/log.h"

namespace opserver {

Buffer::Buffer(Device* device, void* data, uint64_t size,
               MemoryAccounting* account)
    : device_(device), data_(data), size_(size), account_(account) {
  account_->bytes += size_;
  account_->buffers += 1;
}

Buffer::~Buffer() {
  device_->Deallocate(data_, size_);
  account_->bytes -= size_;
  account_->buffers -= 1;
}

Session::Session(std::string id, std::string client_name, Device* device,
                 const SessionLimits* limits, MemoryAccounting* account)
    : id_(std::move(id)),
      client_name_(std::move(client_name)),
      device_(device),
      limits_(limits),
      account_(account),
      last_used_(absl::Now()),
      default_stream_(std::make_shared<Stream>()) {}

Session::~Session() {
  // Streams first (they drain queued work that holds buffer references),
  // then the tables.
  std::vector<std::shared_ptr<Stream>> streams;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [handle, stream] : streams_) streams.push_back(stream);
    streams_.clear();
  }
  streams.clear();
  default_stream_.reset();
}

uint64_t Session::HandleCountLocked() const {
  return buffers_.size() + streams_.size() + executors_.size();
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
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckHandleLimitLocked(); !s.ok()) return s;
    if (size > limits_->session_memory_bytes - buffer_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", size, " bytes: the session holds ",
                       buffer_bytes_, " of its ", limits_->session_memory_bytes,
                       " bytes (--session_memory_bytes)"));
    }
    // Reserve before allocating outside the lock.
    buffer_bytes_ += size;
  }
  absl::StatusOr<void*> data = device_->Allocate(size);
  absl::MutexLock lock(&mu_);
  if (!data.ok()) {
    buffer_bytes_ -= size;
    return data.status();
  }
  uint64_t handle = next_handle_++;
  buffers_[handle] = std::make_shared<Buffer>(device_, *data, size, account_);
  return handle;
}

absl::Status Session::Free(uint64_t buffer) {
  std::shared_ptr<Buffer> doomed;
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(buffer);
  if (it == buffers_.end()) return UnknownHandle("buffer", buffer);
  buffer_bytes_ -= it->second->size();
  doomed = std::move(it->second);
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
  if (absl::Status s = CheckHandleLimitLocked(); !s.ok()) return s;
  if (streams_.size() >= limits_->max_streams_per_session) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session already has ", streams_.size(),
                     " streams, the limit (--max_streams_per_session)"));
  }
  uint64_t handle = next_handle_++;
  streams_[handle] = std::make_shared<Stream>();
  return handle;
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

absl::StatusOr<uint64_t> Session::AddExecutor(
    std::shared_ptr<Executor> executor) {
  absl::MutexLock lock(&mu_);
  if (HandleCountLocked() >= limits_->max_handles_per_session) {
    return kernels::AclnnError(
        kernels::kAclnnErrInnerCreateExecutor,
        absl::StatusCode::kResourceExhausted,
        absl::StrCat("cannot create an executor: the session holds ",
                     HandleCountLocked(),
                     " handles, the limit (--max_handles_per_session)"));
  }
  uint64_t handle = next_handle_++;
  executors_[handle] = ExecutorEntry{std::move(executor), false};
  return handle;
}

absl::StatusOr<std::shared_ptr<Executor>> Session::ExecutorForLaunch(
    uint64_t executor, bool consume) {
  absl::MutexLock lock(&mu_);
  auto it = executors_.find(executor);
  if (it == executors_.end()) {
    if (executor != 0 && executor < next_handle_) {
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
  if (consume && !it->second.repeatable) executors_.erase(it);
  return result;
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

SessionStatsSnapshot Session::Stats() const {
  absl::MutexLock lock(&mu_);
  SessionStatsSnapshot stats;
  stats.buffers = buffers_.size();
  stats.buffer_bytes = buffer_bytes_;
  stats.streams = streams_.size();
  stats.executors = executors_.size();
  return stats;
}

void Session::Touch() {
  absl::MutexLock lock(&mu_);
  last_used_ = absl::Now();
}

absl::Time Session::last_used() const {
  absl::MutexLock lock(&mu_);
  return last_used_;
}

void Session::set_attached(bool attached) {
  absl::MutexLock lock(&mu_);
  attached_ = attached;
  last_used_ = absl::Now();
}

bool Session::attached() const {
  absl::MutexLock lock(&mu_);
  return attached_;
}

SessionManager::SessionManager(Device* device, SessionLimits limits)
    : device_(device), limits_(limits), reaper_([this] { ReaperLoop(); }) {}

SessionManager::~SessionManager() {
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, session] : sessions_) BuryLocked(std::move(session));
    sessions_.clear();
    stopping_ = true;
  }
  reaper_.join();
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Create(
    std::string client_name) {
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
  auto session = std::make_shared<Session>(id, std::move(client_name), device_,
                                           &limits_, &account_);
  sessions_[id] = session;
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Get(
    absl::string_view id) {
  if (id.empty()) {
    return absl::InvalidArgumentError(
        "session is empty; open one with Runtime/CreateSession");
  }
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no session '", id,
        "' (closed, timed out after inactivity, or never opened)"));
  }
  it->second->Touch();
  return it->second;
}

void SessionManager::BuryLocked(std::shared_ptr<void> object,
                                std::function<void()> on_freed) {
  graveyard_.push_back(Doomed{std::move(object), std::move(on_freed)});
  ++buried_;
}

absl::Status SessionManager::Close(absl::string_view id, absl::string_view why,
                                   std::function<void()> on_freed) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no session '", id, "' (already closed?)"));
    }
    session = std::move(it->second);
    sessions_.erase(it);
    BuryLocked(session, std::move(on_freed));
  }
  LogLine(absl::StrCat("session ", id, " (", session->client_name(),
                       ") closed: ", why));
  return absl::OkStatus();
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
    // Idle timeout: sessions bound to an Attach stream end with it instead.
    absl::Time cutoff = absl::Now() - limits_.idle_timeout;
    std::vector<std::string> idle;
    for (const auto& [id, session] : sessions_) {
      if (!session->attached() && session->last_used() < cutoff) {
        idle.push_back(id);
      }
    }
    for (const std::string& id : idle) {
      BuryLocked(std::move(sessions_[id]));
      sessions_.erase(id);
      LogLine(absl::StrCat("session ", id, " closed: idle for ",
                           absl::FormatDuration(limits_.idle_timeout)));
    }
  }
}

}  // namespace opserver
