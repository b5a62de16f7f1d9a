#include "server/pipeline.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/aclnn_status.h"
#include "server/launch.h"
#include "server/stream.h"

namespace opserver {
namespace {

// `error` with `context` before its message and its aclnn status kept, so a
// deferred error says which command it came from.
absl::Status Deferred(const absl::Status& error, absl::string_view context) {
  return kernels::AclnnError(kernels::GetAclnnStatus(error), error.code(),
                             absl::StrCat(context, ": ", error.message()));
}

}  // namespace

CommandPipeline::CommandPipeline(const SessionLimits& limits, size_t max_fences,
                                 FenceDone fence_done)
    : limits_(limits),
      max_fences_(std::max<size_t>(1, max_fences)),
      fence_done_(std::move(fence_done)) {}

size_t CommandPipeline::Apply(
    Session& session,
    const google::protobuf::RepeatedPtrField<v1::PipelineCommand>& commands,
    size_t from, const Resume& resume) {
  for (size_t i = from; i < static_cast<size_t>(commands.size()); ++i) {
    if (!ApplyOne(session, commands[static_cast<int>(i)], resume)) return i;
  }
  return commands.size();
}

bool CommandPipeline::ApplyOne(Session& session,
                               const v1::PipelineCommand& command,
                               const Resume& resume) {
  switch (command.command_case()) {
    case v1::PipelineCommand::kPlan:
      Plan(session, command.plan());
      return true;
    case v1::PipelineCommand::kLaunch: {
      // A fast client waits for a full stream rather than losing launches
      // to its limit: the launch is retried once the stream has run what it
      // holds.
      absl::StatusOr<std::shared_ptr<Stream>> stream =
          session.GetStream(command.launch().stream());
      if (stream.ok() && (*stream)->CheckRoom().code() ==
                             absl::StatusCode::kResourceExhausted) {
        (*stream)->WhenReached(resume);
        return false;
      }
      Launch(session, command.launch());
      return true;
    }
    case v1::PipelineCommand::kDestroyExecutor: {
      const uint64_t id = command.destroy_executor();
      {
        absl::MutexLock lock(&mu_);
        auto it = failed_plans_.find(id);
        if (it != failed_plans_.end()) {
          FailedPlan failed = std::move(it->second);
          failed_plans_.erase(it);
          // A refused plan nobody launched is reported now, once.
          if (!failed.launched && session_error_.ok()) {
            session_error_ = std::move(failed.error);
          }
          return true;
        }
      }
      if (absl::Status s = session.DestroyExecutor(id); !s.ok()) {
        FailSession(Deferred(s, absl::StrCat("DestroyExecutor ", id)));
      }
      return true;
    }
    case v1::PipelineCommand::kSetExecutorRepeatable: {
      const uint64_t id = command.set_executor_repeatable();
      {
        absl::MutexLock lock(&mu_);
        // Its launches report the plan's error.
        if (failed_plans_.contains(id)) return true;
      }
      if (absl::Status s = session.SetExecutorRepeatable(id); !s.ok()) {
        FailSession(Deferred(s, absl::StrCat("SetExecutorRepeatable ", id)));
      }
      return true;
    }
    case v1::PipelineCommand::kFree:
      if (absl::Status s = session.Free(command.free()); !s.ok()) {
        FailSession(Deferred(s, absl::StrCat("Free ", command.free())));
      }
      return true;
    case v1::PipelineCommand::kFence: {
      absl::MutexLock lock(&mu_);
      if (fences_held_ >= max_fences_) {
        fence_waiter_ = resume;
        return false;
      }
      ++fences_held_;
    }
      Fence(session, command.fence());
      return true;
    case v1::PipelineCommand::COMMAND_NOT_SET:
      break;
  }
  FailSession(absl::InvalidArgumentError(
      "an empty or unknown Pipeline command (this server knows plan, "
      "launch, destroy_executor, set_executor_repeatable, free and fence)"));
  return true;
}

void CommandPipeline::Plan(Session& session, const v1::PlanCommand& plan) {
  absl::StatusOr<std::shared_ptr<Executor>> executor =
      PlanExecutor(plan.request(), session, limits_.max_launch_elements);
  absl::Status status =
      executor.ok()
          ? session.AddExecutorAs(plan.executor(), *std::move(executor))
          : executor.status();
  if (status.ok()) return;
  status = Deferred(
      status, absl::StrCat(plan.request().op(), " GetWorkspaceSize (executor ",
                           plan.executor(), ")"));
  absl::MutexLock lock(&mu_);
  // An id in use stays what it is: a second plan under it is the session's
  // error, not its executor's.
  if (failed_plans_.contains(plan.executor()) ||
      session.ExecutorForLaunch(plan.executor(), /*consume=*/false).ok()) {
    if (session_error_.ok()) session_error_ = std::move(status);
    return;
  }
  if (failed_plans_.size() >= limits_.max_handles_per_session) {
    // Its launches then fail as launches of an unknown executor.
    if (session_error_.ok()) session_error_ = std::move(status);
    return;
  }
  failed_plans_[plan.executor()] = FailedPlan{std::move(status), false};
}

void CommandPipeline::Launch(Session& session,
                             const v1::ExecuteRequest& launch) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    auto it = failed_plans_.find(launch.executor());
    if (it != failed_plans_.end()) {
      status = it->second.error;
      it->second.launched = true;
    }
  }
  if (status.ok()) {
    status = LaunchExecutor(launch, session);
    if (status.ok()) return;
    status = Deferred(status,
                      absl::StrCat("launch of executor ", launch.executor()));
  }
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      session.GetStream(launch.stream());
  if (stream.ok()) {
    (*stream)->Fail(std::move(status));
  } else {
    FailSession(std::move(status));
  }
}

void CommandPipeline::Fence(Session& session, const v1::FenceCommand& fence) {
  const uint64_t id = fence.id();
  if (!fence.session()) {
    absl::StatusOr<std::shared_ptr<Stream>> stream =
        session.GetStream(fence.stream());
    if (!stream.ok()) {
      fence_done_(id, stream.status());
      return;
    }
    (*stream)->Synchronize([this, id](absl::Status status) {
      fence_done_(id, std::move(status));
    });
    return;
  }
  std::vector<std::shared_ptr<Stream>> streams = session.AllStreams();
  auto remaining = std::make_shared<std::atomic<size_t>>(streams.size());
  for (const std::shared_ptr<Stream>& stream : streams) {
    stream->WhenReached([this, id, remaining] {
      if (remaining->fetch_sub(1) == 1) fence_done_(id, TakeSessionError());
    });
  }
}

void CommandPipeline::FencesWritten(size_t count) {
  Resume waiter;
  {
    absl::MutexLock lock(&mu_);
    fences_held_ -= std::min(fences_held_, count);
    if (fences_held_ < max_fences_) {
      waiter = std::move(fence_waiter_);
      fence_waiter_ = nullptr;
    }
  }
  if (waiter) waiter();
}

void CommandPipeline::FailSession(absl::Status error) {
  absl::MutexLock lock(&mu_);
  if (session_error_.ok()) session_error_ = std::move(error);
}

absl::Status CommandPipeline::TakeSessionError() {
  absl::MutexLock lock(&mu_);
  return std::exchange(session_error_, absl::OkStatus());
}

}  // namespace opserver
