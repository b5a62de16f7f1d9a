// The remote Session's graphs: the commands a capture records, and
// defining, replaying and destroying a graph (client.h).

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

absl::Status Session::CheckPipelined(absl::string_view what) const {
  if (channel_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": graphs need a pipelined session (ConnectOptions::pipeline)"));
}

absl::StatusOr<v1::PipelineCommand> Session::MemsetCommand(uint64_t buffer,
                                                           uint64_t offset,
                                                           uint64_t size,
                                                           uint8_t value,
                                                           uint64_t stream) {
  RETURN_IF_ERROR(CheckPipelined("Memset"));
  if (absl::Status s = CheckLocalRange(buffer, offset, size, stream); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("Memset: ", s.message()));
  }
  v1::PipelineCommand command;
  v1::MemsetRequest& request = *command.mutable_memset();
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_size(size);
  request.set_value(value);
  request.set_stream(stream);
  return command;
}

absl::StatusOr<v1::PipelineCommand> Session::CopyCommand(
    uint64_t dst_buffer, uint64_t dst_offset, uint64_t src_buffer,
    uint64_t src_offset, uint64_t size, uint64_t stream) {
  RETURN_IF_ERROR(CheckPipelined("CopyOnDevice"));
  absl::Status s = CheckLocalRange(src_buffer, src_offset, size, stream);
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("CopyOnDevice: source ", s.message()));
  }
  s = CheckLocalRange(dst_buffer, dst_offset, size, stream);
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("CopyOnDevice: destination ", s.message()));
  }
  v1::PipelineCommand command;
  v1::CopyDeviceToDeviceRequest& request = *command.mutable_copy();
  request.set_dst_buffer(dst_buffer);
  request.set_dst_offset(dst_offset);
  request.set_src_buffer(src_buffer);
  request.set_src_offset(src_offset);
  request.set_size(size);
  request.set_stream(stream);
  return command;
}

absl::StatusOr<v1::PipelineCommand> Session::WriteCommand(uint64_t buffer,
                                                          uint64_t offset,
                                                          const void* data,
                                                          uint64_t size,
                                                          uint64_t stream) {
  RETURN_IF_ERROR(CheckPipelined("WriteAsync"));
  if (size > kMaxPipelinedBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteAsync: a pipelined write of ", size,
                     " bytes is over the limit of ", kMaxPipelinedBytes));
  }
  RETURN_IF_ERROR(CheckLocalRange(buffer, offset, size, stream));
  v1::PipelineCommand command;
  v1::WriteCommand& write = *command.mutable_write();
  write.set_buffer(buffer);
  write.set_offset(offset);
  write.set_data(static_cast<const char*>(data), size);
  write.set_stream(stream);
  return command;
}

absl::StatusOr<v1::PipelineCommand> Session::RecordEventCommand(
    uint64_t event, uint64_t stream) {
  RETURN_IF_ERROR(CheckPipelined("RecordEvent"));
  RETURN_IF_ERROR(CheckLocalEvent("RecordEvent", event, stream));
  v1::PipelineCommand command;
  command.mutable_record_event()->set_event(event);
  command.mutable_record_event()->set_stream(stream);
  return command;
}

absl::StatusOr<v1::PipelineCommand> Session::WaitEventCommand(uint64_t stream,
                                                              uint64_t event) {
  RETURN_IF_ERROR(CheckPipelined("StreamWaitEvent"));
  RETURN_IF_ERROR(CheckLocalEvent("StreamWaitEvent", event, stream));
  v1::PipelineCommand command;
  command.mutable_wait_event()->set_stream(stream);
  command.mutable_wait_event()->set_event(event);
  return command;
}

absl::StatusOr<uint64_t> Session::DefineGraph(
    std::vector<v1::PipelineCommand> tasks) {
  RETURN_IF_ERROR(CheckPipelined("DefineGraph"));
  if (tasks.empty()) {
    return absl::InvalidArgumentError("DefineGraph: a graph has no tasks");
  }
  v1::PipelineCommand command;
  v1::DefineGraphCommand& define = *command.mutable_define_graph();
  define.mutable_tasks()->Reserve(static_cast<int>(tasks.size()));
  for (size_t i = 0; i < tasks.size(); ++i) {
    switch (tasks[i].command_case()) {
      case v1::PipelineCommand::kLaunch:
      case v1::PipelineCommand::kMemset:
      case v1::PipelineCommand::kCopy:
      case v1::PipelineCommand::kWrite:
      case v1::PipelineCommand::kRecordEvent:
      case v1::PipelineCommand::kWaitEvent:
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "DefineGraph: task ", i + 1, " of ", tasks.size(),
            " is not a launch, memset, copy, write, record_event or "
            "wait_event"));
    }
    *define.add_tasks() = std::move(tasks[i]);
  }
  // Sized with a placeholder id of the same width as the real one.
  define.set_graph(kClientExecutorBase);
  if (const uint64_t bytes = command.ByteSizeLong();
      bytes > kMaxGraphDefinitionBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("DefineGraph: the definition takes ", bytes,
                     " bytes, over the limit of ", kMaxGraphDefinitionBytes,
                     " (fewer or smaller writes, or fewer tasks)"));
  }
  absl::MutexLock lock(&handles_mu_);
  const uint64_t id = next_executor_++;
  define.set_graph(id);
  // Sent under the lock that chose the id (see PlanLocally).
  RETURN_IF_ERROR(channel_->Send(std::move(command)));
  graphs_.insert(id);
  return id;
}

absl::StatusOr<v1::PipelineCommand> Session::ReplayCommand(uint64_t graph,
                                                           uint64_t stream) {
  RETURN_IF_ERROR(CheckPipelined("ReplayGraph"));
  {
    absl::MutexLock lock(&handles_mu_);
    if (!graphs_.contains(graph)) {
      return UnknownHandle("ReplayGraph: ", "graph", graph);
    }
    if (stream != 0 && !streams_.contains(stream)) {
      return UnknownHandle("ReplayGraph: ", "stream", stream);
    }
  }
  v1::PipelineCommand command;
  command.mutable_replay_graph()->set_graph(graph);
  command.mutable_replay_graph()->set_stream(stream);
  return command;
}

absl::Status Session::ReplayGraph(uint64_t graph, uint64_t stream) {
  ASSIGN_OR_RETURN(v1::PipelineCommand command, ReplayCommand(graph, stream));
  return channel_->Send(std::move(command));
}

absl::Status Session::ReplayGraphAndSynchronize(uint64_t graph,
                                                uint64_t stream) {
  ASSIGN_OR_RETURN(v1::PipelineCommand command, ReplayCommand(graph, stream));
  // As Synchronize: every command sent up to now is ordered before the
  // fence.
  const uint64_t issued = channel_->Issued() + 1;
  absl::Status status = channel_->SendThenFence(std::move(command), stream);
  if (status.ok()) NoteIdle(stream, issued, /*clean=*/true);
  return status;
}

absl::Status Session::DestroyGraph(uint64_t graph) {
  RETURN_IF_ERROR(CheckPipelined("DestroyGraph"));
  {
    absl::MutexLock lock(&handles_mu_);
    if (graphs_.erase(graph) == 0) {
      return UnknownHandle("DestroyGraph: ", "graph", graph);
    }
  }
  v1::PipelineCommand command;
  command.set_destroy_graph(graph);
  return channel_->Send(std::move(command));
}


}  // namespace remote
}  // namespace opserver
