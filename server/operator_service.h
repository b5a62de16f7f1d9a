#ifndef OPSERVER_SERVER_OPERATOR_SERVICE_H_
#define OPSERVER_SERVER_OPERATOR_SERVICE_H_

#include <atomic>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "devices/device.h"
#include "proto/opserver.grpc.pb.h"
#include "runtime/data_transfers.h"
#include "runtime/session.h"
#include "runtime/session_manager.h"
#include "runtime/work_pool.h"
#include "server/auth.h"
#include "server/call_log.h"
#include "server/routing_key.h"
#include "server/runtime_service.h"

namespace opserver {

// v1::Operators::CallbackService with Pipeline and Evaluate raw (every
// other method as the generated CallbackService has it).
using OperatorsGraphs = v1::Operators::WithCallbackMethod_ListGraphs<
    v1::Operators::WithCallbackMethod_DescribeGraph<
        v1::Operators::WithCallbackMethod_ReplayGraph<
            v1::Operators::WithCallbackMethod_DestroyGraph<
                v1::Operators::Service>>>>;
using OperatorsBase = v1::Operators::WithCallbackMethod_ListOperators<
    v1::Operators::WithCallbackMethod_GetWorkspaceSize<
        v1::Operators::WithCallbackMethod_Execute<
            v1::Operators::WithCallbackMethod_ExecuteStream<
                v1::Operators::WithCallbackMethod_SetExecutorRepeatable<
                    v1::Operators::WithCallbackMethod_DestroyExecutor<
                        v1::Operators::WithRawCallbackMethod_Evaluate<
                            v1::Operators::WithRawCallbackMethod_Pipeline<
                                v1::Operators::WithCallbackMethod_LaunchCallback<
                                    v1::Operators::
                                        WithCallbackMethod_ReleaseCallback<
                                            OperatorsGraphs>>>>>>>>>>;

// opserver.v1.Operators: the operator table and the aclnn two-phase call
// (GetWorkspaceSize -> executor, Execute on a stream), plus Evaluate for
// literal numbers. `device` and `sessions` must outlive the service.
// `device` is the server's device 0, whose operators ListOperators lists.
// Evaluate (which has no session) runs on the device its request names
// (EvaluateRequest.device, one of `sessions`' devices); everything else on
// the device of the session it names.
//
// Pipeline and Evaluate are raw methods (bytes in and out): what a message
// holds is parsed on a worker, after the call was admitted (a channel's
// batch size, an Evaluate slot), not on gRPC's callback threads, which
// every call needs. Their messages are still the ones the service's
// descriptor (and reflection) names.
class OperatorService final : public OperatorsBase {
 public:
  // `workers` (which must outlive the service) run the work too large for
  // gRPC's threads; `authenticator` (null without tokens) resolves callers'
  // identities. `data_transfers` (null: no data path) moves the bytes of
  // the Pipeline channel's data_transfer commands.
  OperatorService(Device* device, SessionManager* sessions,
                  TransferLimits limits, WorkPool* workers,
                  const Authenticator* authenticator = nullptr,
                  DataTransfers* data_transfers = nullptr);

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
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Pipeline(
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
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  // Graphs by hand (runtime/graph.h): each translates one call of the
  // session's graphs.
  grpc::ServerUnaryReactor* ListGraphs(
      grpc::CallbackServerContext* context,
      const v1::ListGraphsRequest* request,
      v1::ListGraphsResponse* response) override;
  grpc::ServerUnaryReactor* DescribeGraph(
      grpc::CallbackServerContext* context,
      const v1::DescribeGraphRequest* request,
      v1::DescribeGraphResponse* response) override;
  grpc::ServerUnaryReactor* ReplayGraph(
      grpc::CallbackServerContext* context,
      const v1::ReplayGraphRequest* request,
      v1::ReplayGraphResponse* response) override;
  grpc::ServerUnaryReactor* DestroyGraph(
      grpc::CallbackServerContext* context,
      const v1::DestroyGraphRequest* request,
      v1::DestroyGraphResponse* response) override;
  grpc::ServerUnaryReactor* LaunchCallback(
      grpc::CallbackServerContext* context,
      const v1::LaunchCallbackRequest* request,
      v1::LaunchCallbackResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseCallback(
      grpc::CallbackServerContext* context,
      const v1::ReleaseCallbackRequest* request,
      v1::ReleaseCallbackResponse* response) override;

 private:
  class Launcher;
  class Pipeliner;

  // Execute's work, shared by the unary and the streaming form: checks the
  // request, consumes a single-use executor and queues the launch.
  // `caller` is the identity the session must belong to, `routing_key`
  // the call's (SessionManager::Get).
  absl::Status Launch(const v1::ExecuteRequest& request,
                      absl::string_view caller,
                      std::optional<absl::string_view> routing_key);

  // Evaluate's work on a worker: parses `request`, computes, and writes the
  // EvaluateResponse to `response`.
  absl::Status EvaluateBytes(const grpc::ByteBuffer& request,
                             grpc::ByteBuffer* response);

  // The identity whose sessions the call may name (CallerIdentity):
  // UNAUTHENTICATED when the call has no single token in force.
  absl::StatusOr<std::string> Caller(
      const grpc::ServerContextBase* context) const {
    return CallerIdentity(context, authenticator_);
  }
  // Session `id` when the call's identity owns it and the call's routing
  // key, if it carries one, is the session's (SessionManager::Get).
  absl::StatusOr<std::shared_ptr<Session>> SessionOf(
      const grpc::ServerContextBase* context, absl::string_view id) const {
    CallLog::NoteSession(context, id);
    return sessions_->GetForCaller(id, Caller(context),
                                   SessionRoutingKeyOf(context));
  }

  Device* const device_;  // ListOperators'.
  SessionManager* const sessions_;
  const TransferLimits limits_;
  WorkPool* const workers_;
  // A Pipeline batch is being applied on gRPC's callback thread that
  // received it (the command channel reactor's RunsHere): at most one at a
  // time, so another callback thread is always free.
  std::atomic<bool> slice_on_callback_thread_{false};
  const Authenticator* const authenticator_;
  DataTransfers* const data_transfers_;
  // Evaluate calls running now. Shared with their slots: a worker drops a
  // finished call's task (and its slot) after the reply, which can be after
  // the service is gone (multi_device_test saw it under ASan when the
  // server was destroyed right after an Evaluate).
  const std::shared_ptr<std::atomic<uint32_t>> evaluating_ =
      std::make_shared<std::atomic<uint32_t>>(0);
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_OPERATOR_SERVICE_H_
