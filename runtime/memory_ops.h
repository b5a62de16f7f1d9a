// Memset and device-to-device copies of a session's buffers, checked and
// queued on a stream: shared by the Runtime service's unary calls and the
// Pipeline channel's commands, so both check the same way and answer with
// the same codes.
#ifndef OPSERVER_RUNTIME_MEMORY_OPS_H_
#define OPSERVER_RUNTIME_MEMORY_OPS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/opserver.pb.h"
#include "runtime/session.h"
#include "runtime/stream.h"

namespace opserver {

// Buffer `handle` of `session` when [offset, offset + size) lies inside
// it: NOT_FOUND for an unknown buffer, OUT_OF_RANGE (its message starting
// with `what`) for a range outside it (overflow-safe).
absl::StatusOr<std::shared_ptr<Buffer>> BufferRange(Session& session,
                                                    uint64_t handle,
                                                    uint64_t offset,
                                                    uint64_t size,
                                                    absl::string_view what);

// Queues `request` on `stream` (the caller resolved request.stream(), so it
// can charge a pipelined command's error to it). Returns once queued:
// INVALID_ARGUMENT for a value above 255, NOT_FOUND for an unknown buffer,
// OUT_OF_RANGE for a range outside its buffer (overflow-safe), and the
// stream's Enqueue error (RESOURCE_EXHAUSTED when full, CANCELLED). The
// task holds the buffers until it has run.
absl::Status QueueMemset(Session& session, Stream& stream,
                         const v1::MemsetRequest& request);
// The same for a copy within the session's memory; the ranges may overlap.
absl::Status QueueCopy(Session& session, Stream& stream,
                       const v1::CopyDeviceToDeviceRequest& request);

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_MEMORY_OPS_H_
