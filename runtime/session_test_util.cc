#include "runtime/session_test_util.h"

#include <cstring>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace opserver {

uint64_t WriteFloats(Session& session, const std::vector<float>& values) {
  absl::StatusOr<uint64_t> handle =
      session.Malloc(values.size() * sizeof(float));
  EXPECT_TRUE(handle.ok()) << handle.status();
  if (!handle.ok()) return 0;
  std::memcpy((*session.GetBuffer(*handle))->data(), values.data(),
              values.size() * sizeof(float));
  return *handle;
}

std::vector<float> ReadFloats(Session& session, uint64_t handle, size_t n) {
  std::vector<float> out(n);
  std::memcpy(out.data(), (*session.GetBuffer(handle))->data(),
              n * sizeof(float));
  return out;
}

JoinedStreamThreads::~JoinedStreamThreads() {
  EXPECT_TRUE(threads_->WaitForZero(absl::Minutes(1)))
      << "a stream thread outlived its session by a minute";
}

}  // namespace opserver
