// The remote Session's operators (phase one, launches, executors), device
// memory operations and events (client.h).

#include "client/client.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client_calls.h"
#include "client/dial_address.h"
#include "common/data_path.h"
#include "common/event_flags.h"
#include "common/listen_address.h"
#include "common/malloc_tuning.h"
#include "common/op_call.h"
#include "common/session_routing.h"
#include "common/status_macros.h"
#include "common/trailers.h"
#include "common/task_position.h"
#include "grpcpp/grpcpp.h"
#include "kernels/aclnn_status.h"
#include "kernels/validate.h"

namespace opserver {
namespace remote {

absl::StatusOr<Executor> Session::GetWorkspaceSize(
    const std::string& op, const v1::OpParams& params,
    const std::map<std::string, TensorDesc>& tensors) {
  v1::GetWorkspaceSizeRequest request;
  request.set_session(token_);
  request.set_op(op);
  *request.mutable_params() = params;
  for (const auto& [name, desc] : tensors) {
    (*request.mutable_tensors())[name] = desc.ToProto();
  }
  // An operator this client's table does not know goes to the server.
  if (channel_ != nullptr && kernels::FindOp(op) != nullptr) {
    return PlanLocally(std::move(request));
  }
  RETURN_IF_ERROR(Ordered());
  v1::GetWorkspaceSizeResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_,
                        &v1::Operators::Stub::GetWorkspaceSize, request,
                        &response, absl::StrCat(op, " GetWorkspaceSize")));
  return Executor(this, response.executor(), response.workspace_size());
}

// The typed wrappers of op_signatures.h: each sets its parameters and
// names its tensors for GetWorkspaceSize.
#define OPSERVER_SET_PARAM_FLOAT(field) params.set_##field(field);
#define OPSERVER_SET_PARAM_DOUBLE(field) params.set_##field(field);
#define OPSERVER_SET_PARAM_BOOL(field) params.set_##field(field);
#define OPSERVER_SET_PARAM_SCALAR(field)                          \
  params.mutable_##field()->set_dtype(ToProtoDType(field.dtype)); \
  params.mutable_##field()->set_value(field.value);
#define OPSERVER_SET_PARAM(KIND, aclnn_name, field) \
  OPSERVER_SET_PARAM_##KIND(field)
#define OPSERVER_SESSION_OP_DEFINITION(Name, in0, in1, out, PARAMS)   \
  absl::StatusOr<Executor> Session::Name(                             \
      const TensorDesc& in0,                                          \
      const TensorDesc& in1 PARAMS(OPSERVER_SESSION_PARAM),           \
      const TensorDesc& out) {                                        \
    v1::OpParams params;                                              \
    PARAMS(OPSERVER_SET_PARAM)                                        \
    return GetWorkspaceSize(#Name, params,                            \
                            {{#in0, in0}, {#in1, in1}, {#out, out}}); \
  }
OPSERVER_OPERATORS(OPSERVER_SESSION_OP_DEFINITION)
#undef OPSERVER_SESSION_OP_DEFINITION
#undef OPSERVER_SET_PARAM
#undef OPSERVER_SET_PARAM_SCALAR
#undef OPSERVER_SET_PARAM_BOOL
#undef OPSERVER_SET_PARAM_DOUBLE
#undef OPSERVER_SET_PARAM_FLOAT

absl::Status Session::ExecuteHandle(uint64_t executor, uint64_t stream,
                                    uint64_t workspace,
                                    uint64_t workspace_offset,
                                    uint64_t workspace_size) {
  if (channel_ != nullptr && executor >= kClientExecutorBase) {
    ASSIGN_OR_RETURN(v1::PipelineCommand command,
                     LaunchCommand(executor, stream, workspace,
                                   workspace_offset, workspace_size));
    return channel_->Send(std::move(command));
  }
  RETURN_IF_ERROR(Ordered());
  v1::ExecuteRequest request;
  request.set_session(token_);
  request.set_executor(executor);
  request.set_workspace_buffer(workspace);
  request.set_workspace_offset(workspace_offset);
  request.set_workspace_size(workspace_size);
  request.set_stream(stream);
  v1::ExecuteResponse response;
  return Unary(*client_, routing_key_, &v1::Operators::Stub::Execute, request,
               &response, "Execute");
}

absl::StatusOr<v1::PipelineCommand> Session::LaunchCommand(
    uint64_t executor, uint64_t stream, uint64_t workspace,
    uint64_t workspace_offset, uint64_t workspace_size) {
  RETURN_IF_ERROR(CheckPipelined("Execute"));
  v1::PipelineCommand command;
  // The channel names the session once, not each launch.
  v1::ExecuteRequest& request = *command.mutable_launch();
  request.set_executor(executor);
  request.set_workspace_buffer(workspace);
  request.set_workspace_offset(workspace_offset);
  request.set_workspace_size(workspace_size);
  request.set_stream(stream);
  // Executors planned by unary calls are not known here: the server checks
  // them.
  if (executor < kClientExecutorBase) return command;
  // The checks the server would make first, so their errors are
  // immediate; the server makes them again.
  absl::MutexLock lock(&handles_mu_);
  if (stream != 0 && !streams_.contains(stream)) {
    return UnknownHandle("Execute: ", "stream", stream);
  }
  auto it = executors_.find(executor);
  if (it == executors_.end()) {
    return kernels::AclnnError(
        kernels::kAclnnErrInnerNullptr,
        executor < next_executor_ ? absl::StatusCode::kFailedPrecondition
                                  : absl::StatusCode::kNotFound,
        absl::StrCat("Execute: executor ", executor,
                     executor < next_executor_
                         ? " was already consumed by a launch or "
                           "destroyed; call GetWorkspaceSize again, or "
                           "make it repeatable before its first launch"
                         : " was never created in this session"));
  }
  const uint64_t needed = it->second.workspace_size;
  if (needed > 0) {
    if (workspace_size < needed) {
      return kernels::ParamInvalid(absl::StrCat(
          "Execute: workspaceSize ", workspace_size, " is smaller than the ",
          needed, " bytes GetWorkspaceSize reported"));
    }
    auto buffer = buffer_sizes_.find(workspace);
    if (buffer == buffer_sizes_.end()) {
      return kernels::AclnnError(
          kernels::kAclnnErrParamInvalid, absl::StatusCode::kNotFound,
          absl::StrCat("Execute: workspace: no buffer ", workspace,
                       " in this session (never created, freed, or "
                       "another session's)"));
    }
    if (workspace_offset > buffer->second ||
        workspace_size > buffer->second - workspace_offset) {
      return kernels::ParamInvalid(
          absl::StrCat("Execute: workspace: bytes [", workspace_offset, ", +",
                       workspace_size, ") run past the end of its buffer of ",
                       buffer->second, " bytes"));
    }
  }
  if (!it->second.repeatable) executors_.erase(it);
  return command;
}

absl::Status Session::SetExecutorRepeatable(uint64_t executor) {
  if (channel_ != nullptr && executor >= kClientExecutorBase) {
    {
      absl::MutexLock lock(&handles_mu_);
      auto it = executors_.find(executor);
      if (it == executors_.end()) {
        return kernels::AclnnError(
            kernels::kAclnnErrInnerNullptr, absl::StatusCode::kNotFound,
            absl::StrCat("SetExecutorRepeatable: no executor ", executor,
                         " in this session (never created, already "
                         "consumed, or destroyed)"));
      }
      it->second.repeatable = true;
    }
    v1::PipelineCommand command;
    command.set_set_executor_repeatable(executor);
    return channel_->Send(std::move(command));
  }
  RETURN_IF_ERROR(Ordered());
  v1::SetExecutorRepeatableRequest request;
  request.set_session(token_);
  request.set_executor(executor);
  v1::SetExecutorRepeatableResponse response;
  return Unary(*client_, routing_key_,
               &v1::Operators::Stub::SetExecutorRepeatable, request, &response,
               "SetExecutorRepeatable");
}

absl::Status Session::DestroyExecutor(uint64_t executor) {
  if (channel_ != nullptr && executor >= kClientExecutorBase) {
    {
      absl::MutexLock lock(&handles_mu_);
      if (executors_.erase(executor) == 0) {
        return kernels::AclnnError(
            kernels::kAclnnErrInnerNullptr, absl::StatusCode::kNotFound,
            absl::StrCat("DestroyExecutor: no executor ", executor,
                         " in this session (never created, already "
                         "consumed, or destroyed)"));
      }
    }
    v1::PipelineCommand command;
    command.set_destroy_executor(executor);
    return channel_->Send(std::move(command));
  }
  RETURN_IF_ERROR(Ordered());
  v1::DestroyExecutorRequest request;
  request.set_session(token_);
  request.set_executor(executor);
  v1::DestroyExecutorResponse response;
  return Unary(*client_, routing_key_, &v1::Operators::Stub::DestroyExecutor,
               request, &response, "DestroyExecutor");
}

// ------------------------------------------------- memory ops and events

absl::Status Session::Memset(uint64_t buffer, uint64_t offset, uint64_t size,
                             uint8_t value, uint64_t stream) {
  if (channel_ != nullptr) {
    ASSIGN_OR_RETURN(v1::PipelineCommand command,
                     MemsetCommand(buffer, offset, size, value, stream));
    return channel_->Send(std::move(command));
  }
  v1::MemsetRequest request;
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_size(size);
  request.set_value(value);
  request.set_stream(stream);
  request.set_session(token_);
  v1::MemsetResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::Memset, request,
               &response, "Memset");
}

absl::Status Session::CopyOnDevice(uint64_t dst_buffer, uint64_t dst_offset,
                                   uint64_t src_buffer, uint64_t src_offset,
                                   uint64_t size, uint64_t stream) {
  if (channel_ != nullptr) {
    ASSIGN_OR_RETURN(v1::PipelineCommand command,
                     CopyCommand(dst_buffer, dst_offset, src_buffer, src_offset,
                                 size, stream));
    return channel_->Send(std::move(command));
  }
  v1::CopyDeviceToDeviceRequest request;
  request.set_dst_buffer(dst_buffer);
  request.set_dst_offset(dst_offset);
  request.set_src_buffer(src_buffer);
  request.set_src_offset(src_offset);
  request.set_size(size);
  request.set_stream(stream);
  request.set_session(token_);
  v1::CopyDeviceToDeviceResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::CopyDeviceToDevice,
               request, &response, "CopyDeviceToDevice");
}

absl::Status Session::CheckLocalEvent(absl::string_view what, uint64_t event,
                                      std::optional<uint64_t> stream) {
  absl::MutexLock lock(&handles_mu_);
  if (!events_.contains(event)) {
    return UnknownHandle(absl::StrCat(what, ": "), "event", event);
  }
  if (stream.has_value() && *stream != 0 && !streams_.contains(*stream)) {
    return UnknownHandle(absl::StrCat(what, ": "), "stream", *stream);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Session::CreateEvent(uint32_t flags) {
  if (channel_ != nullptr) {
    // The server's rule, so the error is immediate; the server checks
    // again.
    RETURN_IF_ERROR(CheckEventFlags(flags), [](absl::Status s) {
      return absl::Status(s.code(), absl::StrCat("CreateEvent: ", s.message()));
    });
    absl::MutexLock lock(&handles_mu_);
    const uint64_t id = next_executor_++;
    v1::PipelineCommand command;
    command.mutable_create_event()->set_event(id);
    command.mutable_create_event()->set_flags(flags);
    // Sent under the lock that chose the id: the server takes ids only in
    // increasing order (see PlanLocally).
    RETURN_IF_ERROR(channel_->Send(std::move(command)));
    events_.insert(id);
    return id;
  }
  v1::CreateEventRequest request;
  request.set_session(token_);
  request.set_flags(flags);
  v1::CreateEventResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_, &v1::Runtime::Stub::CreateEvent,
                        request, &response, "CreateEvent"));
  return response.event();
}

absl::Status Session::DestroyEvent(uint64_t event) {
  if (channel_ != nullptr) {
    {
      absl::MutexLock lock(&handles_mu_);
      if (events_.erase(event) == 0) {
        return UnknownHandle("DestroyEvent: ", "event", event);
      }
    }
    v1::PipelineCommand command;
    command.set_destroy_event(event);
    return channel_->Send(std::move(command));
  }
  v1::DestroyEventRequest request;
  request.set_session(token_);
  request.set_event(event);
  v1::DestroyEventResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::DestroyEvent,
               request, &response, "DestroyEvent");
}

absl::Status Session::RecordEvent(uint64_t event, uint64_t stream) {
  if (channel_ != nullptr) {
    ASSIGN_OR_RETURN(v1::PipelineCommand command,
                     RecordEventCommand(event, stream));
    return channel_->Send(std::move(command));
  }
  v1::RecordEventRequest request;
  request.set_event(event);
  request.set_stream(stream);
  request.set_session(token_);
  v1::RecordEventResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::RecordEvent, request,
               &response, "RecordEvent");
}

absl::Status Session::StreamWaitEvent(uint64_t stream, uint64_t event) {
  if (channel_ != nullptr) {
    ASSIGN_OR_RETURN(v1::PipelineCommand command,
                     WaitEventCommand(stream, event));
    return channel_->Send(std::move(command));
  }
  v1::StreamWaitEventRequest request;
  request.set_stream(stream);
  request.set_event(event);
  request.set_session(token_);
  v1::StreamWaitEventResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::StreamWaitEvent,
               request, &response, "StreamWaitEvent");
}

absl::Status Session::ResetEvent(uint64_t event, uint64_t stream) {
  v1::ResetEventRequest request;
  request.set_event(event);
  request.set_stream(stream);
  if (channel_ != nullptr) {
    RETURN_IF_ERROR(CheckLocalEvent("ResetEvent", event, stream));
    v1::PipelineCommand command;
    *command.mutable_reset_event() = std::move(request);
    return channel_->Send(std::move(command));
  }
  request.set_session(token_);
  v1::ResetEventResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::ResetEvent, request,
               &response, "ResetEvent");
}

absl::StatusOr<uint64_t> Session::LaunchCallback(
    uint64_t stream, bool block,
    std::function<void(uint64_t, absl::Status)> reached) {
  if (channel_ == nullptr) {
    return absl::FailedPreconditionError(
        "host callbacks need the command channel (ConnectOptions::pipeline): "
        "the server tells it when a stream reaches one");
  }
  RETURN_IF_ERROR(CheckLocalStream("LaunchCallback", stream));
  return channel_->SendCallback(stream, block, std::move(reached));
}

absl::Status Session::ReleaseCallback(uint64_t id) {
  if (channel_ == nullptr) {
    return absl::FailedPreconditionError(
        "host callbacks need the command channel");
  }
  return channel_->ReleaseCallback(id);
}

absl::Status Session::SetStreamFailureMode(uint64_t stream, bool stop) {
  if (channel_ == nullptr) {
    return absl::FailedPreconditionError(
        "stream failure modes need the command channel "
        "(ConnectOptions::pipeline)");
  }
  RETURN_IF_ERROR(CheckLocalStream("SetStreamFailureMode", stream));
  v1::PipelineCommand command;
  command.mutable_stream_failure_mode()->set_stream(stream);
  command.mutable_stream_failure_mode()->set_stop(stop);
  return channel_->Send(std::move(command));
}

absl::Status Session::SetOpTimeouts(uint64_t execute_ms, uint64_t wait_ms) {
  if (channel_ == nullptr) {
    return absl::FailedPreconditionError(
        "operator time-outs need the command channel "
        "(ConnectOptions::pipeline)");
  }
  if (execute_ms > kMaxOpTimeoutMs || wait_ms > kMaxOpTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "operator time-outs of ", execute_ms, " ms (execute) and ", wait_ms,
        " ms (wait): at most ", kMaxOpTimeoutMs, " ms each (0: none)"));
  }
  v1::PipelineCommand command;
  command.mutable_op_timeouts()->set_execute_timeout_ms(execute_ms);
  command.mutable_op_timeouts()->set_wait_timeout_ms(wait_ms);
  return channel_->Send(std::move(command));
}

absl::StatusOr<bool> Session::QueryEvent(uint64_t event) {
  // The records issued before this call are on the server first.
  RETURN_IF_ERROR(Ordered());
  v1::QueryEventRequest request;
  request.set_session(token_);
  request.set_event(event);
  v1::QueryEventResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_, &v1::Runtime::Stub::QueryEvent,
                        request, &response, "QueryEvent"));
  return response.complete();
}

absl::Status Session::SynchronizeEvent(uint64_t event) {
  if (channel_ != nullptr) {
    RETURN_IF_ERROR(CheckLocalEvent("SynchronizeEvent", event, std::nullopt));
    return channel_->FenceEvent(event);
  }
  v1::SynchronizeEventRequest request;
  request.set_session(token_);
  request.set_event(event);
  v1::SynchronizeEventResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::SynchronizeEvent,
               request, &response, "SynchronizeEvent", /*wait=*/true);
}

absl::StatusOr<float> Session::EventElapsedMs(uint64_t start, uint64_t end) {
  RETURN_IF_ERROR(Ordered());
  v1::EventElapsedTimeRequest request;
  request.set_session(token_);
  request.set_start(start);
  request.set_end(end);
  v1::EventElapsedTimeResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_,
                        &v1::Runtime::Stub::EventElapsedTime, request,
                        &response, "EventElapsedTime"));
  return response.ms();
}

}  // namespace remote
}  // namespace opserver
