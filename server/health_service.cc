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
  Watcher(HealthService* service, ServingStatus initial) : service_(service) {
    absl::MutexLock lock(&mu_);
    WriteLocked(initial);
  }

  // Reports NOT_SERVING and ends the stream.
  void Stop() {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    stopping_ = true;
    if (!writing_) WriteLocked(HealthCheckResponse::NOT_SERVING);
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
  absl::Mutex mu_;
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);
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
  *status = shutting_down_ ? HealthCheckResponse::NOT_SERVING
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
  if (!StatusOf(request->service(), &status)) {
    status = HealthCheckResponse::SERVICE_UNKNOWN;
  }
  auto* watcher = new Watcher(this, status);
  watchers_.insert(watcher);
  if (shutting_down_) watcher->Stop();
  return watcher;
}

void HealthService::RemoveWatcher(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  for (Watcher* watcher : watchers_) watcher->Stop();
}

}  // namespace opserver
