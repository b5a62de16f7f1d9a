// The session's handle tables besides buffers and streams: executors and
// their launches, events, refused plans and graphs.

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "runtime/log.h"
#include "runtime/session.h"

namespace opserver {

absl::Status Session::CheckExecutorLimitLocked() const {
  if (HandleCountLocked() < limits_->max_handles_per_session) {
    return absl::OkStatus();
  }
  return kernels::AclnnError(
      kernels::kAclnnErrInnerCreateExecutor,
      absl::StatusCode::kResourceExhausted,
      absl::StrCat("cannot create an executor: the session holds ",
                   HandleCountLocked(),
                   " handles, the limit (--max_handles_per_session)"));
}

bool Session::IssuedExecutorLocked(uint64_t executor) const {
  if (executor >= kClientExecutorBase) {
    return executor <= last_client_executor_;
  }
  return executor != 0 && executor < next_handle_;
}

absl::StatusOr<uint64_t> Session::AddExecutor(
    std::shared_ptr<Executor> executor) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckExecutorLimitLocked());
  uint64_t handle = next_handle_++;
  executors_[handle] = ExecutorEntry{std::move(executor), false};
  return handle;
}

absl::Status Session::UseClientIdLocked(uint64_t id, absl::string_view kind) {
  if (id < kClientExecutorBase || id <= last_client_executor_) {
    return kernels::ParamInvalid(absl::StrCat(
        kind, " id ", id,
        " cannot be chosen: client-chosen ids are at "
        "least 2^62 and larger than every id the session chose before (",
        last_client_executor_, ")"));
  }
  last_client_executor_ = id;  // Used, even if refused after this.
  return absl::OkStatus();
}

absl::Status Session::AddExecutorAs(uint64_t handle,
                                    std::shared_ptr<Executor> executor) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(UseClientIdLocked(handle, "executor"));
  RETURN_IF_ERROR(CheckExecutorLimitLocked());
  executors_[handle] = ExecutorEntry{std::move(executor), false};
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Executor>> Session::ExecutorForLaunch(
    uint64_t executor, bool consume, bool* consumed, bool* repeatable) {
  if (consumed != nullptr) *consumed = false;
  absl::MutexLock lock(&mu_);
  auto it = executors_.find(executor);
  if (it == executors_.end()) {
    if (IssuedExecutorLocked(executor)) {
      return kernels::AclnnError(
          kernels::kAclnnErrInnerNullptr, absl::StatusCode::kFailedPrecondition,
          absl::StrCat("executor ", executor,
                       " was already consumed by a launch or destroyed; "
                       "call GetWorkspaceSize again, or make it repeatable "
                       "before its first launch"));
    }
    return kernels::AclnnError(
        kernels::kAclnnErrInnerNullptr, absl::StatusCode::kNotFound,
        absl::StrCat("no executor ", executor, " in this session"));
  }
  std::shared_ptr<Executor> result = it->second.executor;
  if (repeatable != nullptr) *repeatable = it->second.repeatable;
  if (consume && !it->second.repeatable) {
    executors_.erase(it);
    if (consumed != nullptr) *consumed = true;
  }
  return result;
}

absl::Status Session::Launch(
    uint64_t handle, Stream& stream, bool inline_if_idle,
    const std::function<Stream::Task(std::shared_ptr<Executor>)>& make_task) {
  // A full or destroyed stream refuses the launch before the executor is
  // taken...
  RETURN_IF_ERROR(stream.CheckRoom());
  bool consumed = false;
  ASSIGN_OR_RETURN(std::shared_ptr<Executor> executor,
                   ExecutorForLaunch(handle, /*consume=*/true, &consumed));
  absl::Status queued = stream.Enqueue(make_task(executor), inline_if_idle);
  if (!queued.ok() && consumed) {
    // ...and one that changed since gives it back (found by the soak: the
    // launch failed and the executor was gone). Its handle was held a
    // moment ago, so the handle limit is not checked again.
    absl::MutexLock lock(&mu_);
    executors_.emplace(handle, ExecutorEntry{std::move(executor), false});
  }
  return queued;
}

absl::Status Session::SetExecutorRepeatable(uint64_t executor) {
  absl::MutexLock lock(&mu_);
  auto it = executors_.find(executor);
  if (it == executors_.end()) {
    return kernels::AclnnError(
        kernels::kAclnnErrInnerNullptr, absl::StatusCode::kNotFound,
        absl::StrCat("no executor ", executor,
                     " in this session (never created, already consumed, "
                     "or destroyed)"));
  }
  it->second.repeatable = true;
  return absl::OkStatus();
}

absl::Status Session::DestroyExecutor(uint64_t executor) {
  std::shared_ptr<Executor> doomed;
  absl::MutexLock lock(&mu_);
  auto it = executors_.find(executor);
  if (it == executors_.end()) {
    return kernels::AclnnError(
        kernels::kAclnnErrInnerNullptr, absl::StatusCode::kNotFound,
        absl::StrCat("no executor ", executor,
                     " in this session (never created, already consumed, "
                     "or destroyed)"));
  }
  doomed = std::move(it->second.executor);
  executors_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Session::CreateEvent(uint32_t flags) {
  RETURN_IF_ERROR(CheckEventFlags(flags));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckHandleLimitLocked());
  const uint64_t handle = next_handle_++;
  events_[handle] = std::make_shared<Event>(flags, event_budget_);
  return handle;
}

absl::Status Session::CreateEventAs(uint64_t id, uint32_t flags) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(UseClientIdLocked(id, "event"));
  RETURN_IF_ERROR(CheckEventFlags(flags));
  RETURN_IF_ERROR(CheckHandleLimitLocked());
  events_[id] = std::make_shared<Event>(flags, event_budget_);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Event>> Session::GetEvent(uint64_t event) const {
  absl::MutexLock lock(&mu_);
  auto it = events_.find(event);
  if (it == events_.end()) return UnknownHandle("event", event);
  return it->second;
}

absl::Status Session::DestroyEvent(uint64_t event) {
  std::shared_ptr<Event> doomed;
  {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(event);
    if (it == events_.end()) return UnknownHandle("event", event);
    doomed = std::move(it->second);
    events_.erase(it);
  }
  // Outside the lock: releasing a waiter takes its stream's lock, and a
  // synchronize it answers may finish an RPC.
  doomed->Destroy();
  return absl::OkStatus();
}

absl::Status Session::AddRefusedPlan(uint64_t id, absl::Status error) {
  if (error.message().size() > kMaxKeptErrorBytes) {
    error = kernels::AclnnError(kernels::GetAclnnStatus(error), error.code(),
                                Truncated(error.message(), kMaxKeptErrorBytes));
  }
  absl::MutexLock lock(&mu_);
  if (refused_plans_.count(id) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("executor ", id, " is a refused plan already"));
  }
  RETURN_IF_ERROR(CheckHandleLimitLocked());
  refused_plans_[id] = RefusedPlanEntry{std::move(error), false};
  ++unreported_refusals_;
  return absl::OkStatus();
}

std::optional<absl::Status> Session::RefusedPlan(uint64_t id, bool launch) {
  absl::MutexLock lock(&mu_);
  auto it = refused_plans_.find(id);
  if (it == refused_plans_.end()) return std::nullopt;
  if (launch && !it->second.reported) {
    it->second.reported = true;
    --unreported_refusals_;
  }
  return it->second.error;
}

std::optional<absl::Status> Session::TakeRefusedPlan(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = refused_plans_.find(id);
  if (it == refused_plans_.end()) return std::nullopt;
  absl::Status unreported;
  if (!it->second.reported) {
    unreported = std::move(it->second.error);
    --unreported_refusals_;
  }
  refused_plans_.erase(it);
  return unreported;
}

absl::Status Session::TakeUnreportedRefusal() {
  absl::MutexLock lock(&mu_);
  if (unreported_refusals_ == 0) return absl::OkStatus();
  for (auto& [id, entry] : refused_plans_) {
    if (!entry.reported) {
      entry.reported = true;
      --unreported_refusals_;
      return entry.error;
    }
  }
  return absl::OkStatus();
}

absl::Status Session::AddGraph(uint64_t id, std::shared_ptr<Graph> graph,
                               uint64_t tasks,
                               const std::vector<uint64_t>& consume) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(UseClientIdLocked(id, "graph"));
  if (graphs_.size() >= limits_->max_graphs_per_session) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the session has ", graphs_.size(),
                     " graphs, the limit (--max_graphs_per_session); destroy "
                     "one first"));
  }
  const uint64_t task_limit = limits_->max_graph_tasks_per_session;
  if (tasks > task_limit - std::min(task_limit, graph_tasks_)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a graph of ", tasks, " tasks does not fit: the session's graphs hold ",
        graph_tasks_, " of ", task_limit,
        " tasks (--max_graph_tasks_per_session)"));
  }
  for (uint64_t executor : consume) {
    if (!executors_.contains(executor)) {
      return kernels::AclnnError(
          kernels::kAclnnErrInnerNullptr, absl::StatusCode::kFailedPrecondition,
          absl::StrCat("executor ", executor,
                       " was consumed or destroyed while the graph was being "
                       "defined"));
    }
  }
  for (uint64_t executor : consume) executors_.erase(executor);
  graphs_[id] = GraphEntry{std::move(graph), tasks};
  graph_tasks_ += tasks;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Graph>> Session::GetGraph(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = graphs_.find(id);
  if (it == graphs_.end()) return UnknownHandle("graph", id);
  return it->second.graph;
}

absl::Status Session::DestroyGraph(uint64_t id) {
  std::shared_ptr<Graph> doomed;  // Released outside the lock.
  absl::MutexLock lock(&mu_);
  auto it = graphs_.find(id);
  if (it == graphs_.end()) return UnknownHandle("graph", id);
  doomed = std::move(it->second.graph);
  graph_tasks_ -= std::min(graph_tasks_, it->second.tasks);
  graphs_.erase(it);
  return absl::OkStatus();
}

std::vector<std::pair<uint64_t, std::shared_ptr<Graph>>> Session::AllGraphs()
    const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<uint64_t, std::shared_ptr<Graph>>> graphs;
  graphs.reserve(graphs_.size());
  for (const auto& [id, entry] : graphs_) graphs.emplace_back(id, entry.graph);
  return graphs;
}

}  // namespace opserver
