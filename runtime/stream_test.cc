#include "runtime/stream.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/task_position.h"
#include "devices/cpu/cpu_device.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/validate.h"

namespace opserver {
namespace {

// `status` without its payloads (a stream's error carries its task's
// position: common/task_position.h).
absl::Status Plain(const absl::Status& status) {
  return absl::Status(status.code(), status.message());
}

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

// Queued work runs behind the calls gRPC's threads answer (the third
// review, finding 7): the stream's thread is niced, the caller's is not.
TEST(StreamTest, QueuedWorkRunsAtALowerPriorityThanTheCaller) {
  Stream stream;
  const int caller = getpriority(PRIO_PROCESS, 0);
  int worker = caller;
  Enq(stream, [&worker] {
    worker = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
    return absl::OkStatus();
  });
  ASSERT_TRUE(stream.SynchronizeAndWait().ok());
  // 10, or the caller's own if already lower (raising it needs privilege).
  EXPECT_GE(worker, 10);
  EXPECT_GE(worker, caller);
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

// The deferred error names the failing task's position on the stream:
// tasks and failures queued each count one.
TEST(StreamTest, TheErrorCarriesTheFailingTasksPosition) {
  Stream stream;
  Enq(stream, [] { return absl::OkStatus(); });
  Enq(stream, [] { return absl::OkStatus(); });
  Enq(stream, [] { return absl::InternalError("third"); });
  Enq(stream, [] { return absl::InternalError("fourth"); });
  absl::Status first = stream.SynchronizeAndWait();
  EXPECT_EQ(first.message(), "third");
  EXPECT_EQ(TaskPositionOf(first), 3u);
  stream.Fail(absl::NotFoundError("refused"));  // Position 5.
  absl::Status refused = stream.SynchronizeAndWait();
  EXPECT_EQ(refused.message(), "refused");
  EXPECT_EQ(TaskPositionOf(refused), 5u);
  // Inline work counts as well.
  Enq(
      stream, [] { return absl::AbortedError("inline"); },
      /*inline_if_idle=*/true);
  EXPECT_EQ(TaskPositionOf(stream.SynchronizeAndWait()), 6u);
}

// On an asynchronous device the error of a batch stands where its first
// task stood.
TEST(StreamTest, AnAsynchronousBatchsErrorIsAtItsFirstTask) {
  FakeDevice device;
  auto made = device.CreateStream();
  ASSERT_TRUE(made.ok());
  Stream stream(*std::move(made), 0, nullptr);
  Enq(stream, [] { return absl::OkStatus(); });
  ASSERT_TRUE(stream.SynchronizeAndWait().ok());
  device.FailNextSynchronize(absl::InternalError("kernel fault"));
  Enq(stream, [] { return absl::OkStatus(); });
  Enq(stream, [] { return absl::OkStatus(); });
  absl::Status status = stream.SynchronizeAndWait();
  EXPECT_EQ(status.message(), "kernel fault");
  EXPECT_EQ(TaskPositionOf(status), 2u);
}

// ACL_STOP_ON_FAILURE: after a failure the stream skips its tasks until
// the error is collected, and says how many; ACL_CONTINUE_ON_FAILURE runs
// them.
TEST(StreamTest, AStoppedStreamSkipsTasksUntilTheErrorIsCollected) {
  for (bool stop : {true, false}) {
    Stream stream;
    stream.SetStopOnFailure(stop);
    int ran = 0;
    Enq(stream, [] { return absl::InternalError("broken"); });
    for (int i = 0; i < 3; ++i) {
      Enq(stream, [&ran] {
        ++ran;
        return absl::OkStatus();
      });
    }
    absl::Status status = stream.SynchronizeAndWait();
    EXPECT_EQ(TaskPositionOf(status), 1u);
    if (stop) {
      EXPECT_EQ(ran, 0);
      EXPECT_EQ(status.message(),
                "broken (the stream stops on failure: 3 later tasks were "
                "skipped)");
    } else {
      EXPECT_EQ(ran, 3);
      EXPECT_EQ(status.message(), "broken");
    }
    // Collected: the stream runs again.
    Enq(stream, [&ran] {
      ++ran;
      return absl::OkStatus();
    });
    EXPECT_TRUE(stream.SynchronizeAndWait().ok());
    EXPECT_EQ(ran, stop ? 1 : 4);
  }
}

TEST(StreamTest, WhenReachedDoesNotConsumeTheError) {
  Stream stream;
  Enq(stream, [] { return absl::InternalError("boom"); });
  absl::Notification reached;
  stream.WhenReached([&] { reached.Notify(); });
  reached.WaitForNotification();
  EXPECT_EQ(stream.SynchronizeAndWait().message(), "boom");
}

// A synchronize whose caller stopped waiting is taken off the queue: it is
// never called, and the error it would have taken stays for the next one.
TEST(StreamTest, AForgottenSynchronizeIsDroppedAndLeavesTheError) {
  Stream stream;
  auto gate = std::make_shared<Stream::Gate>();
  ASSERT_TRUE(stream
                  .Hold(
                      gate, [] {}, nullptr)
                  .ok());
  stream.Fail(absl::InternalError("boom"));
  bool called = false;
  const uint64_t ticket =
      stream.SynchronizeOrForget([&](absl::Status) { called = true; });
  ASSERT_NE(ticket, 0u);
  EXPECT_TRUE(stream.Forget(ticket));
  EXPECT_FALSE(stream.Forget(ticket));
  EXPECT_FALSE(stream.Forget(0));
  gate.reset();
  EXPECT_EQ(Plain(stream.SynchronizeAndWait()), absl::InternalError("boom"));
  EXPECT_FALSE(called);
  // On an idle stream (a new one) it is answered at once, with nothing to
  // forget.
  Stream idle;
  EXPECT_EQ(idle.SynchronizeOrForget([&](absl::Status) { called = true; }), 0u);
  EXPECT_TRUE(called);
}

// WhenReachedOrCancelled says whether the stream got there or was
// cancelled first; FailWith's error is taken when the stream reaches it.
TEST(StreamTest, WhenReachedOrCancelledAndFailWith) {
  Stream stream;
  absl::Status first = absl::UnknownError("not called");
  stream.WhenReachedOrCancelled([&](absl::Status s) { first = s; });
  EXPECT_TRUE(first.ok());  // Idle: at once.
  auto gate = std::make_shared<Stream::Gate>();
  ASSERT_TRUE(stream
                  .Hold(
                      gate, [] {}, nullptr)
                  .ok());
  absl::Status error = absl::OkStatus();
  stream.FailWith([&] { return error; });
  error = absl::DataLossError("known when reached");
  absl::Notification reached;
  absl::Status second;
  stream.WhenReachedOrCancelled([&](absl::Status s) {
    second = s;
    reached.Notify();
  });
  stream.Cancel("the test cancelled it");
  ASSERT_TRUE(reached.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(second, absl::CancelledError("the test cancelled it"));
  EXPECT_EQ(Plain(stream.SynchronizeAndWait()),
            absl::DataLossError("known when reached"));
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

// The first review, finding 6: a client cannot grow a stream's queue
// without bound.
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

// The first review, finding 12: work queued after a gate waits until the
// gate is released, not merely until it is reached.
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

// A transfer that fails while its gate holds the stream makes that its
// stream's deferred error, before the work queued after it: a stopped
// stream skips that work. A gate that no longer holds the stream (released,
// or never reached) records nothing.
TEST(StreamTest, AGateHoldingTheStreamFailsIt) {
  Stream stream;
  stream.SetStopOnFailure(true);
  auto gate = std::make_shared<Stream::Gate>();
  ASSERT_TRUE(stream
                  .Hold(
                      gate, [] {}, [] {})
                  .ok());  // Idle: held at once.
  std::atomic<bool> after{false};
  Enq(stream, [&] {
    after = true;
    return absl::OkStatus();
  });
  gate->Fail(absl::DataLossError("the transfer broke"));
  gate.reset();
  const absl::Status first = stream.SynchronizeAndWait();
  EXPECT_EQ(first.code(), absl::StatusCode::kDataLoss) << first;
  EXPECT_FALSE(after.load());  // Skipped after the failure.

  absl::Notification blocker;
  Enq(stream, [&] {
    blocker.WaitForNotification();
    return absl::OkStatus();
  });
  auto queued = std::make_shared<Stream::Gate>();
  ASSERT_TRUE(stream
                  .Hold(
                      queued, [] {}, [] {})
                  .ok());
  queued->Fail(absl::DataLossError("not reached yet"));
  blocker.Notify();
  queued.reset();
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
}

// The first review, finding 5(c): a stalled transfer's gate never wedges
// teardown: Cancel opens it and tells the transfer, and a cancelled stream
// refuses gates.
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
  // An inline task on an asynchronous device returns issued, not complete
  // (its caller does not wait for the device); the stream's thread
  // completes it without being asked, as nothing else is queued.
  while (stream.busy()) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(target, 9);
  EXPECT_EQ(record->pending.load(), 0);
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
}

// A DeviceStream that does nothing but count its Synchronize calls, either
// kind.
class CountingStream : public DeviceStream {
 public:
  CountingStream(bool asynchronous, std::shared_ptr<std::atomic<int>> count)
      : asynchronous_(asynchronous), count_(std::move(count)) {}
  absl::Status CopyToDevice(void*, const void*, uint64_t) override {
    return absl::OkStatus();
  }
  absl::Status CopyFromDevice(void*, const void*, uint64_t) override {
    return absl::OkStatus();
  }
  absl::Status Memset(void*, int, uint64_t) override {
    return absl::OkStatus();
  }
  absl::Status CopyOnDevice(void*, const void*, uint64_t) override {
    return absl::OkStatus();
  }
  absl::Status Launch(const DevicePlan&, void*, uint64_t) override {
    return absl::OkStatus();
  }
  absl::Status Synchronize() override {
    ++*count_;
    return absl::OkStatus();
  }
  bool asynchronous() const override { return asynchronous_; }

 private:
  const bool asynchronous_;
  const std::shared_ptr<std::atomic<int>> count_;
};

// A CountingStream that says when it is destroyed.
class WatchedStream : public CountingStream {
 public:
  WatchedStream(bool asynchronous, std::shared_ptr<std::atomic<bool>> gone)
      : CountingStream(asynchronous, std::make_shared<std::atomic<int>>(0)),
        gone_(std::move(gone)) {}
  ~WatchedStream() override { *gone_ = true; }

 private:
  const std::shared_ptr<std::atomic<bool>> gone_;
};

// Whoever waits for a group's threads (the session manager, before the
// device goes) must find their device streams destroyed: one the thread
// still held after leaving its group was destroyed late, after the device
// (an Ascend stream outliving its session's teardown). WhenStopped runs
// right after the thread left its group and before its function returns,
// so it sees whether the thread still held the device stream then. A gate
// its transfer has not let go of yet keeps the stream's state, but not its
// device stream.
TEST(StreamTest, TheDeviceStreamIsDestroyedBeforeTheThreadLeavesItsGroup) {
  for (const bool asynchronous : {false, true}) {
    for (const bool gated : {false, true}) {
      SCOPED_TRACE(asynchronous ? "asynchronous" : "synchronous");
      SCOPED_TRACE(gated ? "a gate still held" : "no gate");
      auto gone = std::make_shared<std::atomic<bool>>(false);
      auto threads = std::make_shared<StreamThreads>();
      auto gate = std::make_shared<Stream::Gate>();
      absl::Notification stopped;
      bool gone_when_stopped = false;
      int count_when_stopped = -1;
      {
        Stream stream(std::make_unique<WatchedStream>(asynchronous, gone), 0,
                      threads);
        Enq(stream, [device = stream.device_stream()] {
          return device->Synchronize();
        });
        EXPECT_TRUE(stream.SynchronizeAndWait().ok());
        const std::function<void()> reached = [] {};
        if (gated) {
          ASSERT_TRUE(stream.Hold(gate, reached, nullptr).ok());
        }
        stream.WhenStopped([&] {
          gone_when_stopped = gone->load();
          count_when_stopped = threads->count();
          stopped.Notify();
        });
      }
      ASSERT_TRUE(stopped.WaitForNotificationWithTimeout(absl::Seconds(30)));
      EXPECT_EQ(count_when_stopped, 0);
      EXPECT_TRUE(gone_when_stopped);
      gate.reset();  // After the stream's thread: still fine.
    }
  }
}

// N tasks queued behind a running one, then one Synchronize: how many
// times the stream synchronized its device stream.
int SynchronizesFor(bool asynchronous, int tasks) {
  auto count = std::make_shared<std::atomic<int>>(0);
  Stream stream(std::make_unique<CountingStream>(asynchronous, count), 0,
                nullptr);
  absl::Notification go;
  Enq(stream, [&] {
    go.WaitForNotification();
    return absl::OkStatus();
  });
  for (int i = 0; i < tasks; ++i) {
    Enq(stream, [] { return absl::OkStatus(); });
  }
  go.Notify();
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  return count->load();
}

// The Ascend device through libaclnn_remote.so pays a backend round trip
// per device synchronize: a stream that synchronized after every task cost
// every launch one. Counts, not timings.
TEST(StreamTest, AnAsynchronousDeviceIsNotSynchronizedAfterEveryTask) {
  constexpr int kTasks = 1000;
  const int synchronizes = SynchronizesFor(/*asynchronous=*/true, kTasks);
  EXPECT_GE(synchronizes, 1);
  // One per kMaxUnsynchronizedTasks tasks, and one when the queue ran dry
  // (before the Synchronize callback).
  EXPECT_LE(synchronizes,
            kTasks / static_cast<int>(Stream::kMaxUnsynchronizedTasks) + 2);
  // A synchronous device is synchronized after each task, as before (it
  // costs it nothing, and keeps its tasks' buffers no longer than that).
  EXPECT_EQ(SynchronizesFor(/*asynchronous=*/false, kTasks), kTasks + 1);
}

TEST(StreamTest, PipelinedCopiesOnAnAsynchronousDeviceAllLand) {
  FakeDevice device;
  Stream stream(*device.CreateStream(), 0, nullptr);
  std::shared_ptr<DeviceStream> queue = stream.device_stream();
  const std::shared_ptr<FakeStreamRecord> record = device.streams()[0];
  constexpr int kCopies = 300;
  std::vector<int> target(kCopies, -1);
  absl::Notification go;
  Enq(stream, [&] {
    go.WaitForNotification();
    return absl::OkStatus();
  });
  for (int i = 0; i < kCopies; ++i) {
    // The source lives in the task: the stream must keep it until the
    // device has run the copy (ASan sees a use after free otherwise).
    auto source = std::make_shared<int>(i);
    Enq(stream, [queue, source, at = &target[i]] {
      return queue->CopyToDevice(at, source.get(), sizeof(int));
    });
  }
  go.Notify();
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  for (int i = 0; i < kCopies; ++i) EXPECT_EQ(target[i], i);
  EXPECT_EQ(record->pending.load(), 0);
  EXPECT_LE(record->synchronizes.load(),
            kCopies / static_cast<int>(Stream::kMaxUnsynchronizedTasks) + 2);
}

// An issued task keeps what it captured (buffers, host memory a copy
// reads) until the device stream has been synchronized after it.
TEST(StreamTest, AnIssuedTaskHoldsItsCapturesUntilSynchronized) {
  FakeDevice device;
  Stream stream(*device.CreateStream(), 0, nullptr);
  std::shared_ptr<DeviceStream> queue = stream.device_stream();
  const std::shared_ptr<FakeStreamRecord> record = device.streams()[0];
  absl::Notification go;
  Enq(stream, [&] {
    go.WaitForNotification();
    return absl::OkStatus();
  });
  auto source = std::make_shared<int>(42);
  std::weak_ptr<int> watch = source;
  int target = 0;
  Enq(stream, [queue, source = std::move(source), &target] {
    return queue->CopyToDevice(&target, source.get(), sizeof(int));
  });
  // The next task runs right after it, in the same batch: the copy is
  // issued and not yet run, and its source is still held.
  bool held_while_issued = false;
  int pending_then = -1;
  Enq(stream, [&] {
    held_while_issued = !watch.expired();
    pending_then = record->pending.load();
    return absl::OkStatus();
  });
  go.Notify();
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_TRUE(held_while_issued);
  EXPECT_EQ(pending_then, 1);
  EXPECT_EQ(target, 42);
  EXPECT_TRUE(watch.expired()) << "released once synchronized";
}

// Callbacks, gates and Synchronize observe the device done with everything
// queued before them (events, fences and transfers rely on it).
TEST(StreamTest, CallbacksAndGatesSeeTheDeviceDone) {
  FakeDevice device;
  Stream stream(*device.CreateStream(), 0, nullptr);
  std::shared_ptr<DeviceStream> queue = stream.device_stream();
  const std::shared_ptr<FakeStreamRecord> record = device.streams()[0];
  absl::Notification go;
  Enq(stream, [&] {
    go.WaitForNotification();
    return absl::OkStatus();
  });
  int a = 1, b = 2, target_a = 0, target_b = 0;
  int seen_by_reached = -1, pending_at_reached = -1;
  int seen_by_gate = -1, pending_at_gate = -1;
  Enq(stream, [&] { return queue->CopyToDevice(&target_a, &a, 4); });
  stream.WhenReached([&] {
    seen_by_reached = target_a;
    pending_at_reached = record->pending.load();
  });
  Enq(stream, [&] { return queue->CopyToDevice(&target_b, &b, 4); });
  auto gate = std::make_shared<Stream::Gate>();
  absl::Notification gate_reached;
  ASSERT_TRUE(stream
                  .Hold(
                      gate,
                      [&] {
                        seen_by_gate = target_b;
                        pending_at_gate = record->pending.load();
                        gate_reached.Notify();
                      },
                      nullptr)
                  .ok());
  go.Notify();
  gate_reached.WaitForNotification();
  gate.reset();
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_EQ(seen_by_reached, 1);
  EXPECT_EQ(pending_at_reached, 0);
  EXPECT_EQ(seen_by_gate, 2);
  EXPECT_EQ(pending_at_gate, 0);
}

// An asynchronous failure (the device's synchronize) of a batch is
// reported once, by the next Synchronize, and in issue order with the
// errors recorded around it.
TEST(StreamTest, AnAsynchronousErrorInABatchIsReportedOnceInOrder) {
  FakeDevice device;
  Stream stream(*device.CreateStream(), 0, nullptr);
  std::shared_ptr<DeviceStream> queue = stream.device_stream();
  absl::Notification go;
  Enq(stream, [&] {
    go.WaitForNotification();
    return absl::OkStatus();
  });
  int source = 5;
  std::vector<int> targets(10, 0);
  for (int i = 0; i < 5; ++i) {
    Enq(stream,
        [&, i] { return queue->CopyToDevice(&targets[i], &source, 4); });
  }
  // Task 6 fails to issue: the batch before it is synchronized first, so
  // the device's fault (in tasks 1-5) comes first.
  Enq(stream, [] { return absl::InvalidArgumentError("refused at issue"); });
  for (int i = 5; i < 10; ++i) {
    Enq(stream,
        [&, i] { return queue->CopyToDevice(&targets[i], &source, 4); });
  }
  device.FailNextSynchronize(absl::InternalError("kernel fault"));
  go.Notify();
  absl::Status status = stream.SynchronizeAndWait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_EQ(status.message(), "kernel fault");
  EXPECT_TRUE(stream.SynchronizeAndWait().ok()) << "reported once";
  for (int t : targets) EXPECT_EQ(t, 5) << "later tasks still ran";

  // Fail() after issued tasks: their device error is earlier.
  Enq(stream, [&] { return queue->CopyToDevice(&targets[0], &source, 4); });
  stream.Fail(absl::InvalidArgumentError("refused launch"));
  device.FailNextSynchronize(absl::InternalError("second fault"));
  status = stream.SynchronizeAndWait();
  // The copy may have been completed before FailNextSynchronize (the
  // stream goes idle at once): then Fail's error is the first.
  EXPECT_FALSE(status.ok());
  if (status.code() == absl::StatusCode::kInternal) {
    EXPECT_EQ(status.message(), "second fault");
  } else {
    EXPECT_EQ(status.message(), "refused launch");
  }
  EXPECT_TRUE(stream.SynchronizeAndWait().ok()) << "reported once";
}

// Cancel drops what has not run, but tasks already issued on the device
// are completed (synchronized, then released), not dropped; so is a
// destroyed stream's backlog, by its thread, before it stops.
TEST(StreamTest, CancelAndDestroyCompleteTheIssuedBacklog) {
  for (const bool destroy : {false, true}) {
    SCOPED_TRACE(destroy ? "destroyed" : "cancelled");
    FakeDevice device;
    auto stream = std::make_unique<Stream>(*device.CreateStream(), 0, nullptr);
    std::shared_ptr<DeviceStream> queue = stream->device_stream();
    const std::shared_ptr<FakeStreamRecord> record = device.streams()[0];
    absl::Notification start, running, go, stopped;
    stream->WhenStopped([&] { stopped.Notify(); });
    // Everything is queued before the thread runs any of it, so the first
    // copy is still issued (not synchronized) when the second task blocks.
    Enq(*stream, [&] {
      start.WaitForNotification();
      return absl::OkStatus();
    });
    auto issued_source = std::make_shared<int>(7);
    std::weak_ptr<int> issued_watch = issued_source;
    int issued_target = 0;
    Enq(*stream, [queue, source = std::move(issued_source), &issued_target] {
      return queue->CopyToDevice(&issued_target, source.get(), 4);
    });
    Enq(*stream, [&] {
      running.Notify();
      go.WaitForNotification();
      return absl::OkStatus();
    });
    auto dropped_source = std::make_shared<int>(8);
    std::weak_ptr<int> dropped_watch = dropped_source;
    int dropped_target = 0;
    Enq(*stream, [queue, source = std::move(dropped_source), &dropped_target] {
      return queue->CopyToDevice(&dropped_target, source.get(), 4);
    });
    start.Notify();
    running.WaitForNotification();
    if (destroy) {
      stream.reset();
    } else {
      stream->Cancel("the test cancelled it");
    }
    EXPECT_TRUE(dropped_watch.expired()) << "dropped at once";
    EXPECT_FALSE(issued_watch.expired()) << "issued: held until synchronized";
    EXPECT_EQ(issued_target, 0);
    go.Notify();
    if (destroy) {
      stopped.WaitForNotification();
    } else {
      absl::Status status = stream->SynchronizeAndWait();
      EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
    }
    EXPECT_EQ(issued_target, 7);
    EXPECT_TRUE(issued_watch.expired());
    EXPECT_EQ(dropped_target, 0);
    EXPECT_GE(record->synchronizes.load(), 1);
    queue.reset();
    stream.reset();
    if (!destroy) stopped.WaitForNotification();
  }
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
