// Where a stream's deferred error came from: the position of the failing
// task on its stream (1 for the first task queued on it; each task and each
// refused command that became the stream's error counts one), carried as a
// payload of the absl::Status, so the server's stream core records it
// without knowing the wire, the Pipeline sends it (FenceResult.task), and
// the client hands it to aclrtSetExceptionInfoCallback's callback with the
// stream it failed on.
#ifndef OPSERVER_COMMON_TASK_POSITION_H_
#define OPSERVER_COMMON_TASK_POSITION_H_

#include <cstdint>

#include "absl/status/status.h"

namespace opserver {

// `status` carrying task position `task` (> 0). An OK status, a zero
// position, or one that carries a position already is returned as it is
// (the first position recorded stands).
absl::Status WithTaskPosition(absl::Status status, uint64_t task);
// The position `status` carries; 0 when none (or a malformed payload).
uint64_t TaskPositionOf(const absl::Status& status);

// The same for the stream handle a deferred error was collected from (the
// client sets it on a fence's error). 0 is the default stream, so
// DeferredStreamOf says whether there is one.
absl::Status WithDeferredStream(absl::Status status, uint64_t stream);
bool DeferredStreamOf(const absl::Status& status, uint64_t* stream);

// The longest operator time-out (OpTimeoutsCommand) a session may set:
// the client refuses more and the server does not trust it to (a day).
inline constexpr uint64_t kMaxOpTimeoutMs = 24ull * 3600 * 1000;

}  // namespace opserver

#endif  // OPSERVER_COMMON_TASK_POSITION_H_
