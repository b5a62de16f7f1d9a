#include "runtime/session_manager.h"

#include <algorithm>
#include <map>
#include <random>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/session_routing.h"
#include "common/status_macros.h"
#include "common/thread_start.h"
#include "runtime/log.h"

namespace opserver {

namespace {

// A client string quoted in an error message: short ones as they are (the
// reply and log path escape and bound them), long ones by their length.
std::string Quoted(absl::string_view text) {
  if (text.size() <= 64) return absl::StrCat("'", text, "'");
  return absl::StrCat("of ", text.size(), " bytes");
}

}  // namespace

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
