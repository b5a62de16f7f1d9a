#include "server/stream.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "devices/cpu/cpu_device.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/validate.h"

namespace opserver {
namespace {

// Enqueue that must succeed (the stream is unbounded and not cancelled).
void Enq(Stream& stream, Stream::Task task, bool inline_if_idle = false) {
  ASSERT_TRUE(stream.Enqueue(std::move(task), inline_if_idle).ok());
}

TEST(StreamTest, RunsInIssueOrder) {
  Stream stream;
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) {
    Enq(stream, [&order, i] {
      order.push_back(i);
      return absl::OkStatus();
    });
  }
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(StreamTest, FirstErrorIsReportedOnceByTheNextSynchronize) {
  Stream stream;
  std::atomic<int> ran{0};
  Enq(stream, [&] {
    ++ran;
    return absl::InvalidArgumentError("first");
  });
  Enq(stream, [&] {
    ++ran;
    return absl::InternalError("second");
  });
  absl::Status status = stream.SynchronizeAndWait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "first");
  EXPECT_EQ(ran.load(), 2);  // Work after a failure still runs.
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
}

TEST(StreamTest, WhenReachedDoesNotConsumeTheError) {
  Stream stream;
  Enq(stream, [] { return absl::InternalError("boom"); });
  absl::Notification reached;
  stream.WhenReached([&] { reached.Notify(); });
  reached.WaitForNotification();
  EXPECT_EQ(stream.SynchronizeAndWait().message(), "boom");
}

TEST(StreamTest, DifferentStreamsRunConcurrently) {
  // Each stream's task waits for the other's: only concurrent streams finish.
  Stream a, b;
  absl::Notification a_started, b_started;
  Enq(a, [&] {
    a_started.Notify();
    return b_started.WaitForNotificationWithTimeout(absl::Seconds(10))
               ? absl::OkStatus()
               : absl::DeadlineExceededError("b never ran");
  });
  Enq(b, [&] {
    b_started.Notify();
    return a_started.WaitForNotificationWithTimeout(absl::Seconds(10))
               ? absl::OkStatus()
               : absl::DeadlineExceededError("a never ran");
  });
  EXPECT_TRUE(a.SynchronizeAndWait().ok());
  EXPECT_TRUE(b.SynchronizeAndWait().ok());
}

TEST(StreamTest, IdleStreamRunsInlineWorkOnTheCaller) {
  Stream stream;
  std::thread::id ran_on;
  Enq(
      stream,
      [&] {
        ran_on = std::this_thread::get_id();
        return absl::InternalError("inline failure");
      },
      /*inline_if_idle=*/true);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  // The inline failure is reported like any other.
  EXPECT_EQ(stream.SynchronizeAndWait().message(), "inline failure");
}

TEST(StreamTest, BusyStreamQueuesInlineWorkBehindEarlierWork) {
  Stream stream;
  absl::Notification release;
  std::vector<int> order;
  Enq(stream, [&] {
    release.WaitForNotification();
    order.push_back(1);
    return absl::OkStatus();
  });
  std::thread::id ran_on;
  Enq(
      stream,
      [&] {
        ran_on = std::this_thread::get_id();
        order.push_back(2);
        return absl::OkStatus();
      },
      /*inline_if_idle=*/true);
  release.Notify();
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

// Destroying a stream (or closing its
// session) must not wait for the work a client queued on it.
TEST(StreamTest, DestructorDropsQueuedWorkAndDoesNotWaitForTheRunningTask) {
  std::atomic<int> ran{0};
  absl::Notification started, release;
  auto buffer = std::make_shared<int>(0);  // Stands for a device buffer.
  auto group = std::make_shared<StreamThreads>();
  auto threads = std::make_shared<StreamThreads>(group);
  {
    Stream stream(/*max_queued=*/0, threads);
    ASSERT_TRUE(stream
                    .Enqueue([&] {
                      started.Notify();
                      release.WaitForNotification();
                      ++ran;
                      return absl::OkStatus();
                    })
                    .ok());
    for (int i = 0; i < 1000; ++i) {
      ASSERT_TRUE(stream
                      .Enqueue([&ran, buffer] {
                        ++ran;
                        return absl::OkStatus();
                      })
                      .ok());
    }
    started.WaitForNotification();
    EXPECT_EQ(stream.queued(), 1000u);
  }  // Returns although the first task still runs.
  // The dropped tasks released what they held.
  EXPECT_EQ(buffer.use_count(), 1);
  // The thread still counts, in its group and the parent group.
  EXPECT_EQ(threads->count(), 1);
  EXPECT_FALSE(group->WaitForZero(absl::Milliseconds(50)));
  release.Notify();
  EXPECT_TRUE(group->WaitForZero(absl::Seconds(30)));
  EXPECT_EQ(threads->count(), 0);
  EXPECT_EQ(ran.load(), 1);
}

// DestroyStream replies from WhenStopped: by then the stream must no longer
// count in its group, or a CreateStream right after the reply can be refused
// at --max_streams_per_session.
TEST(StreamTest, WhenStoppedRunsAfterTheThreadLeftItsGroup) {
  absl::Notification started, release, stopped;
  auto threads = std::make_shared<StreamThreads>();
  int count_when_stopped = -1;
  {
    Stream stream(/*max_queued=*/0, threads);
    Enq(stream, [&] {
      started.Notify();
      release.WaitForNotification();
      return absl::OkStatus();
    });
    stream.WhenStopped([&] {
      count_when_stopped = threads->count();
      stopped.Notify();
    });
    started.WaitForNotification();
  }
  // Destroyed, but its running task holds the thread.
  EXPECT_FALSE(stopped.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  EXPECT_EQ(threads->count(), 1);
  release.Notify();
  ASSERT_TRUE(stopped.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(count_when_stopped, 0);
}

TEST(StreamTest, WhenStoppedWaitsForTheStreamToBeDestroyed) {
  absl::Notification stopped;
  auto stream = std::make_unique<Stream>();
  stream->WhenStopped([&] { stopped.Notify(); });
  // Idle is not stopped: the stream can still take work.
  EXPECT_FALSE(stopped.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  Enq(*stream, [] { return absl::OkStatus(); });
  EXPECT_TRUE(stream->SynchronizeAndWait().ok());
  stream.reset();
  EXPECT_TRUE(stopped.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

TEST(StreamTest, CancelDropsQueuedWorkAndSynchronizeReportsIt) {
  Stream stream;
  absl::Notification release;
  ASSERT_TRUE(stream
                  .Enqueue([&] {
                    release.WaitForNotification();
                    return absl::OkStatus();
                  })
                  .ok());
  std::atomic<int> ran{0};
  ASSERT_TRUE(stream
                  .Enqueue([&] {
                    ++ran;
                    return absl::OkStatus();
                  })
                  .ok());
  absl::Notification synced;
  absl::Status sync_status;
  stream.Synchronize([&](absl::Status status) {
    sync_status = status;
    synced.Notify();
  });
  stream.Cancel();
  absl::Status late = stream.Enqueue([] { return absl::OkStatus(); });
  EXPECT_EQ(late.code(), absl::StatusCode::kCancelled);
  release.Notify();
  synced.WaitForNotification();
  EXPECT_EQ(sync_status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(ran.load(), 0);
  // Reported once.
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
}

// A launch refused by a cancelled stream says why it was cancelled (the
// soak saw "the stream was destroyed" for a launch racing CloseSession),
// on the queued and the inline path; the first reason stays.
TEST(StreamTest, CancelReasonReachesLaterEnqueues) {
  Stream stream;
  stream.Cancel("the stream's session was closed");
  stream.Cancel("the stream was destroyed");
  for (bool inline_if_idle : {false, true}) {
    absl::Status late =
        stream.Enqueue([] { return absl::OkStatus(); }, inline_if_idle);
    EXPECT_EQ(late.code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(late.message(), "the stream's session was closed");
  }
  EXPECT_EQ(Stream().Enqueue([] { return absl::OkStatus(); }).code(),
            absl::StatusCode::kOk);
  Stream destroyed;
  destroyed.Cancel();
  EXPECT_EQ(destroyed.CheckRoom().message(), "the stream was destroyed");
}

// Finding 6: a client cannot grow a stream's queue without bound.
TEST(StreamTest, QueueIsBounded) {
  Stream stream(/*max_queued=*/3);
  absl::Notification release;
  ASSERT_TRUE(stream
                  .Enqueue([&] {
                    release.WaitForNotification();
                    return absl::OkStatus();
                  })
                  .ok());
  // The first task may still be queued or already running.
  while (stream.queued() != 0) absl::SleepFor(absl::Milliseconds(1));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(stream.Enqueue([] { return absl::OkStatus(); }).ok());
  }
  absl::Status full = stream.Enqueue([] { return absl::OkStatus(); });
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()),
              ::testing::HasSubstr("--max_queued_per_stream"));
  release.Notify();
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_TRUE(stream.Enqueue([] { return absl::OkStatus(); }).ok());
}

// Finding 12: work queued after a gate waits until the gate is released,
// not merely until it is reached.
TEST(StreamTest, GateHoldsLaterWorkUntilReleased) {
  Stream stream;
  absl::Notification blocker;
  Enq(stream, [&] {
    blocker.WaitForNotification();
    return absl::OkStatus();
  });
  auto gate = std::make_shared<Stream::Gate>();
  std::atomic<bool> reached{false}, cancelled{false}, after{false};
  ASSERT_TRUE(stream
                  .Hold(
                      gate, [&] { reached = true; }, [&] { cancelled = true; })
                  .ok());
  Enq(stream, [&] {
    after = true;
    return absl::OkStatus();
  });
  EXPECT_FALSE(reached.load());  // Behind the blocker.
  blocker.Notify();
  while (!reached.load()) absl::SleepFor(absl::Milliseconds(1));
  // Reached and held: the later task must not run, however long we wait.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(after.load());
  EXPECT_TRUE(stream.busy());
  gate.reset();
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_TRUE(after.load());
  EXPECT_FALSE(cancelled.load());
}

TEST(StreamTest, IdleStreamIsHeldAtOnceAndAReleasedGateIsSkipped) {
  Stream stream;
  auto first = std::make_shared<Stream::Gate>();
  bool reached_inline = false;
  ASSERT_TRUE(stream
                  .Hold(
                      first, [&] { reached_inline = true; }, [] {})
                  .ok());
  EXPECT_TRUE(reached_inline);
  // Queued behind `first`, then given up before it is reached.
  auto second = std::make_shared<Stream::Gate>();
  std::atomic<bool> second_reached{false};
  ASSERT_TRUE(stream
                  .Hold(
                      second, [&] { second_reached = true; }, [] {})
                  .ok());
  second.reset();
  first.reset();
  // Returns: neither gate holds the stream any more.
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_FALSE(second_reached.load());
}

// Finding 5(c): a stalled transfer's gate never wedges teardown: Cancel
// opens it and tells the transfer, and a cancelled stream refuses gates.
TEST(StreamTest, CancelOpensGatesAndTellsTheirTransfers) {
  Stream stream;
  auto held = std::make_shared<Stream::Gate>();
  auto queued = std::make_shared<Stream::Gate>();
  std::atomic<int> cancelled{0};
  std::atomic<bool> queued_reached{false};
  ASSERT_TRUE(stream
                  .Hold(
                      held, [] {}, [&] { ++cancelled; })
                  .ok());
  ASSERT_TRUE(
      stream
          .Hold(
              queued, [&] { queued_reached = true; }, [&] { ++cancelled; })
          .ok());
  stream.Cancel();
  EXPECT_EQ(cancelled.load(), 2);
  // The stream goes on although both gates are still referenced.
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_FALSE(queued_reached.load());
  auto late = std::make_shared<Stream::Gate>();
  EXPECT_EQ(stream
                .Hold(
                    late, [] {}, [] {})
                .code(),
            absl::StatusCode::kCancelled);
}

TEST(StreamTest, DestroyingAStreamWithAHeldGateDoesNotWait) {
  auto gate = std::make_shared<Stream::Gate>();
  std::atomic<bool> cancelled{false};
  {
    Stream stream;
    ASSERT_TRUE(stream
                    .Hold(
                        gate, [] {}, [&] { cancelled = true; })
                    .ok());
  }
  EXPECT_TRUE(cancelled.load());
  gate.reset();  // After the stream: still fine.
}

TEST(StreamTest, AHostOnlyStreamHasNoDeviceStream) {
  Stream stream;
  EXPECT_EQ(stream.device_stream(), nullptr);
}

// On an asynchronous device a task only queues its work; the stream
// synchronizes the device stream after each task, so whatever the stream
// reports as done (a synchronize, a WhenReached, an inline task's return)
// has really finished on the device.
TEST(StreamTest, TasksAreDoneOnlyOnceTheirDeviceWorkIs) {
  FakeDevice device;
  absl::StatusOr<std::unique_ptr<DeviceStream>> created = device.CreateStream();
  ASSERT_TRUE(created.ok());
  Stream stream(*std::move(created), 0, nullptr);
  std::shared_ptr<DeviceStream> queue = stream.device_stream();
  ASSERT_NE(queue, nullptr);
  const std::shared_ptr<FakeStreamRecord> record = device.streams()[0];

  int source = 7, target = 0, seen = -1;
  Enq(stream, [&] { return queue->CopyToDevice(&target, &source, 4); });
  stream.WhenReached([&] { seen = target; });
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_EQ(seen, 7);
  EXPECT_EQ(record->copies.load(), 1);
  EXPECT_EQ(record->pending.load(), 0);

  // The stream's thread reports idle just after the synchronize.
  while (stream.busy()) absl::SleepFor(absl::Milliseconds(1));
  source = 9;
  Enq(
      stream, [&] { return queue->CopyToDevice(&target, &source, 4); },
      /*inline_if_idle=*/true);
  EXPECT_EQ(target, 9) << "an inline task returns complete";
  EXPECT_EQ(record->pending.load(), 0);
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
}

TEST(StreamTest, ADeviceStreamsErrorIsTheTasksError) {
  FakeDevice device;
  Stream stream(*device.CreateStream(), 0, nullptr);
  device.FailNextSynchronize(absl::InternalError("kernel fault"));
  Enq(stream, [] { return absl::OkStatus(); });
  absl::Status status = stream.SynchronizeAndWait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(status.message(), "kernel fault");
  EXPECT_TRUE(stream.SynchronizeAndWait().ok()) << "reported once";
}

// Cancelling a stream (DestroyStream, CloseSession, the end of shutdown's
// grace) stops the launch it runs now, between pieces of elements, with
// CANCELLED: teardown and SIGTERM need not wait for a launch of billions of
// elements. (Before, the launch ran to its end and reported OK.)
TEST(StreamTest, CancelStopsTheRunningLaunch) {
  cpu::CpuDevice device(/*threads=*/2, /*pool_cache_bytes=*/0);
  absl::StatusOr<std::unique_ptr<DeviceStream>> device_stream =
      device.CreateStream();
  ASSERT_TRUE(device_stream.ok());
  Stream stream(*std::move(device_stream), 0, nullptr);
  // ThresholdBackward in place over 2^28 int8 elements (tens to hundreds of
  // milliseconds), the gradient a broadcast scalar.
  constexpr int64_t kN = int64_t{1} << 28;
  std::vector<int8_t> self(kN, 1);
  int8_t grad = 3;
  kernels::TensorView s;
  s.dtype = kernels::DType::kInt8;
  s.shape = {kN};
  s.data = self.data();
  kernels::TensorView g = s;
  g.shape = {1};
  g.data = &grad;
  kernels::OpCall call;
  call.op = kernels::OpKind::kThresholdBackward;
  call.grad_output = g;
  call.self = s;
  call.out = s;
  call.params.threshold = 0;
  absl::StatusOr<kernels::ValidCall> valid = kernels::Validate(call);
  ASSERT_TRUE(valid.ok()) << valid.status();
  absl::StatusOr<std::unique_ptr<DevicePlan>> plan =
      device.Prepare(*std::move(valid));
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::shared_ptr<DeviceStream> target = stream.device_stream();
  absl::Notification started;
  Enq(stream, [&] {
    started.Notify();
    return target->Launch(**plan, nullptr, 0);
  });
  started.WaitForNotification();
  stream.Cancel("the test cancelled it");
  absl::Status status = stream.SynchronizeAndWait();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_EQ(self[kN - 1], 1) << "the launch ran to its end";
}

}  // namespace
}  // namespace opserver
