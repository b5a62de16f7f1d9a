// The C API's graph capture (CANN's aclmdlRI calls in acl/acl_rt.h): a
// capture records the work queued on its streams instead of sending it
// (the calls that record are in aclnn_state.cc, aclnn_device.cc and
// aclnn_events.cc; the shared rules in aclnn_capture.cc), End defines the
// recorded tasks as a graph of the device's session, and a replay is one
// command. docs/graphs.md has the rules.

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "acl/acl.h"
#include "client/aclnn_state.h"
#include "client/client.h"

namespace opserver {
namespace {

const char* ModeName(aclmdlRICaptureMode mode) {
  switch (mode) {
    case ACL_MODEL_RI_CAPTURE_MODE_GLOBAL:
      return "GLOBAL";
    case ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL:
      return "THREAD_LOCAL";
    default:
      return "RELAXED";
  }
}

bool KnownMode(aclmdlRICaptureMode mode) {
  return mode == ACL_MODEL_RI_CAPTURE_MODE_GLOBAL ||
         mode == ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL ||
         mode == ACL_MODEL_RI_CAPTURE_MODE_RELAXED;
}

// The model `model` names (one whose capture ended), or the error.
absl::StatusOr<ModelEntry*> FindModel(State& state, const char* function,
                                      aclmdlRI model) {
  if (!state.initialized) {
    return WithAclError(absl::FailedPreconditionError(
                            absl::StrCat(function, ": aclInit was not called")),
                        ACL_ERROR_UNINITIALIZE);
  }
  const uintptr_t key = reinterpret_cast<uintptr_t>(model);
  if (state.captures.count(key) != 0) {
    return WithAclError(
        absl::FailedPreconditionError(absl::StrCat(
            function, ": model ", absl::Hex(key),
            " is still being captured (call aclmdlRICaptureEnd first)")),
        ACL_ERROR_RT_MODEL_CAPTURED);
  }
  auto it = state.models.find(key);
  if (model == nullptr || it == state.models.end()) {
    return WithAclError(
        absl::InvalidArgumentError(absl::StrCat(
            function, ": model ", absl::Hex(key),
            " is not a live aclmdlRICaptureEnd model (never made, destroyed, "
            "or its device was reset)")),
        ACL_ERROR_INVALID_PARAM);
  }
  return &it->second;
}

// The streams of `capture` that forked from it and never joined back: a
// stream joins back when another stream of the capture waits on an event
// it recorded after its last task.
std::vector<uintptr_t> Unjoined(const Capture& capture) {
  std::vector<uintptr_t> unjoined;
  for (const auto& [stream, tasks] : capture.work) {
    if (stream == capture.origin) continue;
    auto joined = capture.joined_at.find(stream);
    if (joined == capture.joined_at.end() || joined->second != tasks) {
      unjoined.push_back(stream);
    }
  }
  return unjoined;
}

// Ends `capture` (under `state.mu`): its streams stop capturing.
std::shared_ptr<Capture> Detach(State& state, uintptr_t model) {
  std::shared_ptr<Capture> capture = std::move(state.captures[model]);
  state.captures.erase(model);
  for (auto it = state.capturing.begin(); it != state.capturing.end();) {
    it = it->second == model ? state.capturing.erase(it) : std::next(it);
  }
  return capture;
}

// One task of a model as a JSON object (`verbose`: every field).
std::string TaskJson(size_t index, const v1::PipelineCommand& task,
                     const std::string& op, bool verbose) {
  std::string out = absl::StrCat("{\"index\": ", index, ", \"type\": ");
  switch (task.command_case()) {
    case v1::PipelineCommand::kLaunch: {
      const v1::ExecuteRequest& launch = task.launch();
      absl::StrAppend(&out, "\"launch\", \"op\": \"", op,
                      "\", \"stream\": ", launch.stream());
      if (verbose) {
        absl::StrAppend(&out, ", \"executor\": ", launch.executor(),
                        ", \"workspace_buffer\": ", launch.workspace_buffer(),
                        ", \"workspace_offset\": ", launch.workspace_offset(),
                        ", \"workspace_size\": ", launch.workspace_size());
      }
      break;
    }
    case v1::PipelineCommand::kMemset: {
      const v1::MemsetRequest& memset = task.memset();
      absl::StrAppend(&out, "\"memset\", \"stream\": ", memset.stream());
      if (verbose) {
        absl::StrAppend(&out, ", \"buffer\": ", memset.buffer(),
                        ", \"offset\": ", memset.offset(),
                        ", \"size\": ", memset.size(),
                        ", \"value\": ", memset.value());
      }
      break;
    }
    case v1::PipelineCommand::kCopy: {
      const v1::CopyDeviceToDeviceRequest& copy = task.copy();
      absl::StrAppend(&out, "\"copy\", \"stream\": ", copy.stream());
      if (verbose) {
        absl::StrAppend(&out, ", \"dst_buffer\": ", copy.dst_buffer(),
                        ", \"dst_offset\": ", copy.dst_offset(),
                        ", \"src_buffer\": ", copy.src_buffer(),
                        ", \"src_offset\": ", copy.src_offset(),
                        ", \"size\": ", copy.size());
      }
      break;
    }
    case v1::PipelineCommand::kRecordEvent:
      absl::StrAppend(
          &out, "\"record_event\", \"stream\": ", task.record_event().stream());
      if (verbose) {
        absl::StrAppend(&out, ", \"event\": ", task.record_event().event());
      }
      break;
    case v1::PipelineCommand::kWaitEvent:
      absl::StrAppend(
          &out, "\"wait_event\", \"stream\": ", task.wait_event().stream());
      if (verbose) {
        absl::StrAppend(&out, ", \"event\": ", task.wait_event().event());
      }
      break;
    default:
      absl::StrAppend(&out, "\"other\"");
  }
  out += "}";
  return out;
}

// The capture aclmdlRICaptureEnd may end on `stream` (under state.mu): the
// one begun on that stream, on this thread unless it is RELAXED. nullptr
// otherwise, with the failure recorded and its code in `*refused`.
Capture* EndableCapture(State& state, aclrtStream stream, aclError* refused) {
  if (!state.initialized) {
    *refused = Fail(ACL_ERROR_UNINITIALIZE,
                    "aclmdlRICaptureEnd: aclInit was not called");
    return nullptr;
  }
  Capture* found = CaptureOf(state, stream);
  if (found == nullptr) {
    *refused = Fail(ACL_ERROR_RT_STREAM_NOT_CAPTURED,
                    "aclmdlRICaptureEnd: the stream is not capturing");
    return nullptr;
  }
  if (found->origin != reinterpret_cast<uintptr_t>(stream)) {
    *refused = Fail(ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED,
                    "aclmdlRICaptureEnd: the stream joined a capture begun "
                    "on another stream; end it there");
    return nullptr;
  }
  if (found->thread != std::this_thread::get_id() &&
      found->mode != ACL_MODEL_RI_CAPTURE_MODE_RELAXED) {
    *refused = Fail(ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD,
                    absl::StrCat("aclmdlRICaptureEnd: the capture was begun "
                                 "by another thread in ",
                                 ModeName(found->mode),
                                 " mode; only RELAXED captures may end on "
                                 "another thread (the capture goes on)"));
    return nullptr;
  }
  return found;
}

// What aclmdlRIExecuteAsync(modelRI, stream) replays, checked (its
// errors are that call's, recorded): the session, the graph (0 when
// nothing was captured) and the stream's handle. `pending_reads`, if not
// null, says whether aclrtMemcpyAsync copies of that stream wait.
struct ReplayTarget {
  Pinned pinned;
  uint64_t graph = 0;
  uint64_t handle = 0;
};
aclError CheckReplay(aclmdlRI modelRI, aclrtStream stream, ReplayTarget* target,
                     bool* pending_reads) {
  const char* const function = "aclmdlRIExecuteAsync";
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  absl::StatusOr<ModelEntry*> model = FindModel(state, function, modelRI);
  if (!model.ok()) return FailAcl(model.status());
  absl::StatusOr<Pinned> current = PinCurrent(state);
  if (!current.ok()) return FailAcl(current.status());
  if ((*model)->device != current->device) {
    return Fail(
        ACL_ERROR_RT_MODEL_CONTEXT,
        absl::StrCat("aclmdlRIExecuteAsync: the model is on device ",
                     (*model)->device, ", the current context on device ",
                     current->device));
  }
  absl::StatusOr<uint64_t> stream_handle =
      StreamHandle(state, stream, current->device);
  if (!stream_handle.ok()) {
    return FailAcl(Prefixed(stream_handle.status(), "aclmdlRIExecuteAsync: "));
  }
  if (absl::Status s = RefuseIfCapturing(state, function, stream); !s.ok()) {
    return FailAcl(s);
  }
  if (pending_reads != nullptr) {
    *pending_reads =
        state.pending_reads.count({current->device, *stream_handle}) != 0 ||
        std::any_of(state.block_copies.begin(), state.block_copies.end(),
                    [&](const State::BlockCopy& c) {
                      return c.device == current->device &&
                             c.stream == *stream_handle;
                    });
  }
  target->pinned = *std::move(current);
  target->graph = (*model)->graph;
  target->handle = *stream_handle;
  return ACL_SUCCESS;
}

}  // namespace
}  // namespace opserver

using opserver::Fail;
using opserver::FailAcl;
using opserver::GetState;
using opserver::State;

extern "C" {

aclError aclmdlRICaptureBegin(aclrtStream stream, aclmdlRICaptureMode mode) {
  if (!opserver::KnownMode(mode)) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclmdlRICaptureBegin: unknown capture mode ",
                             static_cast<int>(mode)));
  }
  if (stream == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclmdlRICaptureBegin: the default stream (NULL) cannot be "
                "captured; capture an aclrtCreateStream stream");
  }
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  absl::StatusOr<opserver::Pinned> pinned = opserver::PinCurrent(state);
  if (!pinned.ok()) return FailAcl(pinned.status());
  absl::StatusOr<uint64_t> handle =
      opserver::StreamHandle(state, stream, pinned->device);
  if (!handle.ok()) {
    return FailAcl(
        opserver::Prefixed(handle.status(), "aclmdlRICaptureBegin: "));
  }
  if (opserver::CaptureOf(state, stream) != nullptr) {
    return Fail(ACL_ERROR_RT_STREAM_CAPTURED,
                "aclmdlRICaptureBegin: the stream is already capturing "
                "(begun on it or joined through an event)");
  }
  if (!pinned->session->pipelined()) {
    return Fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "aclmdlRICaptureBegin: graphs need the pipelined session "
                "(OPSERVER_PIPELINE is off)");
  }
  auto capture = std::make_shared<opserver::Capture>();
  capture->device = pinned->device;
  capture->origin = reinterpret_cast<uintptr_t>(stream);
  capture->mode = mode;
  capture->thread = std::this_thread::get_id();
  capture->model = opserver::kModelBase + 16 * state.next_model++;
  state.capturing[capture->origin] = capture->model;
  state.captures.emplace(capture->model, std::move(capture));
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureGetInfo(aclrtStream stream,
                                aclmdlRICaptureStatus* status,
                                aclmdlRI* modelRI) {
  if (status == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclmdlRICaptureGetInfo: status is NULL");
  }
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  if (!state.initialized) {
    return Fail(ACL_ERROR_UNINITIALIZE,
                "aclmdlRICaptureGetInfo: aclInit was not called");
  }
  if (stream != nullptr &&
      state.streams.count(reinterpret_cast<uintptr_t>(stream)) == 0) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclmdlRICaptureGetInfo: not a live aclrtCreateStream stream");
  }
  const opserver::Capture* capture = opserver::CaptureOf(state, stream);
  if (capture == nullptr) {
    *status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  } else {
    *status = capture->invalidated.ok()
                  ? ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE
                  : ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED;
  }
  if (modelRI != nullptr) {
    *modelRI = capture == nullptr ? nullptr
                                  : reinterpret_cast<aclmdlRI>(capture->model);
  }
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI* modelRI) {
  if (modelRI == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureEnd: modelRI is NULL");
  }
  State& state = GetState();
  std::shared_ptr<opserver::Capture> capture;
  opserver::Pinned pinned;
  {
    absl::MutexLock lock(&state.mu);
    aclError refused = ACL_SUCCESS;
    opserver::Capture* found =
        opserver::EndableCapture(state, stream, &refused);
    if (found == nullptr) return refused;
    capture = opserver::Detach(state, found->model);
    pinned = state.Pin(capture->device);
  }
  // Executors a capture that fails consumed stay on the server until the
  // session ends (DefineGraph's contract); they are no one's here.
  auto release = [&] {
    for (auto& executor : capture->executors) executor.Release();
  };
  if (!capture->invalidated.ok()) {
    release();
    return Fail(ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
                absl::StrCat("aclmdlRICaptureEnd: the capture was "
                             "invalidated by an earlier call: ",
                             capture->invalidated.message()));
  }
  if (std::vector<uintptr_t> unjoined = opserver::Unjoined(*capture);
      !unjoined.empty()) {
    release();
    return Fail(
        ACL_ERROR_RT_STREAM_UNJOINED,
        absl::StrCat("aclmdlRICaptureEnd: stream ", absl::Hex(unjoined.front()),
                     " forked from the capture and did not join back "
                     "(record an event on it after its last work and "
                     "make the capturing stream wait on it)"));
  }
  opserver::ModelEntry model{capture->device, 0, capture->tasks, capture->ops};
  if (!capture->tasks.empty()) {
    // The definition, then a session fence: the server's verdict on it
    // (handles, limits) is known when End returns.
    absl::StatusOr<uint64_t> graph =
        pinned.session->DefineGraph(std::move(capture->tasks));
    absl::Status defined =
        graph.ok() ? pinned.session->Flush() : graph.status();
    release();
    if (!defined.ok()) {
      return FailAcl(
          opserver::Prefixed(pinned.Named(defined), "aclmdlRICaptureEnd: "));
    }
    model.graph = *graph;
  }
  absl::MutexLock lock(&state.mu);
  if (!opserver::StillCurrent(state, pinned)) {
    return Fail(ACL_ERROR_RT_FAILURE,
                "aclmdlRICaptureEnd: the device was reset during the call");
  }
  state.models.emplace(capture->model, std::move(model));
  *modelRI = reinterpret_cast<aclmdlRI>(capture->model);
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureThreadExchangeMode(aclmdlRICaptureMode* mode) {
  if (mode == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclmdlRICaptureThreadExchangeMode: mode is NULL");
  }
  if (!opserver::KnownMode(*mode)) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclmdlRICaptureThreadExchangeMode: unknown "
                             "capture mode ",
                             static_cast<int>(*mode)));
  }
  std::swap(opserver::ThreadCaptureMode(), *mode);
  return ACL_SUCCESS;
}

aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream) {
  opserver::ReplayTarget target;
  if (aclError error = opserver::CheckReplay(modelRI, stream, &target,
                                             /*pending_reads=*/nullptr);
      error != ACL_SUCCESS) {
    return error;
  }
  if (target.graph == 0) return ACL_SUCCESS;  // Nothing was captured.
  absl::Status status =
      target.pinned.session->ReplayGraph(target.graph, target.handle);
  if (!status.ok()) return FailAcl(target.pinned.Named(status));
  return ACL_SUCCESS;
}

aclError aclmdlRIExecute(aclmdlRI modelRI, int32_t timeout) {
  if (timeout < -1 || timeout == 0) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclmdlRIExecute: timeout ", timeout,
                             " ms (-1 waits for ever, else more than 0)"));
  }
  // On the current context's default stream, then waited for as
  // aclrtSynchronizeStream(WithTimeout) does: past the time-out the replay
  // goes on and ACL_ERROR_RT_STREAM_SYNC_TIMEOUT is returned.
  opserver::ReplayTarget target;
  bool pending_reads = false;
  if (aclError error =
          opserver::CheckReplay(modelRI, nullptr, &target, &pending_reads);
      error != ACL_SUCCESS) {
    return error;
  }
  if (timeout != -1 || target.graph == 0 || pending_reads) {
    if (target.graph != 0) {
      absl::Status status =
          target.pinned.session->ReplayGraph(target.graph, target.handle);
      if (!status.ok()) return FailAcl(target.pinned.Named(status));
    }
    return aclrtSynchronizeStreamWithTimeout(nullptr, timeout);
  }
  // Waiting for ever with no read to land first: the replay and the
  // synchronize leave as one message (one read on the server, not two).
  absl::Status status = target.pinned.session->ReplayGraphAndSynchronize(
      target.graph, target.handle);
  opserver::ReportDeferred(target.pinned.device, status);
  if (!status.ok()) return FailAcl(target.pinned.Named(status));
  return ACL_SUCCESS;
}

aclError aclmdlRIDestroy(aclmdlRI modelRI) {
  State& state = GetState();
  opserver::Pinned pinned;
  uint64_t graph = 0;
  {
    absl::MutexLock lock(&state.mu);
    absl::StatusOr<opserver::ModelEntry*> model =
        opserver::FindModel(state, __func__, modelRI);
    if (!model.ok()) return FailAcl(model.status());
    pinned = state.Pin((*model)->device);
    graph = (*model)->graph;
    state.models.erase(reinterpret_cast<uintptr_t>(modelRI));
  }
  if (graph == 0) return ACL_SUCCESS;
  // The server releases it after the replays already queued.
  absl::Status status = pinned.session->DestroyGraph(graph);
  if (!status.ok()) return FailAcl(pinned.Named(status));
  return ACL_SUCCESS;
}

aclError aclmdlRIDebugJsonPrint(aclmdlRI modelRI, const char* path,
                                uint32_t flags) {
  if (path == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclmdlRIDebugJsonPrint: path is NULL");
  }
  if (flags != ACL_MDLRI_DEBUG_JSON_PRINT_SUMMARY &&
      flags != ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclmdlRIDebugJsonPrint: unknown flags ", flags));
  }
  std::string json;
  {
    State& state = GetState();
    absl::MutexLock lock(&state.mu);
    absl::StatusOr<opserver::ModelEntry*> model =
        opserver::FindModel(state, __func__, modelRI);
    if (!model.ok()) return FailAcl(model.status());
    const opserver::ModelEntry& entry = **model;
    json = absl::StrCat(
        "{\"model\": ", reinterpret_cast<uintptr_t>(modelRI),
        ", \"device\": ", entry.device, ", \"graph\": ", entry.graph,
        ", \"task_count\": ", entry.tasks.size(), ", \"tasks\": [");
    for (size_t i = 0; i < entry.tasks.size(); ++i) {
      if (i > 0) json += ",\n  ";
      json += opserver::TaskJson(i, entry.tasks[i], entry.ops[i],
                                 flags == ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE);
    }
    json += "]}\n";
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return Fail(ACL_ERROR_RT_FILE_OPEN,
                absl::StrCat("aclmdlRIDebugJsonPrint: cannot open ", path));
  }
  out << json;
  out.close();
  if (!out) {
    return Fail(ACL_ERROR_RT_FILE_WRITE,
                absl::StrCat("aclmdlRIDebugJsonPrint: cannot write ", path));
  }
  return ACL_SUCCESS;
}

}  // extern "C"
