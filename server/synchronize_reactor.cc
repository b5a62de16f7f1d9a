#include "server/synchronize_reactor.h"

#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/grpc_status_util.h"

namespace opserver {
namespace {

// Shared by the reactor and the wait's answer, which may run on another
// thread after the reactor is gone: only whoever takes `reactor` finishes
// the call.
struct Answered {
  // Finishes the call with `status` unless it was finished already.
  void Answer(const absl::Status& status) {
    grpc::ServerUnaryReactor* call;
    std::function<void()> dropped;  // Destroyed outside the lock.
    {
      absl::MutexLock lock(&mu);
      call = std::exchange(reactor, nullptr);
      dropped = std::move(forget);
    }
    if (call != nullptr) call->Finish(ToGrpcStatus(status, context));
  }

  grpc::CallbackServerContext* context = nullptr;
  absl::Mutex mu;
  // Null once the call is finished.
  grpc::ServerUnaryReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  // Drops the wait; null until the wait is registered, and after it was
  // answered.
  std::function<void()> forget ABSL_GUARDED_BY(mu);
  bool cancelled ABSL_GUARDED_BY(mu) = false;
};

class SynchronizeReactor final : public grpc::ServerUnaryReactor {
 public:
  SynchronizeReactor(SessionSlot slot, std::shared_ptr<Answered> answered)
      : slot_(std::move(slot)), answered_(std::move(answered)) {}

  void OnCancel() override {
    std::function<void()> forget;
    {
      absl::MutexLock lock(&answered_->mu);
      answered_->cancelled = true;
      forget = std::move(answered_->forget);
    }
    if (forget) forget();
    answered_->Answer(absl::CancelledError(
        "the call was cancelled (or its deadline passed) before what it "
        "waited for completed"));
  }

  void OnDone() override { delete this; }

 private:
  const SessionSlot slot_;
  const std::shared_ptr<Answered> answered_;
};

}  // namespace

grpc::ServerUnaryReactor* StartSynchronize(grpc::CallbackServerContext* context,
                                           SessionSlot slot,
                                           const SynchronizeWait& wait) {
  auto answered = std::make_shared<Answered>();
  auto* reactor = new SynchronizeReactor(std::move(slot), answered);
  answered->context = context;
  {
    absl::MutexLock lock(&answered->mu);
    answered->reactor = reactor;
  }
  absl::StatusOr<std::function<void()>> forget =
      wait([answered](absl::Status status) { answered->Answer(status); });
  if (!forget.ok()) {
    answered->Answer(forget.status());
    return reactor;
  }
  bool drop_now = false;
  {
    absl::MutexLock lock(&answered->mu);
    // A cancelled call drops its wait; one answered already (the answer
    // may have come meanwhile) has nothing left to drop.
    if (answered->cancelled) {
      drop_now = *forget != nullptr;
    } else if (answered->reactor != nullptr) {
      answered->forget = *std::move(forget);
    }
  }
  if (drop_now) (*forget)();
  return reactor;
}

}  // namespace opserver
