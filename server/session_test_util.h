// Helpers for tests that drive a Session directly (no gRPC): float buffers
// written and read through the buffer's memory, which the test devices
// (the CPU device, FakeDevice) keep in host memory.
#ifndef OPSERVER_SERVER_SESSION_TEST_UTIL_H_
#define OPSERVER_SERVER_SESSION_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "server/session.h"

namespace opserver {

// A new buffer of `session` holding `values`; the handle (a test failure
// and 0 when Malloc fails).
uint64_t WriteFloats(Session& session, const std::vector<float>& values);

// The first `n` floats of buffer `handle`.
std::vector<float> ReadFloats(Session& session, uint64_t handle, size_t n);

}  // namespace opserver

#endif  // OPSERVER_SERVER_SESSION_TEST_UTIL_H_
