#include "server/operator_service.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/values.h"
#include "grpcpp/support/byte_buffer.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"
#include "kernels/validate.h"
#include "runtime/executor.h"
#include "runtime/graph.h"
#include "runtime/log.h"
#include "server/auth.h"
#include "server/grpc_status_util.h"
#include "server/raw_message.h"
#include "server/start_read.h"
#include "server/synchronize_reactor.h"

namespace opserver {
namespace {

using kernels::DType;
using kernels::OpInfo;

void Describe(const OpInfo& op, v1::OperatorInfo* out) {
  out->set_name(std::string(op.name));
  out->set_aclnn_name(std::string(op.aclnn_name));
  out->set_semantics(std::string(op.description));
  for (const auto& arg : op.tensors) {
    v1::TensorArgInfo* t = out->add_tensors();
    t->set_name(std::string(arg.name));
    t->set_role(arg.is_output ? "output" : "input");
    for (DType d : arg.dtypes) {
      t->add_dtypes(static_cast<v1::DataType>(d));
    }
  }
  for (const auto& scalar : op.scalars) {
    v1::ParamInfo* p = out->add_params();
    p->set_aclnn_name(std::string(scalar.name));
    std::string field;
    for (char c : scalar.name) {
      if (c >= 'A' && c <= 'Z') {
        field += '_';
        field += static_cast<char>(c - 'A' + 'a');
      } else {
        field += c;
      }
    }
    p->set_name(field);
    p->set_type(std::string(scalar.type));
    if (scalar.default_value.has_value()) {
      p->set_default_value(*scalar.default_value);
    }
    for (DType d : scalar.dtypes) p->add_dtypes(static_cast<v1::DataType>(d));
    if (!scalar.dtypes.empty()) {
      std::vector<std::string> names;
      for (DType d : scalar.dtypes) {
        names.emplace_back(kernels::DTypeName(d));
      }
      p->set_description(
          absl::StrCat("dtype one of ", absl::StrJoin(names, ", ")));
    }
  }
}

// Holds one of `max` slots of `counter` while alive, if one was free.
class EvaluateSlot {
 public:
  EvaluateSlot(std::shared_ptr<std::atomic<uint32_t>> counter, uint32_t max)
      : counter_(std::move(counter)), ok_(counter_->fetch_add(1) < max) {}
  ~EvaluateSlot() { counter_->fetch_sub(1); }
  bool ok() const { return ok_; }

 private:
  const std::shared_ptr<std::atomic<uint32_t>> counter_;
  const bool ok_;
};

}  // namespace

OperatorService::OperatorService(Device* device, SessionManager* sessions,
                                 TransferLimits limits, WorkPool* workers,
                                 const Authenticator* authenticator,
                                 DataTransfers* data_transfers)
    : device_(device),
      sessions_(sessions),
      limits_(limits),
      workers_(workers),
      authenticator_(authenticator),
      data_transfers_(data_transfers) {}

grpc::ServerUnaryReactor* OperatorService::ListOperators(
    grpc::CallbackServerContext* context,
    const v1::ListOperatorsRequest* /*request*/,
    v1::ListOperatorsResponse* response) {
  for (const OpInfo& op : kernels::OpRegistry()) {
    // Only what the device can run (an Ascend device's aclnn library may
    // lack an operator).
    if (!device_->SupportsOp(op.kind)) continue;
    Describe(op, response->add_operators());
  }
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OperatorService::GetWorkspaceSize(
    grpc::CallbackServerContext* context,
    const v1::GetWorkspaceSizeRequest* request,
    v1::GetWorkspaceSizeResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  ASSIGN_OR_RETURN(
      std::shared_ptr<Executor> executor,
      PlanExecutor(*request, *session, sessions_->limits().max_launch_elements),
      ReplyTo(context));
  const uint64_t workspace_size = executor->plan->workspace_size();
  ASSIGN_OR_RETURN(uint64_t handle, session->AddExecutor(std::move(executor)),
                   ReplyTo(context));
  response->set_aclnn_status(kernels::kAclnnSuccess);
  response->set_workspace_size(workspace_size);
  response->set_executor(handle);
  return Reply(context, absl::OkStatus());
}

absl::Status OperatorService::Launch(
    const v1::ExecuteRequest& request, absl::string_view caller,
    std::optional<absl::string_view> routing_key) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_->Get(request.session(), caller, routing_key));
  return LaunchExecutor(request, *session);
}

grpc::ServerUnaryReactor* OperatorService::Execute(
    grpc::CallbackServerContext* context, const v1::ExecuteRequest* request,
    v1::ExecuteResponse* response) {
  CallLog::NoteSession(context, request->session());
  absl::StatusOr<std::string> caller = Caller(context);
  absl::Status status =
      caller.ok() ? Launch(*request, *caller, SessionRoutingKeyOf(context))
                  : caller.status();
  if (status.ok()) response->set_aclnn_status(kernels::kAclnnSuccess);
  return Reply(context, status);
}

// ExecuteStream: launches arrive as a stream of ExecuteRequests and each is
// answered, in order, by one ExecuteResponse that carries its outcome, so a
// client keeps many launches in flight on one call without a round trip (or
// an HTTP/2 stream) per launch. Reads and writes proceed independently;
// responses wait in a queue while a write is in flight.
class OperatorService::Launcher final
    : public grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteResponse> {
 public:
  Launcher(OperatorService* service, grpc::CallbackServerContext* context)
      : service_(service),
        binding_(service->authenticator_, context),
        caller_(binding_.caller()),
        routing_key_(SessionRoutingKeyOf(context)),
        max_pending_(std::max<size_t>(
            1, service->sessions_->limits().max_pending_replies)) {
    if (!caller_.ok()) {
      Finish(ToGrpcStatus(caller_.status(), context));
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    // Revoked, and the cancellation not here yet: nothing more runs.
    absl::Status status =
        binding_.revoked()
            ? absl::UnauthenticatedError("the call's token was revoked")
            : service_->Launch(request_, *caller_, routing_key_);
    v1::ExecuteResponse response;
    response.set_executor(request_.executor());
    response.set_aclnn_status(kernels::GetAclnnStatus(status));
    if (!status.ok()) {
      response.set_code(static_cast<int32_t>(status.code()));
      response.set_message(Truncated(status.message(), kMaxErrorMessageBytes));
    }
    absl::MutexLock lock(&mu_);
    if (finished_) return;  // Never act on the call after Finish.
    pending_.push_back(std::move(response));
    if (!writing_) WriteFrontLocked();
    // A client that does not read its replies stops being read from: the
    // replies waiting for it stay bounded.
    if (pending_.size() < max_pending_) {
      ReadNextLocked();
    } else {
      read_paused_ = true;
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    pending_.pop_front();
    if (!ok) {
      failed_ = true;
      MaybeFinishLocked();
      return;
    }
    if (read_paused_ && !finished_ && pending_.size() < max_pending_) {
      read_paused_ = false;
      ReadNextLocked();
    }
    // ReadNextLocked lets go of the lock: the launch its read brought in may
    // have started the next write meanwhile (found by the soak: starting it
    // again here aborted the server with TOO_MANY_OPERATIONS).
    if (!pending_.empty() && !writing_ && !finished_) {
      WriteFrontLocked();
    } else {
      MaybeFinishLocked();
    }
  }

  void OnDone() override { delete this; }

 private:
  void WriteFrontLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    StartWrite(&pending_.front());
  }

  void ReadNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    StartReadOutsideLock(*this, &request_, mu_, starting_reads_);
    MaybeFinishLocked();
  }

  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_ || starting_reads_ > 0) return;
    if (failed_ || (reads_done_ && pending_.empty())) {
      finished_ = true;
      Finish(failed_ ? grpc::Status::CANCELLED : grpc::Status::OK);
    }
  }

  OperatorService* const service_;
  const TokenBoundCall binding_;  // Revoking the token ends the call.
  // Whose sessions the launches may name.
  const absl::StatusOr<std::string> caller_;
  const std::optional<std::string> routing_key_;
  const size_t max_pending_;
  v1::ExecuteRequest request_;  // Touched only by the read chain.
  absl::Mutex mu_;
  std::deque<v1::ExecuteResponse> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int starting_reads_ ABSL_GUARDED_BY(mu_) = 0;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerBidiReactor<v1::ExecuteRequest, v1::ExecuteResponse>*
OperatorService::ExecuteStream(grpc::CallbackServerContext* context) {
  return new Launcher(this, context);
}

grpc::ServerUnaryReactor* OperatorService::SetExecutorRepeatable(
    grpc::CallbackServerContext* context,
    const v1::SetExecutorRepeatableRequest* request,
    v1::SetExecutorRepeatableResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  return Reply(context, session->SetExecutorRepeatable(request->executor()));
}

grpc::ServerUnaryReactor* OperatorService::DestroyExecutor(
    grpc::CallbackServerContext* context,
    const v1::DestroyExecutorRequest* request,
    v1::DestroyExecutorResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  return Reply(context, session->DestroyExecutor(request->executor()));
}

namespace {

void FillGraphInfo(uint64_t id, const Graph& graph, v1::GraphInfo* info) {
  info->set_graph(id);
  info->set_tasks(graph.tasks());
  info->set_replays(graph.replays());
  info->set_pending_replays(graph.pending_replays());
}

}  // namespace

grpc::ServerUnaryReactor* OperatorService::ListGraphs(
    grpc::CallbackServerContext* context, const v1::ListGraphsRequest* request,
    v1::ListGraphsResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  for (const auto& [id, graph] : session->AllGraphs()) {
    FillGraphInfo(id, *graph, response->add_graphs());
  }
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OperatorService::DescribeGraph(
    grpc::CallbackServerContext* context,
    const v1::DescribeGraphRequest* request,
    v1::DescribeGraphResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  ASSIGN_OR_RETURN(std::shared_ptr<Graph> graph,
                   session->GetGraph(request->graph()), ReplyTo(context));
  FillGraphInfo(request->graph(), *graph, response->mutable_info());
  for (std::string& line : graph->Describe()) {
    response->add_tasks(std::move(line));
  }
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OperatorService::ReplayGraph(
    grpc::CallbackServerContext* context, const v1::ReplayGraphRequest* request,
    v1::ReplayGraphResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  ASSIGN_OR_RETURN(std::shared_ptr<Stream> stream,
                   session->GetStream(request->stream()), ReplyTo(context));
  // On gRPC's callback thread, which every call needs: no more runs here
  // than a unary Execute would (runtime/executor.h).
  return Reply(context, opserver::ReplayGraph(*session, request->graph(),
                                              *stream, kUnaryReplayLaunches));
}

grpc::ServerUnaryReactor* OperatorService::DestroyGraph(
    grpc::CallbackServerContext* context,
    const v1::DestroyGraphRequest* request,
    v1::DestroyGraphResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  return Reply(context, session->DestroyGraph(request->graph()));
}

grpc::ServerUnaryReactor* OperatorService::Evaluate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  ASSIGN_OR_RETURN(std::string caller, Caller(context), ReplyTo(context));
  // Evaluate needs no session: bound how many run at once. A refused call
  // costs no parse: its request is still raw bytes.
  auto slot = std::make_shared<EvaluateSlot>(
      evaluating_, sessions_->limits().max_concurrent_evaluates);
  if (!slot->ok()) {
    return Reply(context,
                 absl::ResourceExhaustedError(absl::StrCat(
                     "the server already runs ",
                     sessions_->limits().max_concurrent_evaluates,
                     " Evaluate calls (--max_concurrent_evaluates); retry, or "
                     "use a session with GetWorkspaceSize/Execute")));
  }
  // Parsed, computed and answered on a worker, in its caller's turn.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status queued =
      workers_->Submit(absl::StrCat("caller:", caller),
                       [this, reactor, context, request, response, slot] {
                         reactor->Finish(ToGrpcStatus(
                             EvaluateBytes(*request, response), context));
                       });
  if (!queued.ok()) reactor->Finish(ToGrpcStatus(queued, context));
  return reactor;
}

grpc::ServerUnaryReactor* OperatorService::LaunchCallback(
    grpc::CallbackServerContext* context,
    const v1::LaunchCallbackRequest* request,
    v1::LaunchCallbackResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  ASSIGN_OR_RETURN(Session::StreamSlot held,
                   session->TakeStreamSynchronizeSlot(request->stream()),
                   ReplyTo(context));
  // The answer is the notice. An abandoned call stops waiting at once; the
  // callback stays on its stream (there is no taking it back).
  return StartSynchronize(
      context, std::move(held.slot),
      [session, stream = std::move(held.stream), request](
          SynchronizeAnswer answer) -> absl::StatusOr<std::function<void()>> {
        RETURN_IF_ERROR(session->callbacks().Queue(
            *stream, request->id(), request->block(), std::move(answer)));
        return std::function<void()>();
      });
}

grpc::ServerUnaryReactor* OperatorService::ReleaseCallback(
    grpc::CallbackServerContext* context,
    const v1::ReleaseCallbackRequest* request,
    v1::ReleaseCallbackResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  if (!session->callbacks().Release(request->id())) {
    return Reply(context,
                 absl::NotFoundError(absl::StrCat(
                     "no blocking callback ", request->id(),
                     " holds a stream of the session (released already, "
                     "past --callback_block_timeout_ms, or never queued)")));
  }
  return Reply(context, absl::OkStatus());
}

absl::Status OperatorService::EvaluateBytes(const grpc::ByteBuffer& request,
                                            grpc::ByteBuffer* response) {
  v1::EvaluateRequest parsed;
  RETURN_IF_ERROR(
      ParseRaw(request, &parsed, "the request is not an EvaluateRequest"));
  // The caller's device: one tenant filling device 0 leaves Evaluate on
  // the others working.
  ASSIGN_OR_RETURN(Device * device, sessions_->FindDevice(parsed.device()));
  ASSIGN_OR_RETURN(v1::ValueTensor output,
                   RunEvaluate(parsed, device, limits_.max_values));
  v1::EvaluateResponse answer;
  answer.set_aclnn_status(kernels::kAclnnSuccess);
  *answer.mutable_output() = std::move(output);
  return SerializeRaw(answer, response);
}

}  // namespace opserver
