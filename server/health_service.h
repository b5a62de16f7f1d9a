#ifndef OPSERVER_SERVER_HEALTH_SERVICE_H_
#define OPSERVER_SERVER_HEALTH_SERVICE_H_

#include <cstdint>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace opserver {

// grpc.health.v1.Health served from the compiled health.proto, so server
// reflection can describe it (gRPC's built-in health service cannot be
// described through reflection, which breaks grpcurl/buf curl listings).
//
// Check("") and Check(<each registered service>) answer SERVING until
// Drain() or Shutdown(); unknown services are NOT_FOUND. Watch streams the
// current status and every change; Shutdown() reports NOT_SERVING to every
// watcher and ends its stream so the server's shutdown does not wait on them.
class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  // `services` are the fully qualified names Check answers for (besides "").
  // At most `max_watches` Watch streams are open at once (they need no
  // token): more are RESOURCE_EXHAUSTED until one ends.
  HealthService(std::set<std::string> services, uint32_t max_watches);
  ~HealthService() override;

  grpc::ServerUnaryReactor* Check(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request,
      grpc::health::v1::HealthCheckResponse* response) override;

  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

  // Marks "" and every registered service NOT_SERVING and reports it to
  // their watchers, whose streams stay open (a load balancer watching sees
  // the change, not an ended stream it would retry). Idempotent.
  void Drain();
  // Marks everything NOT_SERVING and finishes all Watch streams. Idempotent.
  void Shutdown();

 private:
  class Watcher;
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // Returns false when `service` is unknown.
  bool StatusOf(const std::string& service, ServingStatus* status) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveWatcher(Watcher* watcher);

  const std::set<std::string> services_;
  const uint32_t max_watches_;
  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_HEALTH_SERVICE_H_
