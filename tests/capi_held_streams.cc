#include "tests/capi_held_streams.h"

#include <cstdlib>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_threshold_backward.h"

namespace opserver {

void CApiHeldStreamsTest::SetUp() {
  Options options;
  options.listen = "127.0.0.1:0";
  options.shutdown_grace = absl::ZeroDuration();
  Configure(options);
  auto device = std::make_unique<FakeDevice>(/*max_streams=*/-1,
                                             /*host_addressable=*/true);
  device_ = device.get();
  auto server = Server::Start(options, std::move(device));
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  setenv("OPSERVER_ADDRESS", server_->address().c_str(), 1);
  setenv("OPSERVER_DETECT_MUTEX_DEADLOCKS", "1", 1);
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
}

void CApiHeldStreamsTest::TearDown() {
  if (server_ != nullptr) {
    for (const auto& record : device_->streams()) record->ReleaseLaunches();
  }
  aclFinalize();
  server_.reset();
}

std::pair<aclrtStream, std::shared_ptr<FakeStreamRecord>>
CApiHeldStreamsTest::NewStream() {
  const size_t before = device_->streams().size();
  aclrtStream stream = nullptr;
  EXPECT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS) << LastError();
  auto records = device_->streams();
  EXPECT_EQ(records.size(), before + 1);
  return {stream, records.back()};
}

void* CApiHeldStreamsTest::Floats(const std::vector<float>& values) {
  void* data = nullptr;
  const size_t bytes = values.size() * sizeof(float);
  EXPECT_EQ(aclrtMalloc(&data, bytes, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  EXPECT_EQ(aclrtMemcpy(data, bytes, values.data(), bytes,
                        ACL_MEMCPY_HOST_TO_DEVICE),
            ACL_SUCCESS)
      << LastError();
  return data;
}

void CApiHeldStreamsTest::CopyByLaunch(void* grad, void* self, void* out,
                                       aclrtStream stream) {
  const int64_t shape[] = {kN};
  aclTensor* g = aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0,
                                 ACL_FORMAT_ND, shape, 1, grad);
  aclTensor* s = aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0,
                                 ACL_FORMAT_ND, shape, 1, self);
  aclTensor* o = aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0,
                                 ACL_FORMAT_ND, shape, 1, out);
  float zero = 0;
  aclScalar* threshold = aclCreateScalar(&zero, ACL_FLOAT);
  uint64_t workspace = 0;
  aclOpExecutor* executor = nullptr;
  EXPECT_EQ(aclnnThresholdBackwardGetWorkspaceSize(g, s, threshold, o,
                                                   &workspace, &executor),
            ACLNN_SUCCESS)
      << LastError();
  EXPECT_EQ(aclnnThresholdBackward(nullptr, 0, executor, stream),
            ACLNN_SUCCESS)
      << LastError();
  aclDestroyTensor(g);
  aclDestroyTensor(s);
  aclDestroyTensor(o);
  aclDestroyScalar(threshold);
}

CApiHeldStreamsTest::Held CApiHeldStreamsTest::HoldOne(
    aclrtStream stream, FakeStreamRecord& record) {
  std::vector<float> g(kN);
  for (int64_t i = 0; i < kN; ++i) g[i] = static_cast<float>(i + 1);
  Held held{Floats(g), Floats(std::vector<float>(kN, 10)),
            Floats(std::vector<float>(kN, -1))};
  record.HoldLaunches();
  CopyByLaunch(held.g, held.x, held.y, stream);
  for (int i = 0; i < 60000 && record.WaitingLaunches() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(record.WaitingLaunches(), 1);
  return held;
}

void CApiHeldStreamsTest::ExpectRan(const Held& held) {
  std::vector<float> y(kN, 0);
  ASSERT_EQ(aclrtMemcpy(y.data(), kN * 4, held.y, kN * 4,
                        ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_SUCCESS)
      << LastError();
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(y[i], static_cast<float>(i + 1)) << i;
  }
  for (void* p : {held.g, held.x, held.y}) aclrtFree(p);
}

}  // namespace opserver
