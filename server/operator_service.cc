#include "server/operator_service.h"

#include <algorithm>
#include <atomic>
#include <cmath>
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
#include "kernels/tensor.h"
#include "server/auth.h"
#include "server/grpc_status_util.h"
#include "server/log.h"
#include "common/values.h"

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

absl::StatusOr<const OpInfo*> FindOperator(const std::string& name) {
  const OpInfo* info = kernels::FindOp(name);
  if (info != nullptr) return info;
  std::vector<std::string> names;
  for (const OpInfo& op : kernels::OpRegistry()) {
    names.emplace_back(op.name);
  }
  return kernels::ParamInvalid(absl::StrCat(
      "unknown operator '", name, "'; known: ", absl::StrJoin(names, ", ")));
}

absl::StatusOr<DType> ToDType(int32_t value, absl::string_view what) {
  if (!kernels::IsKnownDType(value)) {
    return kernels::ParamInvalid(
        absl::StrCat(what, " has dtype ", value, ", not an aclDataType"));
  }
  return static_cast<DType>(value);
}

absl::Status SetParams(const OpInfo& op, const v1::OpParams& in,
                       kernels::OpParams* out) {
  out->threshold = in.threshold();
  out->lambd = in.lambd();
  out->self_is_result = in.self_is_result();
  out->scale = in.scale();
  if (op.kind == kernels::OpKind::kLeakyReluBackward) {
    if (!in.has_negative_slope()) {
      return kernels::ParamNullptr(
          "negativeSlope is missing (params.negative_slope)");
    }
    absl::StatusOr<DType> dtype =
        ToDType(in.negative_slope().dtype(), "negativeSlope");
    if (!dtype.ok()) return dtype.status();
    const double v = in.negative_slope().value();
    if (kernels::IsFloating(*dtype)) {
      out->negative_slope = kernels::Scalar::Float(v, *dtype);
    } else if (*dtype == DType::kBool) {
      out->negative_slope = kernels::Scalar::Bool(v != 0);
    } else {
      // Range first: casting NaN or 1e300 to int64 is undefined (finding 14).
      if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0) ||
          v != std::trunc(v)) {
        return kernels::ParamInvalid(absl::StrCat(
            "negativeSlope has integer dtype ", kernels::DTypeName(*dtype),
            " but value ", v, " is not an integer"));
      }
      out->negative_slope =
          kernels::Scalar::Int(static_cast<int64_t>(v), *dtype);
    }
  }
  return absl::OkStatus();
}

// The work one launch may ask for is bounded (review finding 2): 161002
// with RESOURCE_EXHAUSTED past --max_launch_elements.
absl::Status CheckLaunchSize(const kernels::Plan& plan,
                             const SessionLimits& limits) {
  if (static_cast<uint64_t>(plan.numel()) <= limits.max_launch_elements) {
    return absl::OkStatus();
  }
  return kernels::AclnnError(
      kernels::kAclnnErrParamInvalid, absl::StatusCode::kResourceExhausted,
      absl::StrCat("the launch computes ", plan.numel(),
                   " elements; one launch may compute at most ",
                   limits.max_launch_elements,
                   " (--max_launch_elements): split the tensor"));
}

// Puts `view` into the slot of argument `name`: the table lists arguments
// as (gradOutput, self or mask, out or gradInput).
absl::Status PlaceTensor(const OpInfo& op, const std::string& name,
                         kernels::TensorView view, kernels::OpCall* call) {
  for (size_t i = 0; i < op.tensors.size(); ++i) {
    if (op.tensors[i].name != name) continue;
    std::optional<kernels::TensorView>* slots[] = {&call->grad_output,
                                                   &call->self, &call->out};
    *slots[i] = std::move(view);
    return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (const auto& arg : op.tensors) names.emplace_back(arg.name);
  return kernels::ParamInvalid(
      absl::StrCat(op.name, " has no tensor argument '", name,
                   "'; its arguments are ", absl::StrJoin(names, ", ")));
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

// Device memory owned by one Evaluate call.
class ScratchBuffer {
 public:
  ScratchBuffer(Device* device) : device_(device) {}
  ~ScratchBuffer() {
    if (data_ != nullptr) device_->Deallocate(data_, size_);
  }
  absl::Status Allocate(uint64_t size) {
    // Owner 0: never another caller's bytes.
    absl::StatusOr<void*> data = device_->Allocate(size, /*owner=*/0);
    if (!data.ok()) return data.status();
    data_ = *data;
    size_ = size;
    return absl::OkStatus();
  }
  void* data() const { return data_; }

 private:
  Device* const device_;
  void* data_ = nullptr;
  uint64_t size_ = 0;
};

// Shape of a ValueTensor: at most 8 non-negative dims whose product fits
// `max_values`.
absl::StatusOr<int64_t> CheckValueShape(const v1::ValueTensor& t,
                                        absl::string_view name,
                                        uint32_t max_values) {
  if (t.shape_size() > kernels::kMaxRank) {
    return kernels::ParamInvalid(absl::StrCat(name, " has ", t.shape_size(),
                                              " dims; at most 8 allowed"));
  }
  int64_t numel = 1;
  for (int64_t d : t.shape()) {
    if (d < 0) {
      return kernels::ParamInvalid(
          absl::StrCat(name, " has a negative dimension ", d));
    }
    if (d != 0 && numel > static_cast<int64_t>(max_values) / d) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name, " has more than the ", max_values,
                       " values one call may carry (--max_values)"));
    }
    numel *= d;
  }
  return numel;
}

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
  absl::StatusOr<const OpInfo*> op = FindOperator(request->op());
  if (!op.ok()) return Reply(context, op.status());

  kernels::OpCall call;
  call.op = (*op)->kind;
  if (absl::Status s = SetParams(**op, request->params(), &call.params);
      !s.ok()) {
    return Reply(context, s);
  }
  std::vector<std::shared_ptr<Buffer>> buffers;
  for (const auto& [name, desc] : request->tensors()) {
    absl::StatusOr<std::shared_ptr<Buffer>> buffer =
        (*session)->GetBuffer(desc.buffer());
    if (!buffer.ok()) {
      return Reply(
          context,
          kernels::AclnnError(
              kernels::kAclnnErrParamInvalid, absl::StatusCode::kNotFound,
              absl::StrCat(name, ": ", buffer.status().message())));
    }
    absl::StatusOr<DType> dtype = ToDType(desc.dtype(), name);
    if (!dtype.ok()) return Reply(context, dtype.status());
    if (desc.buffer_offset() > (*buffer)->size()) {
      return Reply(context,
                   kernels::ParamInvalid(absl::StrCat(
                       name, " starts at byte ", desc.buffer_offset(),
                       " of a buffer of ", (*buffer)->size(), " bytes")));
    }
    kernels::TensorView view;
    view.dtype = *dtype;
    view.shape.assign(desc.shape().begin(), desc.shape().end());
    view.strides.assign(desc.strides().begin(), desc.strides().end());
    view.offset = desc.offset();
    view.storage_shape.assign(desc.storage_shape().begin(),
                              desc.storage_shape().end());
    view.data = static_cast<char*>((*buffer)->data()) + desc.buffer_offset();
    const uint64_t available = (*buffer)->size() - desc.buffer_offset();
    if (absl::Status s = kernels::CheckTensorBounds(
            view,
            static_cast<int64_t>(std::min<uint64_t>(available, INT64_MAX)),
            name);
        !s.ok()) {
      return Reply(context, s);
    }
    if (absl::Status s = PlaceTensor(**op, name, std::move(view), &call);
        !s.ok()) {
      return Reply(context, s);
    }
    buffers.push_back(*std::move(buffer));
  }
  absl::StatusOr<kernels::Plan> plan = kernels::PrepareOp(call);
  if (!plan.ok()) return Reply(context, plan.status());
  if (absl::Status s = CheckLaunchSize(*plan, sessions_->limits()); !s.ok()) {
    return Reply(context, s);
  }
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
  absl::StatusOr<const OpInfo*> op = FindOperator(request->op());
  if (!op.ok()) return Reply(context, op.status());
  kernels::OpCall call;
  call.op = (*op)->kind;
  if (absl::Status s = SetParams(**op, request->params(), &call.params);
      !s.ok()) {
    return Reply(context, s);
  }
  for (const auto& [name, t] : request->inputs()) {
    bool known = false;
    for (const auto& arg : (*op)->tensors) {
      known |= !arg.is_output && arg.name == name;
    }
    if (!known) {
      return Reply(context, kernels::ParamInvalid(absl::StrCat(
                                (*op)->name, " has no input '", name, "'")));
    }
  }
  std::vector<std::unique_ptr<ScratchBuffer>> scratch;
  void* output_data = nullptr;
  int64_t output_numel = 0;
  DType output_dtype = DType::kFloat;
  for (const auto& arg : (*op)->tensors) {
    const std::string name(arg.name);
    const v1::ValueTensor* t = nullptr;
    if (arg.is_output) {
      if (request->has_output()) t = &request->output();
    } else {
      auto it = request->inputs().find(name);
      if (it != request->inputs().end()) t = &it->second;
    }
    if (t == nullptr) continue;  // PrepareOp reports the missing argument.
    absl::StatusOr<DType> dtype = ToDType(t->dtype(), name);
    if (!dtype.ok()) return Reply(context, dtype.status());
    absl::StatusOr<int64_t> numel =
        CheckValueShape(*t, name, limits_.max_values);
    if (!numel.ok()) return Reply(context, numel.status());
    std::string bytes;
    if (arg.is_output) {
      bytes.assign(*numel * kernels::DTypeSize(*dtype), '\0');
    } else {
      if (t->values_size() != *numel) {
        return Reply(context,
                     kernels::ParamInvalid(absl::StrCat(
                         name, " has shape of ", *numel, " elements but ",
                         t->values_size(), " values")));
      }
      absl::StatusOr<std::string> encoded = EncodeValues(
          *dtype, absl::MakeConstSpan(t->values().data(), t->values_size()));
      if (!encoded.ok()) {
        return Reply(context, kernels::ParamInvalid(absl::StrCat(
                                  name, ": ", encoded.status().message())));
      }
      bytes = *std::move(encoded);
    }
    scratch.push_back(std::make_unique<ScratchBuffer>(device_));
    if (absl::Status s = scratch.back()->Allocate(bytes.size()); !s.ok()) {
      return Reply(context, s);
    }
    device_->CopyToDevice(scratch.back()->data(), bytes.data(), bytes.size());
    kernels::TensorView view;
    view.dtype = *dtype;
    view.shape.assign(t->shape().begin(), t->shape().end());
    view.data = scratch.back()->data();
    if (arg.is_output) {
      output_data = view.data;
      output_numel = *numel;
      output_dtype = *dtype;
    }
    if (absl::Status s = PlaceTensor(**op, name, std::move(view), &call);
        !s.ok()) {
      return Reply(context, s);
    }
  }
  absl::StatusOr<kernels::Plan> plan = kernels::PrepareOp(call);
  if (!plan.ok()) return Reply(context, plan.status());
  ScratchBuffer workspace(device_);
  if (plan->workspace_size() > 0) {
    if (absl::Status s = workspace.Allocate(plan->workspace_size()); !s.ok()) {
      return Reply(context, s);
    }
  }
  if (absl::Status s =
          device_->Launch(*plan, workspace.data(), plan->workspace_size());
      !s.ok()) {
    return Reply(context, s);
  }
  std::string host(output_numel * kernels::DTypeSize(output_dtype), '\0');
  device_->CopyFromDevice(host.data(), output_data, host.size());
  std::vector<double> values =
      DecodeValues(output_dtype, host.data(), output_numel);
  response->set_aclnn_status(kernels::kAclnnSuccess);
  v1::ValueTensor* out = response->mutable_output();
  out->set_dtype(static_cast<v1::DataType>(output_dtype));
  *out->mutable_shape() = request->output().shape();
  out->mutable_values()->Add(values.begin(), values.end());
  return Reply(context, absl::OkStatus());
}

}  // namespace opserver
