// Starting threads where running out of them must not end the process.
#ifndef OPSERVER_COMMON_THREAD_START_H_
#define OPSERVER_COMMON_THREAD_START_H_

#include <functional>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace opserver {

// std::thread(fn): throws std::system_error when no thread can be started
// (RLIMIT_NPROC, a container's pids limit, no memory for a stack), and
// also while FailThreadStartsForTesting is on. For callers that already
// turn that exception into an error.
std::thread NewThread(std::function<void()> fn);

// NewThread without the exception: RESOURCE_EXHAUSTED "cannot start
// <what>: <reason>" instead. A thread started while a hostile client holds
// every thread the process may have would otherwise be std::terminate
// (SIGABRT) wherever it is not caught, shutdown included.
absl::StatusOr<std::thread> StartThread(absl::string_view what,
                                        std::function<void()> fn);

// For tests: while on, NewThread and StartThread fail as if the process
// had no threads left. Process-wide.
void FailThreadStartsForTesting(bool fail);

}  // namespace opserver

#endif  // OPSERVER_COMMON_THREAD_START_H_
