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
#include "common/values.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "server/auth.h"
#include "server/grpc_status_util.h"
#include "server/launch.h"
#include "server/log.h"
#include "server/op_requests.h"
#include "server/pipeline.h"

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

// Starts `reactor`'s next read outside `mu` (the reaction may run inline
// on this thread and take `mu`), counting it in `starting` meanwhile so the
// reactor does not Finish before StartRead has returned; the caller's
// finish check must treat `starting` > 0 as "not yet". Two can overlap: the
// reaction to this read may start the next one before this returns.
template <typename Reactor, typename Request>
void StartReadOutsideLock(Reactor& reactor, Request* request, absl::Mutex& mu,
                          int& starting) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  ++starting;
  mu.Unlock();
  reactor.StartRead(request);
  mu.Lock();
  --starting;
}

// Holds one of `max` slots of `counter` while alive, if one was free.
class EvaluateSlot {
 public:
  EvaluateSlot(std::atomic<uint32_t>* counter, uint32_t max)
      : counter_(counter), ok_(counter->fetch_add(1) < max) {}
  ~EvaluateSlot() { counter_->fetch_sub(1); }
  bool ok() const { return ok_; }

 private:
  std::atomic<uint32_t>* const counter_;
  const bool ok_;
};

}  // namespace

OperatorService::OperatorService(Device* device, SessionManager* sessions,
                                 TransferLimits limits,
                                 const Authenticator* authenticator)
    : device_(device),
      sessions_(sessions),
      limits_(limits),
      authenticator_(authenticator) {}

grpc::ServerUnaryReactor* OperatorService::ListOperators(
    grpc::CallbackServerContext* context,
    const v1::ListOperatorsRequest* /*request*/,
    v1::ListOperatorsResponse* response) {
  for (const OpInfo& op : kernels::OpRegistry()) {
    Describe(op, response->add_operators());
  }
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OperatorService::GetWorkspaceSize(
    grpc::CallbackServerContext* context,
    const v1::GetWorkspaceSizeRequest* request,
    v1::GetWorkspaceSizeResponse* response) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      SessionOf(context, request->session());
  if (!session.ok()) return Reply(context, session.status());
  absl::StatusOr<std::shared_ptr<Executor>> executor = PlanExecutor(
      *request, **session, sessions_->limits().max_launch_elements);
  if (!executor.ok()) return Reply(context, executor.status());
  const uint64_t workspace_size = (*executor)->plan.workspace_size();
  absl::StatusOr<uint64_t> handle =
      (*session)->AddExecutor(*std::move(executor));
  if (!handle.ok()) return Reply(context, handle.status());
  response->set_aclnn_status(kernels::kAclnnSuccess);
  response->set_workspace_size(workspace_size);
  response->set_executor(*handle);
  return Reply(context, absl::OkStatus());
}

absl::Status OperatorService::Launch(const v1::ExecuteRequest& request,
                                     absl::string_view caller) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      sessions_->Get(request.session(), caller);
  if (!session.ok()) return session.status();
  return LaunchExecutor(request, **session);
}

grpc::ServerUnaryReactor* OperatorService::Execute(
    grpc::CallbackServerContext* context, const v1::ExecuteRequest* request,
    v1::ExecuteResponse* response) {
  absl::StatusOr<std::string> caller = Caller(context);
  absl::Status status =
      caller.ok() ? Launch(*request, *caller) : caller.status();
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
    absl::Status status = service_->Launch(request_, *caller_);
    v1::ExecuteResponse response;
    response.set_executor(request_.executor());
    response.set_aclnn_status(kernels::GetAclnnStatus(status));
    if (!status.ok()) {
      response.set_code(static_cast<int32_t>(status.code()));
      response.set_message(
          Truncated(status.message(), kMaxErrorMessageBytes));
    }
    absl::MutexLock lock(&mu_);
    if (finished_) return;  // Never act on the call after Finish.
    pending_.push_back(std::move(response));
    if (!writing_) WriteFrontLocked();
    // A client that does not read its replies stops being read from: the
    // replies waiting for it stay bounded (review finding 6).
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

// Pipeline: batches of commands in, acknowledgements and fence results out
// (CommandPipeline applies them). One batch is applied at a time, in order;
// the next is read once it has been, so a client that sends faster than
// the session runs is held back by HTTP/2 flow control, and the server
// keeps one batch per channel. Events coalesce: the acknowledgement and
// the fence results that arrive while a write is in flight go out together
// in the next one, so at most two events exist at once.
class OperatorService::Pipeliner final
    : public grpc::ServerBidiReactor<v1::PipelineRequest, v1::PipelineEvent> {
 public:
  Pipeliner(OperatorService* service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        binding_(service->authenticator_, context),
        caller_(binding_.caller()),
        pipeline_(service->sessions_->limits(),
                  service->sessions_->limits().max_pending_replies,
                  [this](uint64_t id, absl::Status status) {
                    FenceDone(id, std::move(status));
                  }) {
    if (!caller_.ok()) {
      Finish(ToGrpcStatus(caller_.status(), context));
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (!ok) {
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    if (session_id_.empty()) {
      // The first request opens the channel on its session.
      session_id_ = request_.session();
      if (absl::Status s = LookUpLocked(); !s.ok()) return;
      if (request_.commands_size() == 0) {
        session_ = nullptr;
        AckLocked();
        ReadNextLocked();
        return;
      }
    } else if (absl::Status s = LookUpLocked(); !s.ok()) {
      return;
    }
    in_batch_ = true;
    position_ = 0;
    ProcessLocked();
  }

  void OnWriteDone(bool ok) override {
    size_t fences = 0;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      fences = written_fences_;
      written_fences_ = 0;
      if (!ok) {
        failed_ = true;
        fences = SIZE_MAX;  // Nothing more is written: wake a waiting batch.
      } else if (pending_.has_value() && !finished_) {
        WriteLocked();
      }
      MaybeFinishLocked();
    }
    // May resume a batch waiting for fence room (outside the lock: the
    // resumption takes it).
    if (fences > 0) pipeline_.FencesWritten(fences);
  }

  // The client went away: a batch waiting for room stops where it is.
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      failed_ = true;
    }
    pipeline_.FencesWritten(SIZE_MAX);
  }

  void OnDone() override {
    { absl::MutexLock lock(&mu_); }  // A FenceDone may be leaving.
    delete this;
  }

 private:
  // Finds the session (marking it used); a closed or foreign one ends the
  // call with NOT_FOUND once nothing of it is pending.
  absl::Status LookUpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<std::shared_ptr<Session>> session =
        service_->sessions_->Get(session_id_, *caller_);
    if (!session.ok()) {
      end_status_ = session.status();
      failed_ = true;
      MaybeFinishLocked();
      return session.status();
    }
    session_ = *std::move(session);
    return absl::OkStatus();
  }

  // Applies the current batch from position_ until it is done or must
  // wait; a resumption while this runs makes it go round again.
  void ProcessLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (processing_) {
      rerun_ = true;
      return;
    }
    processing_ = true;
    do {
      rerun_ = false;
      if (failed_) {
        // Nobody will hear about the rest of the batch.
        in_batch_ = false;
        session_ = nullptr;
        processing_ = false;
        MaybeFinishLocked();
        return;
      }
      const size_t from = position_;
      std::shared_ptr<Session> session = session_;
      mu_.Unlock();
      const size_t next =
          pipeline_.Apply(*session, request_.commands(), from, [this] {
            absl::MutexLock lock(&mu_);
            if (in_batch_) ProcessLocked();
          });
      mu_.Lock();
      for (size_t i = from; i < next; ++i) {
        if (request_.commands(static_cast<int>(i)).has_fence()) ++fences_out_;
      }
      acknowledged_ += next - from;
      position_ = next;
      if (next == static_cast<size_t>(request_.commands_size())) {
        in_batch_ = false;
        session_ = nullptr;
        processing_ = false;
        AckLocked();
        if (!failed_) ReadNextLocked();
        MaybeFinishLocked();
        return;
      }
    } while (rerun_);
    processing_ = false;
  }

  // Fence results leave with the next event.
  void FenceDone(uint64_t id, absl::Status status) {
    absl::MutexLock lock(&mu_);
    --fences_out_;
    v1::FenceResult* result = Pending().add_fences();
    result->set_id(id);
    if (!status.ok()) {
      result->set_code(static_cast<int32_t>(status.code()));
      result->set_aclnn_status(kernels::GetAclnnStatus(status));
      result->set_message(Truncated(status.message(), kMaxErrorMessageBytes));
    }
    if (!writing_ && !finished_ && !failed_) WriteLocked();
    MaybeFinishLocked();
  }

  v1::PipelineEvent& Pending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!pending_.has_value()) pending_.emplace();
    return *pending_;
  }

  void AckLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Pending().set_acknowledged(acknowledged_);
    if (!writing_ && !finished_ && !failed_) WriteLocked();
  }

  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    in_flight_ = *std::move(pending_);
    pending_.reset();
    // Later events carry the count too, so a client never sees it go back.
    in_flight_.set_acknowledged(acknowledged_);
    written_fences_ = in_flight_.fences_size();
    StartWrite(&in_flight_);
  }

  void ReadNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    StartReadOutsideLock(*this, &request_, mu_, starting_reads_);
  }

  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_ || starting_reads_ > 0 || in_batch_ ||
        fences_out_ > 0) {
      return;
    }
    if (failed_ || (reads_done_ && !pending_.has_value())) {
      finished_ = true;
      Finish(!end_status_.ok() ? ToGrpcStatus(end_status_, context_)
             : failed_         ? grpc::Status::CANCELLED
                               : grpc::Status::OK);
    }
  }

  OperatorService* const service_;
  grpc::CallbackServerContext* const context_;
  const TokenBoundCall binding_;  // Revoking the token ends the call.
  // Whose session the channel may name.
  const absl::StatusOr<std::string> caller_;
  CommandPipeline pipeline_;
  v1::PipelineRequest request_;  // The batch being applied.
  absl::Mutex mu_;
  std::string session_id_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(mu_);
  bool in_batch_ ABSL_GUARDED_BY(mu_) = false;
  size_t position_ ABSL_GUARDED_BY(mu_) = 0;
  bool processing_ ABSL_GUARDED_BY(mu_) = false;
  bool rerun_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t acknowledged_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fences_out_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<v1::PipelineEvent> pending_ ABSL_GUARDED_BY(mu_);
  v1::PipelineEvent in_flight_ ABSL_GUARDED_BY(mu_);
  size_t written_fences_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int starting_reads_ ABSL_GUARDED_BY(mu_) = 0;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerBidiReactor<v1::PipelineRequest, v1::PipelineEvent>*
OperatorService::Pipeline(grpc::CallbackServerContext* context) {
  return new Pipeliner(this, context);
}

grpc::ServerUnaryReactor* OperatorService::SetExecutorRepeatable(
    grpc::CallbackServerContext* context,
    const v1::SetExecutorRepeatableRequest* request,
    v1::SetExecutorRepeatableResponse* /*response*/) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      SessionOf(context, request->session());
  if (!session.ok()) return Reply(context, session.status());
  return Reply(context, (*session)->SetExecutorRepeatable(request->executor()));
}

grpc::ServerUnaryReactor* OperatorService::DestroyExecutor(
    grpc::CallbackServerContext* context,
    const v1::DestroyExecutorRequest* request,
    v1::DestroyExecutorResponse* /*response*/) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      SessionOf(context, request->session());
  if (!session.ok()) return Reply(context, session.status());
  return Reply(context, (*session)->DestroyExecutor(request->executor()));
}

grpc::ServerUnaryReactor* OperatorService::Evaluate(
    grpc::CallbackServerContext* context, const v1::EvaluateRequest* request,
    v1::EvaluateResponse* response) {
  // Evaluate computes on this RPC thread and needs no session: bound how
  // many run at once (review finding 11).
  EvaluateSlot slot(&evaluating_, sessions_->limits().max_concurrent_evaluates);
  if (!slot.ok()) {
    return Reply(context,
                 absl::ResourceExhaustedError(absl::StrCat(
                     "the server already runs ",
                     sessions_->limits().max_concurrent_evaluates,
                     " Evaluate calls (--max_concurrent_evaluates); retry, or "
                     "use a session with GetWorkspaceSize/Execute")));
  }
  absl::StatusOr<v1::ValueTensor> output =
      RunEvaluate(*request, device_, limits_.max_values);
  if (!output.ok()) return Reply(context, output.status());
  response->set_aclnn_status(kernels::kAclnnSuccess);
  *response->mutable_output() = *std::move(output);
  return Reply(context, absl::OkStatus());
}

}  // namespace opserver
