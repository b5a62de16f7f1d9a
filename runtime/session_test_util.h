// Helpers for tests that drive a Session directly (no gRPC): float buffers
// written and read through the buffer's memory, which the test devices
// (the CPU device, FakeDevice) keep in host memory.
#ifndef OPSERVER_RUNTIME_SESSION_TEST_UTIL_H_
#define OPSERVER_RUNTIME_SESSION_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/session.h"

namespace opserver {

// A new buffer of `session` holding `values`; the handle (a test failure
// and 0 when Malloc fails).
uint64_t WriteFloats(Session& session, const std::vector<float>& values);

// The first `n` floats of buffer `handle`.
std::vector<float> ReadFloats(Session& session, uint64_t handle, size_t n);

// Stream threads for the sessions a test makes, joined on destruction. The
// threads outlive their session (each finishes its running task, which may
// hold a buffer, a device stream or the test's own state): declare this
// after the device and the test state, and before the session, so that
// its destructor waits for them once the session is gone and before the
// rest goes.
class JoinedStreamThreads {
 public:
  JoinedStreamThreads() = default;
  JoinedStreamThreads(const JoinedStreamThreads&) = delete;
  JoinedStreamThreads& operator=(const JoinedStreamThreads&) = delete;
  ~JoinedStreamThreads();

  const std::shared_ptr<StreamThreads>& get() const { return threads_; }

 private:
  const std::shared_ptr<StreamThreads> threads_ =
      std::make_shared<StreamThreads>();
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_SESSION_TEST_UTIL_H_
