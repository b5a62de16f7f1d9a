#include "server/health_service.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace opserver {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch stream. Writes are serialized by hand (gRPC allows one write in
// flight per stream) and the stream is finished exactly once: on shutdown,
// on cancellation, or when a write fails.
class HealthService::Watcher final
    : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  // `known`: the watched service is "" or a registered one, so its status
  // follows the server's (Drain), where an unknown one stays
  // SERVICE_UNKNOWN.
  Watcher(HealthService* service, ServingStatus initial, bool known)
      : service_(service), known_(known) {
    absl::MutexLock lock(&mu_);
    wanted_ = initial;
    WriteLocked(initial);
  }

  bool known() const { return known_; }

  // Reports `status`, once the write in flight (if any) is done; the
  // stream stays open.
  void Update(ServingStatus status) {
    absl::MutexLock lock(&mu_);
    if (finished_ || stopping_) return;
    wanted_ = status;
    if (!writing_ && last_written_ != status) WriteLocked(status);
  }

  // Reports NOT_SERVING and ends the stream.
  void Stop() {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    stopping_ = true;
    if (writing_) return;  // OnWriteDone goes on.
    // A drained server has reported NOT_SERVING already.
    if (last_written_ == HealthCheckResponse::NOT_SERVING) {
      FinishLocked(grpc::Status::OK);
    } else {
      WriteLocked(HealthCheckResponse::NOT_SERVING);
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok || cancelled_) {
      FinishLocked(grpc::Status::CANCELLED);
    } else if (stopping_) {
      if (last_written_ != HealthCheckResponse::NOT_SERVING) {
        WriteLocked(HealthCheckResponse::NOT_SERVING);
      } else {
        FinishLocked(grpc::Status::OK);
      }
    } else if (wanted_ != last_written_) {
      WriteLocked(wanted_);
    }
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (!writing_) FinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    service_->RemoveWatcher(this);
    delete this;
  }

 private:
  void WriteLocked(ServingStatus status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    response_.set_status(status);
    last_written_ = status;
    writing_ = true;
    StartWrite(&response_);
  }

  void FinishLocked(const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  HealthService* const service_;
  const bool known_;
  absl::Mutex mu_;
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);
  // The status to report once the write in flight is done.
  ServingStatus wanted_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  ServingStatus last_written_ ABSL_GUARDED_BY(mu_) =
      HealthCheckResponse::UNKNOWN;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

HealthService::HealthService(std::set<std::string> services,
                             uint32_t max_watches)
    : services_(std::move(services)), max_watches_(max_watches) {}

HealthService::~HealthService() = default;

bool HealthService::StatusOf(const std::string& service,
                             ServingStatus* status) const {
  if (!service.empty() && services_.count(service) == 0) return false;
  *status = shutting_down_ || draining_ ? HealthCheckResponse::NOT_SERVING
                                        : HealthCheckResponse::SERVING;
  return true;
}

grpc::ServerUnaryReactor* HealthService::Check(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request,
    HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  ServingStatus status;
  bool known;
  {
    absl::MutexLock lock(&mu_);
    known = StatusOf(request->service(), &status);
  }
  if (!known) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("unknown service '", request->service(), "'")));
    return reactor;
  }
  response->set_status(status);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request) {
  absl::MutexLock lock(&mu_);
  if (watchers_.size() >= max_watches_) {
    // A reactor that only finishes with the refusal.
    class Refused final : public grpc::ServerWriteReactor<HealthCheckResponse> {
     public:
      explicit Refused(uint32_t max) {
        Finish(grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat("the server already serves ", max,
                         " Health.Watch streams (--max_health_watches); "
                         "retry later, or poll Health.Check")));
      }
      void OnDone() override { delete this; }
    };
    return new Refused(max_watches_);
  }
  ServingStatus status;
  // As gRPC's own implementation does, an unknown service is watched as
  // SERVICE_UNKNOWN rather than failed: it may be registered later.
  const bool known = StatusOf(request->service(), &status);
  if (!known) status = HealthCheckResponse::SERVICE_UNKNOWN;
  auto* watcher = new Watcher(this, status, known);
  watchers_.insert(watcher);
  if (shutting_down_) watcher->Stop();
  return watcher;
}

void HealthService::RemoveWatcher(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

void HealthService::Drain() {
  absl::MutexLock lock(&mu_);
  if (draining_ || shutting_down_) return;
  draining_ = true;
  for (Watcher* watcher : watchers_) {
    if (watcher->known()) watcher->Update(HealthCheckResponse::NOT_SERVING);
  }
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  for (Watcher* watcher : watchers_) watcher->Stop();
}

}  // namespace opserver
