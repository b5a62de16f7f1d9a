#ifndef OPSERVER_SERVER_OPERATOR_SERVICE_H_
#define OPSERVER_SERVER_OPERATOR_SERVICE_H_

#include <atomic>

#include "absl/status/status.h"
#include "proto/opserver.grpc.pb.h"
#include "server/auth.h"
#include "server/device.h"
#include "server/runtime_service.h"
#include "server/session.h"

namespace opserver {

// opserver.v1.Operators: the operator table and the aclnn two-phase call
// (GetWorkspaceSize -> executor, Execute on a stream), plus Evaluate for
// literal numbers. `device` and `sessions` must outlive the service.
class OperatorService final : public v1::Operators::CallbackService {
 public:
  // `authenticator` (null without tokens) resolves callers' identities.
  OperatorService(Device* device, SessionManager* sessions,
                  TransferLimits limits,
                  const Authenticator* authenticator = nullptr);

  grpc::ServerUnaryReactor* ListOperators(
      grpc::CallbackServerContext* context,
      const v1::ListOperatorsRequest* request,
      v1::ListOperatorsResponse* response) override;
  grpc::ServerUnaryReactor* GetWorkspaceSize(
      grpc::CallbackServerContext* context,
      const v1::GetWorkspaceSizeRequest* request,
      v1::GetWorkspaceSizeResponse* response) override;
  grpc::ServerUnaryReactor* Execute(grpc::CallbackServerContext* context,
                                    const v1::ExecuteRequest* request,
                                    v1::ExecuteResponse* response) override;
  grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteResponse>*
  ExecuteStream(grpc::CallbackServerContext* context) override;
  grpc::ServerBidiReactor<v1::PipelineRequest, v1::PipelineEvent>* Pipeline(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* SetExecutorRepeatable(
      grpc::CallbackServerContext* context,
      const v1::SetExecutorRepeatableRequest* request,
      v1::SetExecutorRepeatableResponse* response) override;
  grpc::ServerUnaryReactor* DestroyExecutor(
      grpc::CallbackServerContext* context,
      const v1::DestroyExecutorRequest* request,
      v1::DestroyExecutorResponse* response) override;
  grpc::ServerUnaryReactor* Evaluate(grpc::CallbackServerContext* context,
                                     const v1::EvaluateRequest* request,
                                     v1::EvaluateResponse* response) override;

 private:
  class Launcher;
  class Pipeliner;

  // Execute's work, shared by the unary and the streaming form: checks the
  // request, consumes a single-use executor and queues the launch.
  // `caller` is the identity the session must belong to.
  absl::Status Launch(const v1::ExecuteRequest& request,
                      absl::string_view caller);

  // The identity whose sessions the call may name (CallerIdentity):
  // UNAUTHENTICATED when the call has no single token in force.
  absl::StatusOr<std::string> Caller(
      const grpc::ServerContextBase* context) const {
    return CallerIdentity(context, authenticator_);
  }
  // Session `id` when the call's identity owns it.
  absl::StatusOr<std::shared_ptr<Session>> SessionOf(
      const grpc::ServerContextBase* context, absl::string_view id) const {
    absl::StatusOr<std::string> caller = Caller(context);
    if (!caller.ok()) return caller.status();
    return sessions_->Get(id, *caller);
  }

  Device* const device_;
  SessionManager* const sessions_;
  const TransferLimits limits_;
  const Authenticator* const authenticator_;
  // Evaluate calls running now.
  std::atomic<uint32_t> evaluating_{0};
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_OPERATOR_SERVICE_H_
