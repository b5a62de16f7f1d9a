#ifndef OPSERVER_RUNTIME_SESSION_MANAGER_H_
#define OPSERVER_RUNTIME_SESSION_MANAGER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "devices/device.h"
#include "runtime/buffer.h"
#include "runtime/observer.h"
#include "runtime/session.h"
#include "runtime/session_limits.h"
#include "runtime/stream.h"

namespace opserver {

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

#endif  // OPSERVER_RUNTIME_SESSION_MANAGER_H_
