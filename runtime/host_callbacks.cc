#include "runtime/host_callbacks.h"

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "runtime/deadline_timer.h"
#include "runtime/memory_charge.h"

namespace opserver {
namespace {

// CANN's ACL_ERROR_RT_REPORT_TIMEOUT: the callback's report was not
// processed in time.
constexpr int32_t kReportTimeout = 507012;

}  // namespace

// A blocking callback: its gate holds the stream from the moment the
// stream reaches it until the entry is dropped from the table.
struct HostCallbacks::Pending {
  std::shared_ptr<Stream::Gate> gate = std::make_shared<Stream::Gate>();
  MemoryCharge charge;
  // Guarded by Table::mu.
  Notify notify;
  bool reached = false;
  uint64_t timer = 0;  // DeadlineTimer key once reached; 0: none.
};

struct HostCallbacks::Table {
  absl::Mutex mu;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Pending>> pending
      ABSL_GUARDED_BY(mu);

  // Removes `id` if it is still `which` (any, when null); the caller
  // destroys what it returns outside the lock (its gate opens the stream).
  std::shared_ptr<Pending> Take(uint64_t id, const Pending* which) {
    absl::MutexLock lock(&mu);
    auto it = pending.find(id);
    if (it == pending.end()) return nullptr;
    if (which != nullptr && it->second.get() != which) return nullptr;
    std::shared_ptr<Pending> taken = std::move(it->second);
    pending.erase(it);
    if (taken->timer != 0) DeadlineTimer::Shared().Cancel(taken->timer);
    taken->timer = 0;
    return taken;
  }
};

HostCallbacks::HostCallbacks(absl::Duration block_timeout,
                             std::shared_ptr<std::atomic<uint64_t>> held_bytes,
                             uint64_t memory_limit)
    : block_timeout_(block_timeout),
      held_bytes_(std::move(held_bytes)),
      memory_limit_(memory_limit),
      table_(std::make_shared<Table>()) {}

HostCallbacks::~HostCallbacks() {
  // Each gate lets its stream go on when destroyed: outside the lock.
  std::vector<std::shared_ptr<Pending>> dropped;
  {
    absl::MutexLock lock(&table_->mu);
    for (auto& [id, pending] : table_->pending) {
      if (pending->timer != 0) DeadlineTimer::Shared().Cancel(pending->timer);
      pending->timer = 0;
      dropped.push_back(std::move(pending));
    }
    table_->pending.clear();
  }
}

absl::Status HostCallbacks::Queue(Stream& stream, uint64_t id, bool block,
                                  Notify notify) {
  if (absl::Status room = stream.CheckRoom(); absl::IsCancelled(room)) {
    return room;
  }
  if (!block) {
    stream.WhenReachedOrCancelled(
        [notify = std::move(notify)](absl::Status reached) {
          notify(std::move(reached));
        });
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ReserveSessionBytes(*held_bytes_, memory_limit_,
                                      kBlockedCallbackBytes,
                                      "a blocking host callback's state"));
  auto pending = std::make_shared<Pending>();
  pending->charge = MemoryCharge(held_bytes_, kBlockedCallbackBytes);
  {
    absl::MutexLock lock(&table_->mu);
    if (table_->pending.contains(id)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "blocking callback ", id,
          " is still pending: the ids of pending blocking callbacks must "
          "differ"));
    }
    pending->notify = std::move(notify);
    table_->pending[id] = pending;
  }
  // Set before the time-out opens the gate, read by the stream right after
  // the gate: the error stands where the callback did.
  auto timed_out = std::make_shared<std::atomic<bool>>(false);
  const std::weak_ptr<Table> table = table_;
  const std::weak_ptr<Pending> weak = pending;
  const absl::Duration timeout = block_timeout_;
  const std::shared_ptr<Stream::Gate> gate = pending->gate;
  pending.reset();  // The table holds it: a release may drop it at once.
  absl::Status held = stream.Hold(
      gate,
      [table, weak, id, timeout, timed_out] {
        Reached(table, weak, id, timeout, timed_out);
      },
      [table, weak, id] { Cancelled(table, weak, id); });
  if (!held.ok()) {
    if (std::shared_ptr<Pending> locked = weak.lock()) {
      table_->Take(id, locked.get());
    }
    return held;
  }
  stream.FailWith([timed_out, id, timeout]() -> absl::Status {
    if (!timed_out->load()) return absl::OkStatus();
    return kernels::AclnnError(
        kReportTimeout, absl::StatusCode::kDeadlineExceeded,
        absl::StrCat("blocking callback ", id, " was not released within ",
                     absl::FormatDuration(timeout),
                     " of its notice (--callback_block_timeout_ms): its "
                     "client did not run it (does a thread process its "
                     "reports?); the stream went on without it"));
  });
  return absl::OkStatus();
}

bool HostCallbacks::Release(uint64_t id) {
  return table_->Take(id, nullptr) != nullptr;
}

size_t HostCallbacks::blocked() const {
  absl::MutexLock lock(&table_->mu);
  return table_->pending.size();
}

void HostCallbacks::Reached(
    const std::weak_ptr<Table>& table, const std::weak_ptr<Pending>& weak,
    uint64_t id, absl::Duration timeout,
    const std::shared_ptr<std::atomic<bool>>& timed_out) {
  std::shared_ptr<Table> live = table.lock();
  std::shared_ptr<Pending> pending = weak.lock();
  if (live == nullptr || pending == nullptr) return;
  Notify notify;
  {
    absl::MutexLock lock(&live->mu);
    pending->reached = true;
    notify = std::move(pending->notify);
  }
  if (notify) notify(absl::OkStatus());
  // The clock starts once the client was told. A release may have come
  // meanwhile: then the entry is gone and nothing is armed.
  absl::MutexLock lock(&live->mu);
  auto it = live->pending.find(id);
  if (it == live->pending.end() || it->second != pending) return;
  pending->timer = DeadlineTimer::Shared().At(
      absl::Now() + timeout,
      [table, weak, id, timed_out] { Expired(table, weak, id, timed_out); });
}

void HostCallbacks::Expired(
    const std::weak_ptr<Table>& table, const std::weak_ptr<Pending>& weak,
    uint64_t id, const std::shared_ptr<std::atomic<bool>>& timed_out) {
  std::shared_ptr<Table> live = table.lock();
  std::shared_ptr<Pending> taken;
  {
    std::shared_ptr<Pending> pending = weak.lock();
    if (live == nullptr || pending == nullptr) return;
    absl::MutexLock lock(&live->mu);
    pending->timer = 0;  // Running now: nothing left to cancel.
    auto it = live->pending.find(id);
    if (it == live->pending.end() || it->second != pending) return;
    timed_out->store(true);
    taken = std::move(it->second);
    live->pending.erase(it);
  }
  taken.reset();  // The gate opens: the stream goes on.
}

void HostCallbacks::Cancelled(const std::weak_ptr<Table>& table,
                              const std::weak_ptr<Pending>& weak, uint64_t id) {
  std::shared_ptr<Table> live = table.lock();
  std::shared_ptr<Pending> pending = weak.lock();
  if (live == nullptr || pending == nullptr) return;
  Notify notify;
  {
    absl::MutexLock lock(&live->mu);
    // One reached already had its notice; one not reached never will.
    if (!pending->reached) notify = std::move(pending->notify);
  }
  std::shared_ptr<Pending> taken = live->Take(id, pending.get());
  pending.reset();
  taken.reset();
  if (notify) {
    notify(absl::CancelledError(absl::StrCat(
        "callback ", id,
        " was cancelled: its stream was destroyed or its session closed "
        "before reaching it")));
  }
}

}  // namespace opserver
