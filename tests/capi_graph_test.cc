// The C API's graph capture (aclmdlRI) over a device whose streams a test
// can hold (FakeDevice): a capture records without running, a replay
// computes what the same work run eagerly computes, fork and join across
// streams, two graphs side by side, and every call a capture refuses, with
// CANN's codes.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_dropout_backward.h"
#include "aclnnop/aclnn_hardswish_backward.h"
#include "aclnnop/aclnn_leaky_relu_backward.h"
#include "aclnnop/aclnn_softshrink_backward.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "kernels/op_signatures.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/capi_held_streams.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

// Every operator's two phases, its arguments filled by kind: FLOAT and
// SCALAR parameters take the test's scalar, DOUBLE 2.0, BOOL false.
using PlanFn =
    std::function<aclnnStatus(const aclTensor*, const aclTensor*, aclTensor*,
                              const aclScalar*, uint64_t*, aclOpExecutor**)>;
using LaunchFn =
    std::function<aclnnStatus(void*, uint64_t, aclOpExecutor*, aclrtStream)>;
struct Operator {
  std::string name;
  PlanFn plan;
  LaunchFn launch;
};

#define TEST_ARG_FLOAT , scalar
#define TEST_ARG_SCALAR , scalar
#define TEST_ARG_DOUBLE , 2.0
#define TEST_ARG_BOOL , false
#define TEST_ARG(KIND, name, field) TEST_ARG_##KIND
#define TEST_OPERATOR(Name, in0, in1, out, PARAMS)                          \
  Operator{#Name,                                                           \
           [](const aclTensor* a, const aclTensor* b, aclTensor* o,         \
              const aclScalar* scalar, uint64_t* ws, aclOpExecutor** ex) {  \
             (void)scalar;                                                  \
             return aclnn##Name##GetWorkspaceSize(a, b PARAMS(TEST_ARG), o, \
                                                  ws, ex);                  \
           },                                                               \
           [](void* w, uint64_t n, aclOpExecutor* e, aclrtStream s) {       \
             return aclnn##Name(w, n, e, s);                                \
           }},
const std::vector<Operator>& Operators() {
  static const auto* const operators =
      new std::vector<Operator>{OPSERVER_OPERATORS(TEST_OPERATOR)};
  return *operators;
}
#undef TEST_OPERATOR

class CApiGraphTest : public CApiHeldStreamsTest {
 protected:
  void TearDown() override {
    // The thread's mode back to the default for the next test.
    aclmdlRICaptureMode global = ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;
    aclmdlRICaptureThreadExchangeMode(&global);
    CApiHeldStreamsTest::TearDown();
  }

  void* Device(const std::vector<uint8_t>& bytes) {
    void* data = nullptr;
    EXPECT_EQ(aclrtMalloc(&data, bytes.size(), ACL_MEM_MALLOC_HUGE_FIRST),
              ACL_SUCCESS);
    EXPECT_EQ(aclrtMemcpy(data, bytes.size(), bytes.data(), bytes.size(),
                          ACL_MEMCPY_HOST_TO_DEVICE),
              ACL_SUCCESS)
        << LastError();
    return data;
  }
  std::vector<uint8_t> Read(const void* data, size_t size) {
    std::vector<uint8_t> bytes(size);
    EXPECT_EQ(
        aclrtMemcpy(bytes.data(), size, data, size, ACL_MEMCPY_DEVICE_TO_HOST),
        ACL_SUCCESS)
        << LastError();
    return bytes;
  }
  std::vector<float> ReadFloats(const void* data, size_t count) {
    std::vector<uint8_t> bytes = Read(data, count * 4);
    std::vector<float> values(count);
    std::memcpy(values.data(), bytes.data(), bytes.size());
    return values;
  }
  void Poison(void* data, size_t size) {
    ASSERT_EQ(aclrtMemset(data, size, 0xA5, size), ACL_SUCCESS) << LastError();
  }

  // A capture of CopyByLaunch(g, x, out) on `stream`, ended: the model.
  aclmdlRI CaptureCopy(aclrtStream stream, void* g, void* x, void* out) {
    EXPECT_EQ(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
              ACL_SUCCESS)
        << LastError();
    CopyByLaunch(g, x, out, stream);
    aclmdlRI model = nullptr;
    EXPECT_EQ(aclmdlRICaptureEnd(stream, &model), ACL_SUCCESS) << LastError();
    return model;
  }

  aclmdlRICaptureStatus StatusOf(aclrtStream stream) {
    aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
    aclmdlRI model = nullptr;
    EXPECT_EQ(aclmdlRICaptureGetInfo(stream, &status, &model), ACL_SUCCESS);
    return status;
  }

  std::vector<float> Ramp(int64_t n, float from) {
    std::vector<float> values(n);
    for (int64_t i = 0; i < n; ++i) values[i] = from + static_cast<float>(i);
    return values;
  }
};

TEST_F(CApiGraphTest, CaptureRecordsAndRunsOnlyWhenReplayed) {
  auto [a, a_device] = NewStream();
  void* g = Floats(Ramp(kN, 1));
  void* x = Floats(std::vector<float>(kN, 10));
  void* y = Floats(std::vector<float>(kN, -1));
  ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_SUCCESS)
      << LastError();
  aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  aclmdlRI during = nullptr;
  ASSERT_EQ(aclmdlRICaptureGetInfo(a, &status, &during), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE);
  EXPECT_NE(during, nullptr);
  CopyByLaunch(g, x, y, a);
  ASSERT_EQ(aclrtMemsetAsync(g, 8, 0, 8, a), ACL_SUCCESS) << LastError();
  aclmdlRI model = nullptr;
  ASSERT_EQ(aclmdlRICaptureEnd(a, &model), ACL_SUCCESS) << LastError();
  EXPECT_EQ(model, during);
  ASSERT_EQ(aclmdlRICaptureGetInfo(a, &status, &during), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_MODEL_RI_CAPTURE_STATUS_NONE);
  EXPECT_EQ(during, nullptr);

  // Nothing ran: the output keeps its poison, the input its values.
  ASSERT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS) << LastError();
  EXPECT_EQ(a_device->launches.load(), 0);
  EXPECT_EQ(ReadFloats(y, kN), std::vector<float>(kN, -1));
  EXPECT_EQ(ReadFloats(g, 2), Ramp(2, 1));

  ASSERT_EQ(aclmdlRIExecuteAsync(model, a), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS) << LastError();
  EXPECT_EQ(a_device->launches.load(), 1);
  EXPECT_EQ(ReadFloats(y, kN), Ramp(kN, 1));
  EXPECT_EQ(ReadFloats(g, 2), std::vector<float>(2, 0));
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS) << LastError();
  EXPECT_EQ(aclmdlRIExecuteAsync(model, a), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_ERROR_INVALID_PARAM);
}

// Host bytes of `count` values of `dtype` (FLOAT or BF16), varied and
// signed, so every operator's branches are taken.
std::vector<uint8_t> Values(aclDataType dtype, int64_t count, int seed) {
  std::vector<uint8_t> bytes;
  for (int64_t i = 0; i < count; ++i) {
    const float value =
        static_cast<float>(((i * 37 + seed * 11) % 97) - 48) / 8.0f;
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    const int width = dtype == ACL_FLOAT ? 4 : 2;
    if (width == 2) bits >>= 16;  // BF16: the float's top half.
    for (int b = 0; b < width; ++b) bytes.push_back((bits >> (8 * b)) & 0xff);
  }
  return bytes;
}

TEST_F(CApiGraphTest, ReplaysAreBitIdenticalToEagerForEveryOperator) {
  constexpr int64_t kCount = 1024;  // A multiple of 128: a whole mask.
  auto [a, a_device] = NewStream();
  auto [b, b_device] = NewStream();
  float half = 0.5f;
  aclScalar* scalar = aclCreateScalar(&half, ACL_FLOAT);
  for (const Operator& op : Operators()) {
    for (aclDataType dtype : {ACL_FLOAT, ACL_BF16}) {
      SCOPED_TRACE(op.name + (dtype == ACL_FLOAT ? " FLOAT" : " BF16"));
      const bool dropout = op.name == "DropoutBackward";
      const int width = dtype == ACL_FLOAT ? 4 : 2;
      const size_t out_bytes = kCount * width;
      void* in0 = Device(Values(dtype, kCount, 1));
      std::vector<uint8_t> mask(kCount / 8);
      for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i * 73) & 0xff;
      void* in1 = Device(dropout ? mask : Values(dtype, kCount, 2));
      void* eager = Device(std::vector<uint8_t>(out_bytes, 0xA5));
      void* captured = Device(std::vector<uint8_t>(out_bytes, 0xA5));
      const int64_t shape[] = {kCount};
      const int64_t mask_shape[] = {kCount / 8};
      auto plan_and_launch = [&](void* out, aclrtStream stream) {
        aclTensor* t0 = aclCreateTensor(shape, 1, dtype, nullptr, 0,
                                        ACL_FORMAT_ND, shape, 1, in0);
        aclTensor* t1 =
            dropout ? aclCreateTensor(mask_shape, 1, ACL_UINT8, nullptr, 0,
                                      ACL_FORMAT_ND, mask_shape, 1, in1)
                    : aclCreateTensor(shape, 1, dtype, nullptr, 0,
                                      ACL_FORMAT_ND, shape, 1, in1);
        aclTensor* o = aclCreateTensor(shape, 1, dtype, nullptr, 0,
                                       ACL_FORMAT_ND, shape, 1, out);
        uint64_t ws = 0;
        aclOpExecutor* ex = nullptr;
        EXPECT_EQ(op.plan(t0, t1, o, scalar, &ws, &ex), ACLNN_SUCCESS)
            << LastError();
        void* workspace = nullptr;
        if (ws > 0) {
          EXPECT_EQ(aclrtMalloc(&workspace, ws, ACL_MEM_MALLOC_HUGE_FIRST),
                    ACL_SUCCESS);
        }
        EXPECT_EQ(op.launch(workspace, ws, ex, stream), ACLNN_SUCCESS)
            << LastError();
        aclDestroyTensor(t0);
        aclDestroyTensor(t1);
        aclDestroyTensor(o);
      };
      plan_and_launch(eager, a);
      ASSERT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS) << LastError();
      const std::vector<uint8_t> expected = Read(eager, out_bytes);
      ASSERT_NE(expected, std::vector<uint8_t>(out_bytes, 0xA5));

      ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
                ACL_SUCCESS);
      plan_and_launch(captured, a);
      aclmdlRI model = nullptr;
      ASSERT_EQ(aclmdlRICaptureEnd(a, &model), ACL_SUCCESS) << LastError();
      EXPECT_EQ(Read(captured, out_bytes),
                std::vector<uint8_t>(out_bytes, 0xA5));
      for (aclrtStream replay_on : {a, b}) {
        Poison(captured, out_bytes);
        ASSERT_EQ(aclmdlRIExecuteAsync(model, replay_on), ACL_SUCCESS)
            << LastError();
        ASSERT_EQ(aclrtSynchronizeStream(replay_on), ACL_SUCCESS)
            << LastError();
        EXPECT_EQ(Read(captured, out_bytes), expected);
      }
      EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
    }
  }
  aclDestroyScalar(scalar);
}

TEST_F(CApiGraphTest, ReplaysViewsBroadcastAndZeroDimLikeEager) {
  auto [a, a_device] = NewStream();
  // gradOutput: one row broadcast over 8 (stride 0); self: the transpose
  // of an 8x8 storage; out: 8x8. And a 0-d call.
  void* g = Floats(Ramp(8, -3));
  void* x = Floats(Ramp(64, -20));
  void* scalar_g = Floats({2.5f});
  void* scalar_x = Floats({-1.0f});
  const int64_t shape[] = {8, 8};
  const int64_t broadcast[] = {0, 1};
  const int64_t row[] = {8};
  const int64_t transposed[] = {1, 8};
  const int64_t storage[] = {64};
  float threshold = 0.0f;
  aclScalar* th = aclCreateScalar(&threshold, ACL_FLOAT);
  auto run = [&](void* out, void* out0, aclrtStream stream) {
    aclTensor* tg = aclCreateTensor(shape, 2, ACL_FLOAT, broadcast, 0,
                                    ACL_FORMAT_ND, row, 1, g);
    aclTensor* tx = aclCreateTensor(shape, 2, ACL_FLOAT, transposed, 0,
                                    ACL_FORMAT_ND, storage, 1, x);
    aclTensor* to = aclCreateTensor(shape, 2, ACL_FLOAT, nullptr, 0,
                                    ACL_FORMAT_ND, storage, 1, out);
    aclTensor* sg = aclCreateTensor(nullptr, 0, ACL_FLOAT, nullptr, 0,
                                    ACL_FORMAT_ND, nullptr, 0, scalar_g);
    aclTensor* sx = aclCreateTensor(nullptr, 0, ACL_FLOAT, nullptr, 0,
                                    ACL_FORMAT_ND, nullptr, 0, scalar_x);
    aclTensor* so = aclCreateTensor(nullptr, 0, ACL_FLOAT, nullptr, 0,
                                    ACL_FORMAT_ND, nullptr, 0, out0);
    for (auto [i0, i1, o] : {std::tuple{tg, tx, to}, std::tuple{sg, sx, so}}) {
      uint64_t ws = 0;
      aclOpExecutor* ex = nullptr;
      ASSERT_EQ(aclnnThresholdBackwardGetWorkspaceSize(i0, i1, th, o, &ws, &ex),
                ACLNN_SUCCESS)
          << LastError();
      ASSERT_EQ(ws, 0u);
      ASSERT_EQ(aclnnThresholdBackward(nullptr, 0, ex, stream), ACLNN_SUCCESS)
          << LastError();
    }
    for (aclTensor* t : {tg, tx, to, sg, sx, so}) aclDestroyTensor(t);
  };
  void* eager = Floats(std::vector<float>(64, -7));
  void* eager0 = Floats({-7});
  run(eager, eager0, a);
  ASSERT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS) << LastError();
  void* replayed = Floats(std::vector<float>(64, -7));
  void* replayed0 = Floats({-7});
  ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_SUCCESS);
  run(replayed, replayed0, a);
  aclmdlRI model = nullptr;
  ASSERT_EQ(aclmdlRICaptureEnd(a, &model), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclmdlRIExecute(model, 60000), ACL_SUCCESS) << LastError();
  EXPECT_EQ(Read(replayed, 256), Read(eager, 256));
  EXPECT_EQ(Read(replayed0, 4), Read(eager0, 4));
  EXPECT_EQ(ReadFloats(eager0, 1), std::vector<float>{0.0f});  // x <= 0.
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
  aclDestroyScalar(th);
}

TEST_F(CApiGraphTest, ForkAndJoinAcrossTwoStreams) {
  auto [a, a_device] = NewStream();
  auto [b, b_device] = NewStream();
  auto [c, c_device] = NewStream();
  void* g = Floats(Ramp(kN, 1));
  void* x = Floats(std::vector<float>(kN, 10));
  void* y = Floats(std::vector<float>(kN, -1));
  void* z = Floats(std::vector<float>(kN, -2));
  void* w = Floats(std::vector<float>(kN, -3));
  aclrtEvent fork = nullptr, join = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&fork), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateEvent(&join), ACL_SUCCESS);
  ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_SUCCESS);
  CopyByLaunch(g, x, y, a);  // y = g on a
  ASSERT_EQ(aclrtRecordEvent(fork, a), ACL_SUCCESS) << LastError();
  EXPECT_EQ(StatusOf(b), ACL_MODEL_RI_CAPTURE_STATUS_NONE);
  ASSERT_EQ(aclrtStreamWaitEvent(b, fork), ACL_SUCCESS) << LastError();
  // b joined the capture: its work is recorded too.
  aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  aclmdlRI of_a = nullptr, of_b = nullptr;
  ASSERT_EQ(aclmdlRICaptureGetInfo(a, &status, &of_a), ACL_SUCCESS);
  ASSERT_EQ(aclmdlRICaptureGetInfo(b, &status, &of_b), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(of_a, of_b);
  CopyByLaunch(y, x, z, b);  // z = y on b, after the fork
  ASSERT_EQ(aclrtRecordEvent(join, b), ACL_SUCCESS);
  ASSERT_EQ(aclrtStreamWaitEvent(a, join), ACL_SUCCESS) << LastError();
  CopyByLaunch(z, x, w, a);  // w = z on a, after the join
  aclmdlRI model = nullptr;
  EXPECT_EQ(aclmdlRICaptureEnd(b, &model),
            ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED);
  ASSERT_EQ(aclmdlRICaptureEnd(a, &model), ACL_SUCCESS) << LastError();
  EXPECT_EQ(StatusOf(b), ACL_MODEL_RI_CAPTURE_STATUS_NONE);
  ASSERT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS) << LastError();
  EXPECT_EQ(a_device->launches.load() + b_device->launches.load(), 0);
  EXPECT_EQ(ReadFloats(w, kN), std::vector<float>(kN, -3));

  // Replayed on a third stream: the whole chain, in order.
  ASSERT_EQ(aclmdlRIExecuteAsync(model, c), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtSynchronizeStream(c), ACL_SUCCESS) << LastError();
  EXPECT_EQ(ReadFloats(y, kN), Ramp(kN, 1));
  EXPECT_EQ(ReadFloats(z, kN), Ramp(kN, 1));
  EXPECT_EQ(ReadFloats(w, kN), Ramp(kN, 1));
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
}

TEST_F(CApiGraphTest, AForkThatNeverJoinsBackIsRefusedAtEnd) {
  auto [a, a_device] = NewStream();
  auto [b, b_device] = NewStream();
  void* g = Floats(Ramp(kN, 1));
  void* x = Floats(std::vector<float>(kN, 10));
  void* y = Floats(std::vector<float>(kN, -1));
  aclrtEvent fork = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&fork), ACL_SUCCESS);
  ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_SUCCESS);
  ASSERT_EQ(aclrtRecordEvent(fork, a), ACL_SUCCESS);
  ASSERT_EQ(aclrtStreamWaitEvent(b, fork), ACL_SUCCESS);
  CopyByLaunch(g, x, y, b);
  aclmdlRI model = nullptr;
  EXPECT_EQ(aclmdlRICaptureEnd(a, &model), ACL_ERROR_RT_STREAM_UNJOINED);
  EXPECT_THAT(LastError(), HasSubstr("did not join back"));
  EXPECT_EQ(model, nullptr);
  // The default stream cannot join a capture.
  ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_SUCCESS);
  ASSERT_EQ(aclrtRecordEvent(fork, a), ACL_SUCCESS);
  EXPECT_EQ(aclrtStreamWaitEvent(nullptr, fork),
            ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_THAT(LastError(), HasSubstr("default stream cannot wait"));
  EXPECT_EQ(StatusOf(a), ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED);
  EXPECT_EQ(aclmdlRICaptureEnd(a, &model),
            ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  // The captures are over on both streams; they work eagerly again.
  EXPECT_EQ(StatusOf(a), ACL_MODEL_RI_CAPTURE_STATUS_NONE);
  EXPECT_EQ(StatusOf(b), ACL_MODEL_RI_CAPTURE_STATUS_NONE);
  CopyByLaunch(g, x, y, b);
  ASSERT_EQ(aclrtSynchronizeStream(b), ACL_SUCCESS) << LastError();
  EXPECT_EQ(ReadFloats(y, kN), Ramp(kN, 1));
}

TEST_F(CApiGraphTest, TwoGraphsReplaySideBySide) {
  auto [a, a_device] = NewStream();
  auto [b, b_device] = NewStream();
  void* g1 = Floats(Ramp(kN, 1));
  void* g2 = Floats(Ramp(kN, 100));
  void* x = Floats(std::vector<float>(kN, 10));
  void* y1 = Floats(std::vector<float>(kN, -1));
  void* y2 = Floats(std::vector<float>(kN, -1));
  aclmdlRI first = CaptureCopy(a, g1, x, y1);
  aclmdlRI second = CaptureCopy(b, g2, x, y2);
  ASSERT_NE(first, second);
  EXPECT_EQ(ReadFloats(y1, kN), std::vector<float>(kN, -1));
  ASSERT_EQ(aclmdlRIExecuteAsync(second, a), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS);
  EXPECT_EQ(ReadFloats(y1, kN), std::vector<float>(kN, -1));
  EXPECT_EQ(ReadFloats(y2, kN), Ramp(kN, 100));
  ASSERT_EQ(aclmdlRIExecuteAsync(first, b), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclmdlRIExecuteAsync(second, a), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS) << LastError();
  EXPECT_EQ(ReadFloats(y1, kN), Ramp(kN, 1));
  EXPECT_EQ(aclmdlRIDestroy(first), ACL_SUCCESS);
  // The other one is untouched by its neighbour's destruction.
  Poison(y2, kN * 4);
  ASSERT_EQ(aclmdlRIExecute(second, -1), ACL_SUCCESS) << LastError();
  EXPECT_EQ(ReadFloats(y2, kN), Ramp(kN, 100));
  EXPECT_EQ(aclmdlRIDestroy(second), ACL_SUCCESS);
}

TEST_F(CApiGraphTest, DestroyWaitsForTheReplaysAlreadyQueued) {
  auto [a, a_device] = NewStream();
  void* g = Floats(Ramp(kN, 1));
  void* x = Floats(std::vector<float>(kN, 10));
  void* y = Floats(std::vector<float>(kN, -1));
  aclmdlRI model = CaptureCopy(a, g, x, y);
  a_device->HoldLaunches();
  ASSERT_EQ(aclmdlRIExecuteAsync(model, a), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclmdlRIExecuteAsync(model, a), ACL_SUCCESS) << LastError();
  for (int i = 0; i < 60000 && a_device->WaitingLaunches() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(a_device->WaitingLaunches(), 1);
  ASSERT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS) << LastError();
  a_device->ReleaseLaunches();
  ASSERT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS) << LastError();
  EXPECT_EQ(a_device->launches.load(), 2);
  EXPECT_EQ(ReadFloats(y, kN), Ramp(kN, 1));
}

TEST_F(CApiGraphTest, ExecutorsAreConsumedUnlessRepeatable) {
  auto [a, a_device] = NewStream();
  void* g = Floats(Ramp(kN, 1));
  void* x = Floats(std::vector<float>(kN, 10));
  void* y = Floats(std::vector<float>(kN, -1));
  void* z = Floats(std::vector<float>(kN, -1));
  const int64_t shape[] = {kN};
  auto tensor = [&](void* data) {
    return aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND,
                           shape, 1, data);
  };
  aclTensor* tg = tensor(g);
  aclTensor* tx = tensor(x);
  aclTensor* ty = tensor(y);
  aclTensor* tz = tensor(z);
  float zero = 0;
  aclScalar* th = aclCreateScalar(&zero, ACL_FLOAT);
  uint64_t ws = 0;
  aclOpExecutor* once = nullptr;
  aclOpExecutor* again = nullptr;
  ASSERT_EQ(aclnnThresholdBackwardGetWorkspaceSize(tg, tx, th, ty, &ws, &once),
            ACLNN_SUCCESS);
  ASSERT_EQ(aclnnThresholdBackwardGetWorkspaceSize(tg, tx, th, tz, &ws, &again),
            ACLNN_SUCCESS);
  ASSERT_EQ(aclSetAclOpExecutorRepeatable(again), ACLNN_SUCCESS);
  ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_SUCCESS);
  ASSERT_EQ(aclnnThresholdBackward(nullptr, 0, once, a), ACLNN_SUCCESS);
  // The single-use executor is the model's now: a second launch, in the
  // capture or after it, is refused at once.
  EXPECT_EQ(aclnnThresholdBackward(nullptr, 0, once, a),
            ACLNN_ERR_INNER_NULLPTR);
  EXPECT_THAT(LastError(), HasSubstr("already consumed"));
  ASSERT_EQ(aclnnThresholdBackward(nullptr, 0, again, a), ACLNN_SUCCESS);
  aclmdlRI model = nullptr;
  ASSERT_EQ(aclmdlRICaptureEnd(a, &model), ACL_SUCCESS) << LastError();
  EXPECT_EQ(aclnnThresholdBackward(nullptr, 0, once, a),
            ACLNN_ERR_INNER_NULLPTR);
  // The repeatable one is still the program's.
  ASSERT_EQ(aclnnThresholdBackward(nullptr, 0, again, a), ACLNN_SUCCESS)
      << LastError();
  ASSERT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS) << LastError();
  EXPECT_EQ(ReadFloats(z, kN), Ramp(kN, 1));
  EXPECT_EQ(ReadFloats(y, kN), std::vector<float>(kN, -1));
  ASSERT_EQ(aclmdlRIExecute(model, -1), ACL_SUCCESS) << LastError();
  EXPECT_EQ(ReadFloats(y, kN), Ramp(kN, 1));
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
  EXPECT_EQ(aclDestroyAclOpExecutor(again), ACLNN_SUCCESS) << LastError();
  for (aclTensor* t : {tg, tx, ty, tz}) aclDestroyTensor(t);
  aclDestroyScalar(th);
}

TEST_F(CApiGraphTest, AReplayAfterAFreeFailsOnItsStream) {
  auto [a, a_device] = NewStream();
  void* g = Floats(Ramp(kN, 1));
  void* x = Floats(std::vector<float>(kN, 10));
  void* y = Floats(std::vector<float>(kN, -1));
  aclmdlRI model = CaptureCopy(a, g, x, y);
  ASSERT_EQ(aclrtFree(y), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclmdlRIExecuteAsync(model, a), ACL_SUCCESS) << LastError();
  EXPECT_NE(aclrtSynchronizeStream(a), ACL_SUCCESS);
  EXPECT_THAT(LastError(), HasSubstr("was freed after the graph was defined"));
  EXPECT_EQ(a_device->launches.load(), 0);
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS) << LastError();
}

TEST_F(CApiGraphTest, AResetDeviceEndsItsCapturesAndModels) {
  auto [a, a_device] = NewStream();
  void* g = Floats(Ramp(kN, 1));
  void* x = Floats(std::vector<float>(kN, 10));
  void* y = Floats(std::vector<float>(kN, -1));
  aclmdlRI model = CaptureCopy(a, g, x, y);
  ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_SUCCESS);
  CopyByLaunch(g, x, y, a);
  ASSERT_EQ(aclrtResetDevice(0), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
  EXPECT_EQ(aclmdlRIExecuteAsync(model, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_ERROR_INVALID_PARAM);
  // No capture is left to forbid this thread's synchronous calls.
  void* d = Floats({1, 2});
  EXPECT_EQ(ReadFloats(d, 2), (std::vector<float>{1, 2}));
}

TEST_F(CApiGraphTest, DebugJsonPrintListsTheTasks) {
  auto [a, a_device] = NewStream();
  void* g = Floats(Ramp(kN, 1));
  void* x = Floats(std::vector<float>(kN, 10));
  void* y = Floats(std::vector<float>(kN, -1));
  aclrtEvent event = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&event), ACL_SUCCESS);
  ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_SUCCESS);
  ASSERT_EQ(aclrtMemsetAsync(y, 16, 0, 16, a), ACL_SUCCESS);
  CopyByLaunch(g, x, y, a);
  ASSERT_EQ(aclrtMemcpyAsync(x, 16, g, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, a),
            ACL_SUCCESS)
      << LastError();
  ASSERT_EQ(aclrtRecordEvent(event, a), ACL_SUCCESS);
  aclmdlRI model = nullptr;
  ASSERT_EQ(aclmdlRICaptureEnd(a, &model), ACL_SUCCESS) << LastError();
  const std::string dir = std::getenv("TEST_TMPDIR");
  for (uint32_t flags : {0u, 1u}) {
    const std::string path = dir + "/model" + std::to_string(flags) + ".json";
    ASSERT_EQ(aclmdlRIDebugJsonPrint(model, path.c_str(), flags), ACL_SUCCESS)
        << LastError();
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    google::protobuf::Struct parsed;
    ASSERT_TRUE(
        google::protobuf::util::JsonStringToMessage(text.str(), &parsed).ok())
        << text.str();
    EXPECT_EQ(parsed.fields().at("task_count").number_value(), 4);
    const auto& tasks = parsed.fields().at("tasks").list_value().values();
    ASSERT_EQ(tasks.size(), 4);
    std::vector<std::string> types;
    for (const auto& task : tasks) {
      types.push_back(task.struct_value().fields().at("type").string_value());
    }
    EXPECT_EQ(types, (std::vector<std::string>{"memset", "launch", "copy",
                                               "record_event"}));
    const auto& launch = tasks[1].struct_value().fields();
    EXPECT_EQ(launch.at("op").string_value(), "ThresholdBackward");
    EXPECT_EQ(launch.count("executor"), flags);  // Verbose only.
    EXPECT_EQ(tasks[0].struct_value().fields().count("size"), flags);
  }
  EXPECT_EQ(aclmdlRIDebugJsonPrint(model, (dir + "/none/x.json").c_str(), 0),
            ACL_ERROR_RT_FILE_OPEN);
  EXPECT_EQ(aclmdlRIDebugJsonPrint(model, nullptr, 0), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclmdlRIDebugJsonPrint(model, "x", 2), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
  EXPECT_EQ(aclmdlRIDebugJsonPrint(model, (dir + "/y.json").c_str(), 0),
            ACL_ERROR_INVALID_PARAM);
}

TEST_F(CApiGraphTest, BeginAndEndRefuseWithCannsCodes) {
  auto [a, a_device] = NewStream();
  auto [b, b_device] = NewStream();
  aclmdlRI model = nullptr;
  EXPECT_EQ(aclmdlRICaptureEnd(a, &model), ACL_ERROR_RT_STREAM_NOT_CAPTURED);
  EXPECT_EQ(aclmdlRICaptureBegin(nullptr, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclmdlRICaptureBegin(a, static_cast<aclmdlRICaptureMode>(7)),
            ACL_ERROR_INVALID_PARAM);
  ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_SUCCESS);
  EXPECT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_RELAXED),
            ACL_ERROR_RT_STREAM_CAPTURED);
  EXPECT_THAT(LastError(), HasSubstr("already capturing"));
  EXPECT_EQ(aclmdlRICaptureEnd(b, &model), ACL_ERROR_RT_STREAM_NOT_CAPTURED);
  EXPECT_EQ(aclmdlRICaptureEnd(a, nullptr), ACL_ERROR_INVALID_PARAM);
  // From another thread: refused, and the capture goes on.
  aclError other = ACL_SUCCESS;
  std::thread([&] {
    aclmdlRI ignored = nullptr;
    other = aclmdlRICaptureEnd(a, &ignored);
  }).join();
  EXPECT_EQ(other, ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD);
  EXPECT_EQ(StatusOf(a), ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE);
  aclmdlRI during = nullptr;
  aclmdlRICaptureStatus status;
  ASSERT_EQ(aclmdlRICaptureGetInfo(a, &status, &during), ACL_SUCCESS);
  EXPECT_EQ(aclmdlRIDestroy(during), ACL_ERROR_RT_MODEL_CAPTURED);
  EXPECT_EQ(aclmdlRIExecuteAsync(during, b), ACL_ERROR_RT_MODEL_CAPTURED);
  EXPECT_EQ(aclmdlRICaptureGetInfo(a, nullptr, &during),
            ACL_ERROR_INVALID_PARAM);
  // Nothing captured: an empty model, whose replay does nothing.
  ASSERT_EQ(aclmdlRICaptureEnd(a, &model), ACL_SUCCESS) << LastError();
  EXPECT_EQ(aclmdlRIExecuteAsync(model, a), ACL_SUCCESS);
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);

  // A RELAXED capture may end on another thread.
  ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_RELAXED),
            ACL_SUCCESS);
  std::thread([&] { other = aclmdlRICaptureEnd(a, &model); }).join();
  EXPECT_EQ(other, ACL_SUCCESS);
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
}

TEST_F(CApiGraphTest, WaitingOnCapturedWorkIsRefusedAndInvalidates) {
  auto [a, a_device] = NewStream();
  aclrtEvent event = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&event), ACL_SUCCESS);
  const std::vector<std::pair<std::string, std::function<aclError()>>> calls = {
      {"aclrtSynchronizeStream", [&] { return aclrtSynchronizeStream(a); }},
      {"aclrtSynchronizeStreamWithTimeout",
       [&] { return aclrtSynchronizeStreamWithTimeout(a, 100); }},
      {"aclrtStreamQuery",
       [&] {
         aclrtStreamStatus s;
         return aclrtStreamQuery(a, &s);
       }},
      {"aclrtDestroyStream", [&] { return aclrtDestroyStream(a); }}};
  for (const auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_RELAXED),
              ACL_SUCCESS);
    EXPECT_EQ(call(), ACL_ERROR_RT_STREAM_CAPTURED);
    EXPECT_THAT(LastError(), HasSubstr(name + ": stream"));
    EXPECT_EQ(StatusOf(a), ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED);
    // Work on an invalidated capture is refused too.
    EXPECT_EQ(aclrtRecordEvent(event, a),
              ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
    aclmdlRI model = nullptr;
    EXPECT_EQ(aclmdlRICaptureEnd(a, &model),
              ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
    EXPECT_THAT(LastError(), HasSubstr(name));
    EXPECT_EQ(model, nullptr);
    EXPECT_EQ(StatusOf(a), ACL_MODEL_RI_CAPTURE_STATUS_NONE);
  }

  // An event recorded in a capture cannot be asked about or waited for.
  const std::vector<std::pair<std::string, std::function<aclError()>>>
      event_calls = {
          {"aclrtQueryEventStatus",
           [&] {
             aclrtEventRecordedStatus s;
             return aclrtQueryEventStatus(event, &s);
           }},
          {"aclrtSynchronizeEvent",
           [&] { return aclrtSynchronizeEvent(event); }},
          {"aclrtSynchronizeEventWithTimeout",
           [&] { return aclrtSynchronizeEventWithTimeout(event, 100); }},
          {"aclrtEventElapsedTime", [&] {
             float ms;
             return aclrtEventElapsedTime(&ms, event, event);
           }}};
  for (const auto& [name, call] : event_calls) {
    SCOPED_TRACE(name);
    ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_RELAXED),
              ACL_SUCCESS);
    ASSERT_EQ(aclrtRecordEvent(event, a), ACL_SUCCESS) << LastError();
    EXPECT_EQ(call(), ACL_ERROR_RT_EVENT_CAPTURED);
    EXPECT_THAT(LastError(), HasSubstr("recorded in a capture"));
    EXPECT_EQ(StatusOf(a), ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED);
    aclmdlRI model = nullptr;
    EXPECT_EQ(aclmdlRICaptureEnd(a, &model),
              ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  }
  // After the capture, the event is an ordinary one again.
  aclrtEventRecordedStatus s;
  EXPECT_EQ(aclrtQueryEventStatus(event, &s), ACL_SUCCESS) << LastError();
}

TEST_F(CApiGraphTest, HostCopiesAndResetsAreNotCaptured) {
  auto [a, a_device] = NewStream();
  void* d = Floats(std::vector<float>(4, 1));
  std::vector<float> pageable(4, 2);
  void* pinned = nullptr;
  ASSERT_EQ(aclrtMallocHost(&pinned, 16), ACL_SUCCESS);
  aclrtEvent event = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&event), ACL_SUCCESS);
  struct Case {
    std::string name;
    std::function<aclError()> call;
    aclError code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"pageable H2D",
       [&] {
         return aclrtMemcpyAsync(d, 16, pageable.data(), 16,
                                 ACL_MEMCPY_HOST_TO_DEVICE, a);
       },
       ACL_ERROR_RT_PARAM_INVALID, "pageable host memory"},
      {"pageable D2H",
       [&] {
         return aclrtMemcpyAsync(pageable.data(), 16, d, 16,
                                 ACL_MEMCPY_DEVICE_TO_HOST, a);
       },
       ACL_ERROR_RT_PARAM_INVALID, "pageable host memory"},
      {"pinned H2D",
       [&] {
         return aclrtMemcpyAsync(d, 16, pinned, 16, ACL_MEMCPY_HOST_TO_DEVICE,
                                 a);
       },
       ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "aclrtMallocHost memory"},
      {"reset", [&] { return aclrtResetEvent(event, a); },
       ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "event reset"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
              ACL_SUCCESS);
    EXPECT_EQ(c.call(), c.code);
    EXPECT_THAT(LastError(), HasSubstr(c.says));
    EXPECT_EQ(StatusOf(a), ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED);
    aclmdlRI model = nullptr;
    EXPECT_EQ(aclmdlRICaptureEnd(a, &model),
              ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  }
  // A host-to-host copy is no device work: done at once, capture or not.
  ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_SUCCESS);
  std::vector<float> copied(4, 0);
  EXPECT_EQ(aclrtMemcpyAsync(copied.data(), 16, pageable.data(), 16,
                             ACL_MEMCPY_HOST_TO_HOST, a),
            ACL_SUCCESS);
  EXPECT_EQ(copied, pageable);
  aclmdlRI model = nullptr;
  EXPECT_EQ(aclmdlRICaptureEnd(a, &model), ACL_SUCCESS);
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
  EXPECT_EQ(aclrtFreeHost(pinned), ACL_SUCCESS);
}

TEST_F(CApiGraphTest, ExchangeModeSwapsThisThreadsMode) {
  aclmdlRICaptureMode mode = ACL_MODEL_RI_CAPTURE_MODE_RELAXED;
  ASSERT_EQ(aclmdlRICaptureThreadExchangeMode(&mode), ACL_SUCCESS);
  EXPECT_EQ(mode, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL);  // The default.
  aclmdlRICaptureMode elsewhere = ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL;
  std::thread([&] { aclmdlRICaptureThreadExchangeMode(&elsewhere); }).join();
  EXPECT_EQ(elsewhere, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL);  // Per thread.
  mode = ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL;
  ASSERT_EQ(aclmdlRICaptureThreadExchangeMode(&mode), ACL_SUCCESS);
  EXPECT_EQ(mode, ACL_MODEL_RI_CAPTURE_MODE_RELAXED);
  EXPECT_EQ(aclmdlRICaptureThreadExchangeMode(nullptr),
            ACL_ERROR_INVALID_PARAM);
  mode = static_cast<aclmdlRICaptureMode>(3);
  EXPECT_EQ(aclmdlRICaptureThreadExchangeMode(&mode), ACL_ERROR_INVALID_PARAM);
}

// Whether a synchronous copy is allowed on a thread in `caller` mode while
// a capture in `capture` mode goes on, begun on this thread (`own`) or on
// another: CANN's (and CUDA's) table. A refused copy invalidates the
// capture.
struct ModeCase {
  aclmdlRICaptureMode capture;
  aclmdlRICaptureMode caller;
  bool own;
  bool allowed;
};

class CApiGraphModeTest : public CApiGraphTest,
                          public ::testing::WithParamInterface<ModeCase> {};

TEST_P(CApiGraphModeTest, UnsafeCallsFollowTheModes) {
  const ModeCase c = GetParam();
  auto [a, a_device] = NewStream();
  void* d = Floats(std::vector<float>(4, 1));
  std::vector<float> host(4, 0);
  auto copy = [&] {
    aclmdlRICaptureMode mode = c.caller;
    aclmdlRICaptureThreadExchangeMode(&mode);
    const aclError result =
        aclrtMemcpy(host.data(), 16, d, 16, ACL_MEMCPY_DEVICE_TO_HOST);
    aclmdlRICaptureThreadExchangeMode(&mode);
    return result;
  };
  ASSERT_EQ(aclmdlRICaptureBegin(a, c.capture), ACL_SUCCESS);
  aclError result;
  if (c.own) {
    result = copy();
  } else {
    std::thread([&] { result = copy(); }).join();
  }
  if (c.allowed) {
    EXPECT_EQ(result, ACL_SUCCESS);
    EXPECT_EQ(host, std::vector<float>(4, 1));
    EXPECT_EQ(StatusOf(a), ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE);
  } else {
    EXPECT_EQ(result, ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT);
    EXPECT_EQ(StatusOf(a), ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED);
  }
  aclmdlRI model = nullptr;
  EXPECT_EQ(aclmdlRICaptureEnd(a, &model),
            c.allowed ? ACL_SUCCESS : ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  if (model != nullptr) {
    EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
  }
}

constexpr aclmdlRICaptureMode kG = ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;
constexpr aclmdlRICaptureMode kT = ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL;
constexpr aclmdlRICaptureMode kR = ACL_MODEL_RI_CAPTURE_MODE_RELAXED;

INSTANTIATE_TEST_SUITE_P(
    Table, CApiGraphModeTest,
    ::testing::Values(
        // This thread's own capture.
        ModeCase{kG, kG, true, false}, ModeCase{kG, kT, true, false},
        ModeCase{kG, kR, true, true}, ModeCase{kT, kG, true, false},
        ModeCase{kT, kT, true, false}, ModeCase{kT, kR, true, true},
        ModeCase{kR, kG, true, true}, ModeCase{kR, kT, true, true},
        // Another thread's capture: only GLOBAL reaches a GLOBAL thread.
        ModeCase{kG, kG, false, false}, ModeCase{kG, kT, false, true},
        ModeCase{kG, kR, false, true}, ModeCase{kT, kG, false, true},
        ModeCase{kR, kG, false, true}));

TEST_F(CApiGraphTest, OtherUnsafeCallsAreRefusedToo) {
  auto [a, a_device] = NewStream();
  void* d = Floats(std::vector<float>(4, 1));
  const std::vector<std::pair<std::string, std::function<aclError()>>> calls = {
      {"aclrtSynchronizeDevice", [] { return aclrtSynchronizeDevice(); }},
      {"aclrtSynchronizeDeviceWithTimeout",
       [] { return aclrtSynchronizeDeviceWithTimeout(100); }},
      {"aclrtMemset", [&] { return aclrtMemset(d, 16, 0, 16); }}};
  for (const auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    ASSERT_EQ(aclmdlRICaptureBegin(a, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
              ACL_SUCCESS);
    EXPECT_EQ(call(), ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT);
    EXPECT_THAT(LastError(), HasSubstr(name + ": not allowed"));
    aclmdlRI model = nullptr;
    EXPECT_EQ(aclmdlRICaptureEnd(a, &model),
              ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  }
  EXPECT_EQ(ReadFloats(d, 4), std::vector<float>(4, 1));
}

TEST_F(CApiGraphTest, ExecuteRefusesCapturingStreamsAndBadTimeouts) {
  auto [a, a_device] = NewStream();
  auto [b, b_device] = NewStream();
  void* g = Floats(Ramp(kN, 1));
  void* x = Floats(std::vector<float>(kN, 10));
  void* y = Floats(std::vector<float>(kN, -1));
  aclmdlRI model = CaptureCopy(a, g, x, y);
  EXPECT_EQ(aclmdlRIExecute(model, 0), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclmdlRIExecute(model, -2), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclmdlRIExecuteAsync(nullptr, a), ACL_ERROR_INVALID_PARAM);
  ASSERT_EQ(aclmdlRICaptureBegin(b, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_SUCCESS);
  EXPECT_EQ(aclmdlRIExecuteAsync(model, b), ACL_ERROR_RT_STREAM_CAPTURED);
  aclmdlRI none = nullptr;
  EXPECT_EQ(aclmdlRICaptureEnd(b, &none),
            ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(ReadFloats(y, kN), std::vector<float>(kN, -1));
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
}

}  // namespace
}  // namespace opserver
