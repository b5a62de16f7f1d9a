// The capture rules the C API's calls share (see aclnn_state.h, "Capture",
// and docs/graphs.md): which stream records instead of sending, what a
// capturing stream refuses, and CANN's rule for unsafe calls by mode.

#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "acl/acl.h"
#include "client/aclnn_state.h"

namespace opserver {

Capture* CaptureOf(State& state, aclrtStream stream) {
  auto it = state.capturing.find(reinterpret_cast<uintptr_t>(stream));
  if (it == state.capturing.end()) return nullptr;
  auto capture = state.captures.find(it->second);
  return capture == state.captures.end() ? nullptr : capture->second.get();
}

void Record(Capture& capture, uintptr_t key, v1::PipelineCommand task,
            std::string op) {
  capture.tasks.push_back(std::move(task));
  capture.ops.push_back(std::move(op));
  ++capture.work[key];
}

absl::Status Invalidate(Capture& capture, absl::Status why) {
  if (capture.invalidated.ok()) capture.invalidated = why;
  return why;
}

absl::Status RefuseIfCapturing(State& state, const char* function,
                               aclrtStream stream) {
  Capture* capture = CaptureOf(state, stream);
  if (capture == nullptr) return absl::OkStatus();
  return Invalidate(
      *capture,
      WithAclError(absl::FailedPreconditionError(absl::StrCat(
                       function, ": stream ",
                       absl::Hex(reinterpret_cast<uintptr_t>(stream)),
                       " is capturing: its work is recorded, not run, so "
                       "nothing can wait for it or ask about it before "
                       "aclmdlRICaptureEnd (the capture is invalidated)")),
                   ACL_ERROR_RT_STREAM_CAPTURED));
}

Capture* CaptureRecording(State& state, uint32_t device, uint64_t handle) {
  for (auto& [model, capture] : state.captures) {
    if (capture->device == device && capture->recorded.count(handle) != 0) {
      return capture.get();
    }
  }
  return nullptr;
}

absl::Status RefuseIfEventCaptured(State& state, const char* function,
                                   uint32_t device, uint64_t handle) {
  Capture* capture = CaptureRecording(state, device, handle);
  if (capture == nullptr) return absl::OkStatus();
  return Invalidate(
      *capture,
      WithAclError(absl::FailedPreconditionError(absl::StrCat(
                       function,
                       ": the event was recorded in a capture that has not "
                       "ended; its record runs only in a replay (the capture "
                       "is invalidated)")),
                   ACL_ERROR_RT_EVENT_CAPTURED));
}

absl::Status CheckUnsafeCall(State& state, const char* function) {
  absl::MutexLock lock(&state.mu);
  if (state.captures.empty()) return absl::OkStatus();
  const aclmdlRICaptureMode mine = ThreadCaptureMode();
  if (mine == ACL_MODEL_RI_CAPTURE_MODE_RELAXED) return absl::OkStatus();
  const std::thread::id self = std::this_thread::get_id();
  // The captures that forbid the call: in GLOBAL mode, every GLOBAL capture
  // and this thread's THREAD_LOCAL ones; in THREAD_LOCAL mode, this
  // thread's GLOBAL and THREAD_LOCAL ones. RELAXED captures forbid nothing.
  std::vector<Capture*> forbidding;
  for (auto& [model, capture] : state.captures) {
    const bool own = capture->thread == self;
    const aclmdlRICaptureMode theirs = capture->mode;
    if (theirs == ACL_MODEL_RI_CAPTURE_MODE_RELAXED) continue;
    if ((mine == ACL_MODEL_RI_CAPTURE_MODE_GLOBAL &&
         (theirs == ACL_MODEL_RI_CAPTURE_MODE_GLOBAL || own)) ||
        (mine == ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL && own)) {
      forbidding.push_back(capture.get());
    }
  }
  if (forbidding.empty()) return absl::OkStatus();
  const absl::Status refused = WithAclError(
      absl::FailedPreconditionError(absl::StrCat(
          function,
          ": not allowed while a capture is going on in this thread's "
          "capture mode (",
          mine == ACL_MODEL_RI_CAPTURE_MODE_GLOBAL ? "GLOBAL" : "THREAD_LOCAL",
          "); switch this thread to RELAXED with "
          "aclmdlRICaptureThreadExchangeMode first (the capture is "
          "invalidated)")),
      ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT);
  for (Capture* capture : forbidding) {
    Invalidate(*capture, refused).IgnoreError();
  }
  return refused;
}

void DropCaptures(State& state, uint32_t device) {
  for (auto it = state.captures.begin(); it != state.captures.end();) {
    Capture& capture = *it->second;
    if (capture.device != device) {
      ++it;
      continue;
    }
    // Their executors die with the session.
    for (remote::Executor& executor : capture.executors) executor.Release();
    it = state.captures.erase(it);
  }
  for (auto it = state.capturing.begin(); it != state.capturing.end();) {
    it = state.captures.count(it->second) == 0 ? state.capturing.erase(it)
                                               : std::next(it);
  }
  for (auto it = state.models.begin(); it != state.models.end();) {
    it = it->second.device == device ? state.models.erase(it) : std::next(it);
  }
}

}  // namespace opserver
