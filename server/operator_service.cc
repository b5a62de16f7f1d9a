#include "server/operator_service.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "common/values.h"
#include "kernels/tensor.h"
#include "server/auth.h"
#include "server/grpc_status_util.h"
#include "server/log.h"
#include "server/op_requests.h"

namespace opserver {
namespace {

using kernels::DType;
using kernels::OpInfo;

// Launches of at most this many elements run on the RPC thread when their
// stream is idle (microseconds of work).
constexpr int64_t kInlineLaunchElements = 16 * 1024;

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context,
                                const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status, context));
  return reactor;
}

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
      sessions_->Get(request->session(), Caller(context));
  if (!session.ok()) return Reply(context, session.status());
  // The executor holds every buffer its tensors name.
  std::vector<std::shared_ptr<Buffer>> buffers;
  auto lookup = [&](uint64_t handle) -> absl::StatusOr<DeviceBytes> {
    absl::StatusOr<std::shared_ptr<Buffer>> buffer =
        (*session)->GetBuffer(handle);
    if (!buffer.ok()) return buffer.status();
    DeviceBytes bytes{(*buffer)->data(), (*buffer)->size()};
    buffers.push_back(*std::move(buffer));
    return bytes;
  };
  absl::StatusOr<kernels::Plan> plan = PlanGetWorkspaceSize(
      *request, lookup, sessions_->limits().max_launch_elements);
  if (!plan.ok()) return Reply(context, plan.status());
  const uint64_t workspace_size = plan->workspace_size();
  auto executor = std::make_shared<Executor>(
      Executor{*std::move(plan), std::move(buffers)});
  absl::StatusOr<uint64_t> handle =
      (*session)->AddExecutor(std::move(executor));
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
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      (*session)->GetStream(request.stream());
  if (!stream.ok()) return stream.status();
  // Validate against the executor before consuming it, so a bad workspace
  // does not cost the caller its executor.
  absl::StatusOr<std::shared_ptr<Executor>> executor =
      (*session)->ExecutorForLaunch(request.executor(), /*consume=*/false);
  if (!executor.ok()) return executor.status();
  const uint64_t needed = (*executor)->plan.workspace_size();
  std::shared_ptr<Buffer> workspace;
  void* workspace_data = nullptr;
  if (needed > 0) {
    if (request.workspace_size() < needed) {
      return kernels::ParamInvalid(absl::StrCat(
          "workspaceSize ", request.workspace_size(), " is smaller than the ",
          needed, " bytes GetWorkspaceSize reported"));
    }
    absl::StatusOr<std::shared_ptr<Buffer>> buffer =
        (*session)->GetBuffer(request.workspace_buffer());
    if (!buffer.ok()) {
      return kernels::AclnnError(
          kernels::kAclnnErrParamInvalid, absl::StatusCode::kNotFound,
          absl::StrCat("workspace: ", buffer.status().message()));
    }
    if (absl::Status s =
            CheckRange(request.workspace_offset(), request.workspace_size(),
                       (*buffer)->size(), "workspace");
        !s.ok()) {
      return kernels::ParamInvalid(s.message());
    }
    workspace = *std::move(buffer);
    workspace_data =
        static_cast<char*>(workspace->data()) + request.workspace_offset();
  }
  // A tiny launch on an idle stream runs right here: a thread hand-off
  // would cost more than the kernel.
  const bool tiny = (*executor)->plan.numel() <= kInlineLaunchElements;
  // A full or destroyed stream refuses the launch without consuming the
  // executor (Session::Launch).
  return (*session)->Launch(
      request.executor(), **stream, /*inline_if_idle=*/tiny,
      [device = device_, workspace = std::move(workspace), workspace_data,
       size = request.workspace_size()](std::shared_ptr<Executor> executor) {
        return Stream::Task([device, executor = std::move(executor), workspace,
                             workspace_data, size] {
          return device->Launch(executor->plan, workspace_data, size);
        });
      });
}

grpc::ServerUnaryReactor* OperatorService::Execute(
    grpc::CallbackServerContext* context, const v1::ExecuteRequest* request,
    v1::ExecuteResponse* response) {
  absl::Status status = Launch(*request, Caller(context));
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
  Launcher(OperatorService* service, std::string caller)
      : service_(service),
        caller_(std::move(caller)),
        max_pending_(std::max<size_t>(
            1, service->sessions_->limits().max_pending_replies)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    absl::Status status = service_->Launch(request_, caller_);
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

  // Starts the next read outside the lock (its reaction may run inline),
  // keeping Finish from running before StartRead returns. Two can overlap:
  // the reaction to this read may start the next one before this returns.
  void ReadNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++starting_reads_;
    mu_.Unlock();
    StartRead(&request_);
    mu_.Lock();
    --starting_reads_;
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
  const std::string caller_;  // Whose sessions the launches may name.
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
  return new Launcher(this, Caller(context));
}

grpc::ServerUnaryReactor* OperatorService::SetExecutorRepeatable(
    grpc::CallbackServerContext* context,
    const v1::SetExecutorRepeatableRequest* request,
    v1::SetExecutorRepeatableResponse* /*response*/) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      sessions_->Get(request->session(), Caller(context));
  if (!session.ok()) return Reply(context, session.status());
  return Reply(context, (*session)->SetExecutorRepeatable(request->executor()));
}

grpc::ServerUnaryReactor* OperatorService::DestroyExecutor(
    grpc::CallbackServerContext* context,
    const v1::DestroyExecutorRequest* request,
    v1::DestroyExecutorResponse* /*response*/) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      sessions_->Get(request->session(), Caller(context));
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
