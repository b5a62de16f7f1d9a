#include "runtime/launch.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "kernels/validate.h"
#include "runtime/byte_range.h"
#include "runtime/observer.h"
#include "runtime/op_requests.h"
#include "runtime/stream.h"

namespace opserver {

absl::StatusOr<std::shared_ptr<Executor>> PlanExecutor(
    const v1::GetWorkspaceSizeRequest& request, Session& session,
    uint64_t max_launch_elements) {
  if (session.device() == nullptr) {
    return absl::FailedPreconditionError(
        "the session has no device to prepare the launch on");
  }
  if (const kernels::OpInfo* op = kernels::FindOp(request.op());
      op != nullptr) {
    RETURN_IF_ERROR(CheckDeviceSupports(*session.device(), op->kind));
  }
  std::vector<std::shared_ptr<Buffer>> buffers;
  auto lookup = [&](uint64_t handle) -> absl::StatusOr<DeviceBytes> {
    ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, session.GetBuffer(handle));
    DeviceBytes bytes{buffer->data(), buffer->size()};
    buffers.push_back(std::move(buffer));
    return bytes;
  };
  absl::StatusOr<std::unique_ptr<DevicePlan>> plan = PlanGetWorkspaceSize(
      request, lookup, max_launch_elements, *session.device());
  if (!plan.ok()) {
    // Counted under the operator's name only when it has one: a made-up
    // name must not become a label.
    if (const kernels::OpInfo* op = kernels::FindOp(request.op());
        op != nullptr && session.observer() != nullptr) {
      session.observer()->PlanRefused(op->kind,
                                      kernels::GetAclnnStatus(plan.status()));
    }
    return plan.status();
  }
  return std::make_shared<Executor>(
      Executor{*std::move(plan), std::move(buffers)});
}

absl::StatusOr<LaunchWorkspace> CheckWorkspace(
    const v1::ExecuteRequest& request, const Executor& executor,
    Session& session) {
  LaunchWorkspace workspace;
  workspace.size = request.workspace_size();
  const uint64_t needed = executor.plan->workspace_size();
  if (needed == 0) return workspace;
  if (request.workspace_size() < needed) {
    return kernels::ParamInvalid(absl::StrCat(
        "workspaceSize ", request.workspace_size(), " is smaller than the ",
        needed, " bytes GetWorkspaceSize reported"));
  }
  absl::StatusOr<std::shared_ptr<Buffer>> buffer =
      session.GetBuffer(request.workspace_buffer());
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
  workspace.buffer = *std::move(buffer);
  workspace.data =
      static_cast<char*>(workspace.buffer->data()) + request.workspace_offset();
  return workspace;
}

absl::Status LaunchExecutor(const v1::ExecuteRequest& request,
                            Session& session) {
  ASSIGN_OR_RETURN(std::shared_ptr<Stream> stream,
                   session.GetStream(request.stream()));
  // The task holds the device stream, not the Stream, which may be
  // destroyed while the task runs.
  std::shared_ptr<DeviceStream> device_stream = stream->device_stream();
  if (device_stream == nullptr) {
    return absl::FailedPreconditionError(
        "the stream has no device stream (the device could not create one)");
  }
  // Validate against the executor before consuming it, so a bad workspace
  // does not cost the caller its executor.
  ASSIGN_OR_RETURN(
      std::shared_ptr<Executor> executor,
      session.ExecutorForLaunch(request.executor(), /*consume=*/false));
  ASSIGN_OR_RETURN(LaunchWorkspace checked,
                   CheckWorkspace(request, *executor, session));
  std::shared_ptr<Buffer> workspace = std::move(checked.buffer);
  void* workspace_data = checked.data;
  const bool tiny = executor->plan->numel() <= kInlineLaunchElements;
  // A full or destroyed stream refuses the launch without consuming the
  // executor (Session::Launch).
  return session.Launch(
      request.executor(), *stream, /*inline_if_idle=*/tiny,
      [device_stream = std::move(device_stream),
       workspace = std::move(workspace), workspace_data,
       size = request.workspace_size(),
       observer = session.observer()](std::shared_ptr<Executor> executor) {
        if (observer == nullptr) {
          return Stream::Task([device_stream, executor = std::move(executor),
                               workspace, workspace_data, size] {
            return device_stream->Launch(*executor->plan, workspace_data, size);
          });
        }
        const kernels::OpCall& call = executor->plan->call();
        RuntimeObserver::LaunchRecord record = observer->LaunchQueued(
            call.op, call.grad_output.has_value() ? call.grad_output->dtype
                                                  : kernels::DType::kFloat);
        return Stream::Task([device_stream, executor = std::move(executor),
                             workspace, workspace_data, size,
                             record]() mutable {
          record.Started();
          absl::Status status =
              device_stream->Launch(*executor->plan, workspace_data, size);
          record.Finished(kernels::GetAclnnStatus(status));
          return status;
        });
      });
}

}  // namespace opserver
