// The C API's host callbacks (CANN's acl/acl_rt.h): aclrtSubscribeReport,
// aclrtUnSubscribeReport, aclrtProcessReport, aclrtLaunchCallback and
// aclrtLaunchHostFunc. A callback is a CallbackCommand on the session's
// command channel; the server's notice (on the channel's reader thread)
// hands it to the thread subscribed to its stream, which runs it in its
// aclrtProcessReport, or to the library's own host-function thread. A
// blocking one is released (release_callback) once its function returned.

#include <pthread.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "client/aclnn_state.h"
#include "client/client.h"

namespace opserver {
namespace {

// A stream as subscriptions know it: (device, 0) for a device's default
// stream, else (0, the aclrtStream's value), which is never reused (a
// server's handle may be, by the next session after aclrtResetDevice).
using StreamKey = std::pair<uint32_t, uint64_t>;

StreamKey KeyOf(const PinnedStream& target, aclrtStream stream) {
  if (stream == nullptr) return {target.pinned.device, 0};
  return {0, reinterpret_cast<uintptr_t>(stream)};
}

// How messages name a stream.
std::string Named(StreamKey key) {
  if (key.second == 0) {
    return absl::StrCat("the default stream of device ", key.first);
  }
  return absl::StrCat("stream ", absl::Hex(key.second));
}

// One reached callback (or one that never will be: `status`), waiting for
// its thread.
struct Report {
  uint64_t id = 0;
  absl::Status status;
  void (*fn)(void*) = nullptr;
  void* user_data = nullptr;
  bool block = false;
  // Weak: the channel that reports holds this callback until then, and
  // the session owns the channel. Locked client first (it must outlive
  // the session).
  std::weak_ptr<Client> client;
  std::weak_ptr<remote::Session> session;
};

// Lets a blocking callback's stream go on. A session gone meanwhile has
// nothing left to release; a broken channel's server lets go by itself.
void ReleaseStream(const Report& report) {
  if (!report.block) return;
  std::shared_ptr<Client> client = report.client.lock();
  std::shared_ptr<remote::Session> session = report.session.lock();
  if (client == nullptr || session == nullptr) return;
  session->ReleaseCallback(report.id).IgnoreError();
}

// Subscriptions and the reports waiting for their threads. Process-wide
// and never destroyed: the channels' reader threads push into it until
// they end.
class Reports {
 public:
  static Reports& Get() {
    static Reports* const reports = new Reports();
    return *reports;
  }

  // The thread `key`'s reports go to; nullopt when none.
  std::optional<uint64_t> Subscriber(StreamKey key) {
    absl::MutexLock lock(&mu_);
    auto it = subscribers_.find(key);
    if (it == subscribers_.end()) return std::nullopt;
    return it->second;
  }

  aclError Subscribe(StreamKey key, uint64_t thread) {
    absl::MutexLock lock(&mu_);
    auto [it, added] = subscribers_.emplace(key, thread);
    if (!added) {
      return Fail(ACL_ERROR_RT_STREAM_SUBSCRIBE,
                  absl::StrCat("aclrtSubscribeReport: ", Named(key),
                               " already has a subscribed thread (", it->second,
                               "); one thread per stream"));
    }
    ++subscriptions_[thread];
    return ACL_SUCCESS;
  }

  aclError Unsubscribe(StreamKey key, uint64_t thread) {
    absl::MutexLock lock(&mu_);
    auto it = subscribers_.find(key);
    if (it == subscribers_.end()) {
      return Fail(ACL_ERROR_RT_STREAM_NO_CB_REG,
                  absl::StrCat("aclrtUnSubscribeReport: ", Named(key),
                               " has no subscribed thread"));
    }
    if (it->second != thread) {
      return Fail(ACL_ERROR_RT_THREAD_SUBSCRIBE,
                  absl::StrCat("aclrtUnSubscribeReport: ", Named(key),
                               " is subscribed to thread ", it->second,
                               ", not ", thread));
    }
    subscribers_.erase(it);
    if (--subscriptions_[thread] == 0) subscriptions_.erase(thread);
    return ACL_SUCCESS;
  }

  void Push(uint64_t thread, Report report) {
    absl::MutexLock lock(&mu_);
    ready_[thread].push_back(std::move(report));
  }

  // The next report of `thread`, waiting up to `timeout` (nullopt: for
  // ever). The error to return when there is none.
  absl::StatusOr<Report> Next(uint64_t thread,
                              std::optional<absl::Duration> timeout) {
    absl::MutexLock lock(&mu_);
    struct Args {
      Reports* reports;
      uint64_t thread;
    } args{this, thread};
    // Something to run, or nothing subscribed to wait for.
    const absl::Condition ready(
        +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return a->reports->HasReportLocked(a->thread) ||
                 a->reports->subscriptions_.count(a->thread) == 0;
        },
        &args);
    if (timeout.has_value()) {
      mu_.AwaitWithTimeout(ready, *timeout);
    } else {
      mu_.Await(ready);
    }
    if (!HasReportLocked(thread)) {
      if (subscriptions_.count(thread) == 0) {
        return WithAclError(
            absl::FailedPreconditionError(absl::StrCat(
                "aclrtProcessReport: no stream is subscribed to thread ",
                thread, " (aclrtSubscribeReport) and no callback is left")),
            ACL_ERROR_RT_THREAD_SUBSCRIBE);
      }
      return WithAclError(absl::DeadlineExceededError(absl::StrCat(
                              "aclrtProcessReport: no callback reached within ",
                              absl::FormatDuration(*timeout))),
                          ACL_ERROR_RT_REPORT_TIMEOUT);
    }
    std::deque<Report>& queue = ready_[thread];
    Report report = std::move(queue.front());
    queue.pop_front();
    if (queue.empty()) ready_.erase(thread);
    return report;
  }

  // aclFinalize: every subscription and report goes; waiting threads wake.
  void Clear() {
    std::map<uint64_t, std::deque<Report>> dropped;  // Outside the lock.
    absl::MutexLock lock(&mu_);
    subscribers_.clear();
    subscriptions_.clear();
    dropped.swap(ready_);
  }

 private:
  bool HasReportLocked(uint64_t thread) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = ready_.find(thread);
    return it != ready_.end() && !it->second.empty();
  }

  absl::Mutex mu_;
  std::map<StreamKey, uint64_t> subscribers_ ABSL_GUARDED_BY(mu_);
  // Streams subscribed to each thread.
  std::map<uint64_t, int> subscriptions_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::deque<Report>> ready_ ABSL_GUARDED_BY(mu_);
};

// The library's own thread for aclrtLaunchHostFunc: runs the reached
// functions in the order their notices came (stream order per stream).
class HostFuncThread {
 public:
  static HostFuncThread& Get() {
    static HostFuncThread* const thread = new HostFuncThread();
    return *thread;
  }

  void Push(Report report) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;  // aclFinalize: the session goes too.
    queue_.push_back(std::move(report));
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { Loop(); });
    }
  }

  // Waits for the function running now, drops the rest.
  void Stop() {
    std::thread thread;
    std::deque<Report> dropped;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      thread = std::move(thread_);
      dropped.swap(queue_);
    }
    if (thread.joinable()) thread.join();
    absl::MutexLock lock(&mu_);
    stopping_ = false;
  }

 private:
  void Loop() {
    for (;;) {
      Report report;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](HostFuncThread* t) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return t->stopping_ || !t->queue_.empty();
            },
            this));
        if (stopping_) return;
        report = std::move(queue_.front());
        queue_.pop_front();
      }
      // One that will never run is dropped: its stream's synchronize
      // reports why.
      if (!report.status.ok()) continue;
      report.fn(report.user_data);
      ReleaseStream(report);
    }
  }

  absl::Mutex mu_;
  std::deque<Report> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

uint64_t ThisThread() { return static_cast<uint64_t>(pthread_self()); }

// Queues the callback on its stream; `deliver` gets its report once the
// server said.
aclError LaunchOn(const char* function, bool block, const PinnedStream& target,
                  std::function<void(Report)> deliver, void (*fn)(void*),
                  void* user_data) {
  std::weak_ptr<Client> client = target.pinned.client;
  std::weak_ptr<remote::Session> session = target.pinned.session;
  absl::StatusOr<uint64_t> id = target.pinned.session->LaunchCallback(
      target.handle, block,
      [deliver = std::move(deliver), fn, user_data, block, client, session](
          uint64_t id, absl::Status status) {
        deliver(Report{id, std::move(status), fn, user_data, block, client,
                       session});
      });
  if (!id.ok()) {
    return FailAcl(Prefixed(target.pinned.Named(id.status()),
                            absl::StrCat(function, ": ")));
  }
  return ACL_SUCCESS;
}

}  // namespace

void EndHostCallbacks() {
  HostFuncThread::Get().Stop();
  Reports::Get().Clear();
}

}  // namespace opserver

using opserver::Fail;
using opserver::FailAcl;
using opserver::GetState;
using opserver::State;

extern "C" {

aclError aclrtSubscribeReport(uint64_t threadId, aclrtStream stream) {
  absl::StatusOr<opserver::PinnedStream> target =
      opserver::PinStreamOf(GetState(), __func__, stream);
  if (!target.ok()) return FailAcl(target.status());
  return opserver::Reports::Get().Subscribe(opserver::KeyOf(*target, stream),
                                            threadId);
}

aclError aclrtUnSubscribeReport(uint64_t threadId, aclrtStream stream) {
  absl::StatusOr<opserver::PinnedStream> target =
      opserver::PinStreamOf(GetState(), __func__, stream);
  if (!target.ok()) return FailAcl(target.status());
  return opserver::Reports::Get().Unsubscribe(opserver::KeyOf(*target, stream),
                                              threadId);
}

aclError aclrtProcessReport(int32_t timeout) {
  if (timeout != -1 && timeout <= 0) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtProcessReport: timeout ", timeout,
                             " ms (-1 waits for ever, else it must be "
                             "positive)"));
  }
  std::optional<absl::Duration> within;
  if (timeout != -1) within = absl::Milliseconds(timeout);
  absl::StatusOr<opserver::Report> report =
      opserver::Reports::Get().Next(opserver::ThisThread(), within);
  if (!report.ok()) return FailAcl(report.status());
  if (!report->status.ok()) {
    return FailAcl(opserver::Prefixed(report->status, "aclrtProcessReport: "));
  }
  report->fn(report->user_data);
  opserver::ReleaseStream(*report);
  return ACL_SUCCESS;
}

aclError aclrtLaunchCallback(aclrtCallback fn, void* userData,
                             aclrtCallbackBlockType blockType,
                             aclrtStream stream) {
  if (fn == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchCallback: fn is NULL");
  }
  if (blockType != ACL_CALLBACK_BLOCK && blockType != ACL_CALLBACK_NO_BLOCK) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtLaunchCallback: unknown blockType ",
                             static_cast<int>(blockType),
                             " (ACL_CALLBACK_NO_BLOCK or ACL_CALLBACK_BLOCK)"));
  }
  absl::StatusOr<opserver::PinnedStream> target =
      opserver::PinStreamOf(GetState(), __func__, stream);
  if (!target.ok()) return FailAcl(target.status());
  const opserver::StreamKey key = opserver::KeyOf(*target, stream);
  std::optional<uint64_t> thread = opserver::Reports::Get().Subscriber(key);
  if (!thread.has_value()) {
    return Fail(ACL_ERROR_RT_STREAM_NO_CB_REG,
                absl::StrCat("aclrtLaunchCallback: ", opserver::Named(key),
                             " has no subscribed thread "
                             "(aclrtSubscribeReport)"));
  }
  return opserver::LaunchOn(
      __func__, blockType == ACL_CALLBACK_BLOCK, *target,
      [thread = *thread](opserver::Report report) {
        opserver::Reports::Get().Push(thread, std::move(report));
      },
      fn, userData);
}

aclError aclrtLaunchHostFunc(aclrtStream stream, aclrtHostFunc fn, void* args) {
  if (fn == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchHostFunc: fn is NULL");
  }
  absl::StatusOr<opserver::PinnedStream> target =
      opserver::PinStreamOf(GetState(), __func__, stream);
  if (!target.ok()) return FailAcl(target.status());
  return opserver::LaunchOn(
      __func__, /*block=*/true, *target,
      [](opserver::Report report) {
        opserver::HostFuncThread::Get().Push(std::move(report));
      },
      fn, args);
}

}  // extern "C"
