#include "devices/cpu/cpu_device.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/validate.h"

namespace opserver::cpu {
namespace {

using ::testing::HasSubstr;

// ThresholdBackward over `n` floats at `data` (in place).
kernels::ValidCall Threshold(float* data, int64_t n, double threshold) {
  kernels::TensorView view;
  view.dtype = kernels::DType::kFloat;
  view.shape = {n};
  view.data = data;
  kernels::OpCall call;
  call.op = kernels::OpKind::kThresholdBackward;
  call.grad_output = view;
  call.self = view;
  call.out = view;
  call.params.threshold = threshold;
  absl::StatusOr<kernels::ValidCall> valid = kernels::Validate(call);
  EXPECT_TRUE(valid.ok()) << valid.status();
  return *std::move(valid);
}

// Prepare keeps the shared contract (the workspace size and output shape
// Validate computed) and its stream runs it.
TEST(CpuDeviceTest, PreparesWhatValidateAcceptedAndLaunchesIt) {
  CpuDevice device(/*threads=*/1, /*pool_cache_bytes=*/0, 1 << 20);
  std::vector<float> x = {-1, 0.5f, 2, 3};
  absl::StatusOr<std::unique_ptr<DevicePlan>> plan =
      device.Prepare(Threshold(x.data(), 4, 1.0));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ((*plan)->device(), &device);
  EXPECT_EQ((*plan)->workspace_size(), 0u);
  EXPECT_EQ((*plan)->numel(), 4);
  EXPECT_EQ((*plan)->valid().out_shape, std::vector<int64_t>{4});
  absl::StatusOr<std::unique_ptr<DeviceStream>> stream = device.CreateStream();
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*stream)->Launch(**plan, nullptr, 0).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  // self <= threshold gives 0; otherwise gradOutput (the same values).
  EXPECT_EQ(x, (std::vector<float>{0, 0, 2, 3}));
}

// A stream runs only its own device's plans: another device's (even a CPU
// device's, whose memory the host could reach) is refused, not
// reinterpreted.
// The CPU's answer to what runs on the receiving thread (runtime/
// executor.h): launches of up to 16384 elements, microseconds of work.
TEST(CpuDeviceTest, RunsLaunchesOfUpTo16KElementsWhereTheyArrive) {
  CpuDevice device(/*threads=*/1, /*pool_cache_bytes=*/0, 1 << 20);
  EXPECT_EQ(device.inline_launch_elements(), 16384);
}

TEST(CpuDeviceTest, RefusesAPlanAnotherDevicePrepared) {
  CpuDevice one(/*threads=*/1, /*pool_cache_bytes=*/0, 1 << 20);
  CpuDevice two(/*threads=*/1, /*pool_cache_bytes=*/0, 1 << 20);
  std::vector<float> x = {-1, 2};
  absl::StatusOr<std::unique_ptr<DevicePlan>> plan =
      one.Prepare(Threshold(x.data(), 2, 0.0));
  ASSERT_TRUE(plan.ok());
  absl::StatusOr<std::unique_ptr<DeviceStream>> stream = two.CreateStream();
  ASSERT_TRUE(stream.ok());
  absl::Status status = (*stream)->Launch(**plan, nullptr, 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("another device"));
  EXPECT_EQ(x, (std::vector<float>{-1, 2})) << "nothing ran";
  // A plain DevicePlan (no CPU plan in it) is refused the same way.
  DevicePlan bare(&two, Threshold(x.data(), 2, 0.0));
  EXPECT_EQ((*stream)->Launch(bare, nullptr, 0).code(),
            absl::StatusCode::kInternal);
}

constexpr uint64_t kSlice = CpuStream::kSliceBytes;

// Polls (bounded) until `turns` has `n` slices waiting.
void AwaitWaiting(const ComputeTurns& turns, int n) {
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  while (turns.waiting() != n && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(turns.waiting(), n);
}

// A memset and a copy take one turn per kSliceBytes (rounded up), so they
// are bounded and interleave with other devices' work like launches.
TEST(CpuStreamTest, MemsetAndCopyRunInSlicesEachTakingATurn) {
  ComputeTurns turns(1);
  CpuStream stream(nullptr, nullptr, &turns, /*party=*/0);
  const uint64_t bytes = 5 * kSlice + 7;
  std::vector<char> a(bytes, 0), b(bytes, 0);
  ASSERT_TRUE(stream.Memset(a.data(), 0x5a, bytes).ok());
  EXPECT_EQ(turns.taken(), 6u);
  EXPECT_EQ(std::vector<char>(bytes, 0x5a), a);
  ASSERT_TRUE(stream.CopyOnDevice(b.data(), a.data(), bytes).ok());
  EXPECT_EQ(turns.taken(), 12u);
  EXPECT_EQ(a, b);
  ASSERT_TRUE(stream.Memset(a.data(), 1, 0).ok());
  EXPECT_EQ(turns.taken(), 12u);
}

// Runs `work` on a thread while the test holds every turn of `turns`;
// returns whether it finished before the turn was given back (a minute's
// bound, so that a regression fails instead of hanging), and its status.
struct HeldTurnResult {
  bool ran_while_held = false;
  absl::Status status;
};
HeldTurnResult RunWhileTheOnlyTurnIsHeld(ComputeTurns* turns,
                                         std::function<absl::Status()> work) {
  HeldTurnResult result;
  auto held = std::make_unique<ComputeTurns::Turn>(turns, /*party=*/0);
  absl::Notification done;
  std::thread worker([&] {
    result.status = work();
    done.Notify();
  });
  result.ran_while_held = done.WaitForNotificationWithTimeout(absl::Minutes(1));
  held.reset();
  worker.join();
  return result;
}

// A small launch, memset or copy takes no turn: a tenant's small step runs
// at once, even when other work (here the test, as the same device) holds
// every slot. One element or byte more, and it waits for its turn.
TEST(CpuStreamTest, SmallWorkRunsWithoutATurn) {
  CpuDevice device(/*threads=*/1, /*pool_cache_bytes=*/0, 1 << 20);
  absl::StatusOr<std::unique_ptr<DeviceStream>> created = device.CreateStream();
  ASSERT_TRUE(created.ok());
  auto* stream = static_cast<CpuStream*>(created->get());
  ComputeTurns* turns = stream->turns();
  ASSERT_NE(turns, nullptr);
  const int64_t n = ComputeTurns::kSmallElements;
  std::vector<float> x(n + 1, -1.0f);
  absl::StatusOr<std::unique_ptr<DevicePlan>> small =
      device.Prepare(Threshold(x.data(), n, 0.0));
  absl::StatusOr<std::unique_ptr<DevicePlan>> big =
      device.Prepare(Threshold(x.data(), n + 1, 0.0));
  ASSERT_TRUE(small.ok() && big.ok());
  std::vector<char> a(ComputeTurns::kSmallBytes + 1, 0), b(a.size(), 0);
  const uint64_t bytes = ComputeTurns::kSmallBytes;

  HeldTurnResult launch = RunWhileTheOnlyTurnIsHeld(
      turns, [&] { return stream->Launch(**small, nullptr, 0); });
  EXPECT_TRUE(launch.ran_while_held);
  EXPECT_TRUE(launch.status.ok()) << launch.status;
  EXPECT_EQ(x[n - 1], 0.0f);  // -1 <= 0: the gradient is zeroed.
  HeldTurnResult memset = RunWhileTheOnlyTurnIsHeld(
      turns, [&] { return stream->Memset(a.data(), 0x5a, bytes); });
  EXPECT_TRUE(memset.ran_while_held);
  EXPECT_EQ(a[bytes - 1], 0x5a);
  HeldTurnResult copy = RunWhileTheOnlyTurnIsHeld(
      turns, [&] { return stream->CopyOnDevice(b.data(), a.data(), bytes); });
  EXPECT_TRUE(copy.ran_while_held);
  EXPECT_EQ(b[bytes - 1], 0x5a);
  EXPECT_EQ(turns->taken(), 3u);  // The test's own three.

  // Just above the bounds, each waits for the held turn.
  auto held = std::make_unique<ComputeTurns::Turn>(turns, /*party=*/0);
  std::thread waiters([&] {
    EXPECT_TRUE(stream->Launch(**big, nullptr, 0).ok());
    EXPECT_TRUE(stream->Memset(a.data(), 1, bytes + 1).ok());
    EXPECT_TRUE(stream->CopyOnDevice(b.data(), a.data(), bytes + 1).ok());
  });
  AwaitWaiting(*turns, 1);
  EXPECT_EQ(x[n], -1.0f) << "the bigger launch ran without a turn";
  held.reset();
  waiters.join();
  EXPECT_EQ(x[n], 0.0f);
  EXPECT_EQ(b[bytes], 1);
  EXPECT_EQ(turns->taken(), 7u);
}

// Sliced copies within one buffer still behave as memmove, both ways.
TEST(CpuStreamTest, OverlappingSlicedCopiesAreMemmove) {
  CpuStream stream(nullptr, nullptr);
  const uint64_t bytes = 3 * kSlice + 11;
  const uint64_t shift = kSlice / 2 + 3;
  std::vector<char> buffer(bytes + shift);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = char(i * 7 + i / 251);
  for (const bool forward : {true, false}) {
    std::vector<char> expected = buffer, got = buffer;
    char* dst_e = expected.data() + (forward ? shift : 0);
    char* src_e = expected.data() + (forward ? 0 : shift);
    std::memmove(dst_e, src_e, bytes);
    ASSERT_TRUE(stream
                    .CopyOnDevice(got.data() + (forward ? shift : 0),
                                  got.data() + (forward ? 0 : shift), bytes)
                    .ok());
    EXPECT_EQ(expected, got) << (forward ? "dst after src" : "dst before src");
  }
}

// A cancel (DestroyStream, CloseSession, shutdown: CancelRunning) stops a
// huge memset between slices. The test holds the only turn, so the memset
// waits before its first slice; it is cancelled there, given the turn,
// writes that one slice and stops.
TEST(CpuStreamTest, ACancelStopsAMemsetBetweenSlices) {
  ComputeTurns turns(1);
  CpuStream stream(nullptr, nullptr, &turns, /*party=*/1);
  const uint64_t bytes = 64 * kSlice;
  std::vector<char> buffer(bytes, 0);
  auto held = std::make_unique<ComputeTurns::Turn>(&turns, 0);
  absl::Status result;
  std::thread memset(
      [&] { result = stream.Memset(buffer.data(), 0x7f, bytes); });
  AwaitWaiting(turns, 1);
  stream.CancelRunning();
  held.reset();
  memset.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(result.message()),
              HasSubstr("the memset was cancelled"));
  EXPECT_EQ(buffer[kSlice - 1], 0x7f);  // The slice it had its turn for.
  EXPECT_EQ(buffer[kSlice], 0);         // Nothing after it.
  EXPECT_EQ(buffer[bytes - 1], 0);
  EXPECT_EQ(turns.taken(), 2u);
}

TEST(CpuStreamTest, ACancelledStreamCopiesNothing) {
  CpuStream stream(nullptr, nullptr);
  std::vector<char> a(2 * kSlice, 1), b(2 * kSlice, 0);
  stream.CancelRunning();
  absl::Status copy = stream.CopyOnDevice(b.data(), a.data(), a.size());
  EXPECT_EQ(copy.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(copy.message()), HasSubstr("the copy was cancelled"));
  EXPECT_EQ(b, std::vector<char>(2 * kSlice, 0));
}

// An interrupt (an operator past its execute time-out) stops the memset
// running now as a cancel does, but only while it is set: once cleared,
// the stream works again; a cancel stays.
TEST(CpuStreamTest, AnInterruptStopsTheRunningMemsetAndThenClears) {
  ComputeTurns turns(1);
  CpuStream stream(nullptr, nullptr, &turns, /*party=*/1);
  const uint64_t bytes = 64 * kSlice;
  std::vector<char> buffer(bytes, 0);
  auto held = std::make_unique<ComputeTurns::Turn>(&turns, 0);
  absl::Status result;
  std::thread memset(
      [&] { result = stream.Memset(buffer.data(), 0x7f, bytes); });
  AwaitWaiting(turns, 1);
  stream.SetInterrupted(true);
  held.reset();
  memset.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(result.message()),
              HasSubstr("the memset was interrupted (it ran past the operator "
                        "execute time-out)"));
  EXPECT_EQ(buffer[kSlice], 0);
  stream.SetInterrupted(false);
  EXPECT_TRUE(stream.Memset(buffer.data(), 0x7f, bytes).ok());
  EXPECT_EQ(buffer[bytes - 1], 0x7f);
  stream.CancelRunning();
  stream.SetInterrupted(false);  // Does not undo the cancel.
  EXPECT_EQ(stream.Memset(buffer.data(), 0, bytes).code(),
            absl::StatusCode::kCancelled);
}

// Logical devices split from one host share one set of turns, one party
// each.
TEST(CpuDeviceTest, LogicalDevicesTakeTurnsAsDevicesOfTheirOwn) {
  DeviceOptions options;
  options.kind = "cpu";
  options.devices = 2;
  options.threads = 1;
  options.memory_bytes = 64 << 20;
  auto devices = CreateCpuDevices(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 2u);
  auto s0 = (*devices)[0]->CreateStream();
  auto s1 = (*devices)[1]->CreateStream();
  ASSERT_TRUE(s0.ok() && s1.ok());
  auto* c0 = dynamic_cast<CpuStream*>(s0->get());
  auto* c1 = dynamic_cast<CpuStream*>(s1->get());
  ASSERT_NE(c0, nullptr);
  ASSERT_NE(c1, nullptr);
  EXPECT_EQ(c0->turns(), c1->turns());
  EXPECT_NE(c0->turns(), nullptr);
  EXPECT_EQ(c0->party(), 0);
  EXPECT_EQ(c1->party(), 1);
}

}  // namespace
}  // namespace opserver::cpu
