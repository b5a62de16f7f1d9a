#include "runtime/session.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/validate.h"
#include "runtime/session_test_util.h"

namespace opserver {
namespace {

// A session without device memory (its executors plan over host floats).
class SessionLaunchTest : public ::testing::Test {
 protected:
  void SetUp() override { MakeSession(SessionLimits()); }

  void MakeSession(const SessionLimits& limits) {
    limits_ = limits;
    session_ =
        std::make_unique<Session>("s", 1, "session_test", nullptr, &limits_,
                                  &account_, threads_.get());
  }

  // A ThresholdBackward executor over four host floats.
  uint64_t AddExecutor() {
    kernels::TensorView view;
    view.dtype = kernels::DType::kFloat;
    view.shape = {4};
    view.data = data_;
    kernels::OpCall call;
    call.op = kernels::OpKind::kThresholdBackward;
    call.grad_output = view;
    call.self = view;
    call.out = view;
    // The session has no device: its launches run the test's own tasks.
    absl::StatusOr<kernels::ValidCall> valid = kernels::Validate(call);
    EXPECT_TRUE(valid.ok()) << valid.status();
    absl::StatusOr<uint64_t> handle =
        session_->AddExecutor(std::make_shared<Executor>(Executor{
            std::make_unique<DevicePlan>(nullptr, *std::move(valid)), {}}));
    EXPECT_TRUE(handle.ok()) << handle.status();
    return *handle;
  }

  std::shared_ptr<Stream> GetStream(uint64_t handle) {
    absl::StatusOr<std::shared_ptr<Stream>> stream =
        session_->GetStream(handle);
    EXPECT_TRUE(stream.ok()) << stream.status();
    return *stream;
  }

  // Launches `executor`, running `meanwhile` after the executor was taken
  // and before the stream is asked to queue it: what another call can do to
  // the stream in that moment.
  absl::Status Launch(
      uint64_t executor, Stream& stream,
      const std::function<void()>& meanwhile = [] {}) {
    return session_->Launch(executor, stream, /*inline_if_idle=*/false,
                            [&](std::shared_ptr<Executor>) {
                              meanwhile();
                              return Stream::Task([this] {
                                ++ran_;
                                return absl::OkStatus();
                              });
                            });
  }

  uint64_t Executors() { return session_->Stats().executors; }

  float data_[4] = {1, 2, 3, 4};
  SessionLimits limits_;
  MemoryAccounting account_;
  std::atomic<int> ran_{0};
  JoinedStreamThreads threads_;
  std::unique_ptr<Session> session_;
};

TEST_F(SessionLaunchTest, LaunchConsumesASingleUseExecutor) {
  const uint64_t executor = AddExecutor();
  std::shared_ptr<Stream> stream = GetStream(0);
  EXPECT_TRUE(Launch(executor, *stream).ok());
  EXPECT_TRUE(stream->SynchronizeAndWait().ok());
  EXPECT_EQ(ran_.load(), 1);
  EXPECT_EQ(Executors(), 0u);
  absl::Status again = Launch(executor, *stream);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
}

// Found by the soak (bench/soak.cc): a stream destroyed by another call
// after the launch's room check but before its enqueue refused the launch
// after the single-use executor was taken, and the executor was lost.
TEST_F(SessionLaunchTest, StreamDestroyedMidLaunchLeavesTheExecutor) {
  const uint64_t executor = AddExecutor();
  absl::StatusOr<uint64_t> handle = session_->CreateStream();
  ASSERT_TRUE(handle.ok());
  std::shared_ptr<Stream> doomed = GetStream(*handle);
  absl::Status refused = Launch(executor, *doomed, [&] { doomed->Cancel(); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kCancelled) << refused;
  EXPECT_EQ(refused.message(), "the stream was destroyed");
  EXPECT_EQ(ran_.load(), 0);
  EXPECT_EQ(Executors(), 1u);
  // Still single-use, and still there to launch.
  std::shared_ptr<Stream> stream = GetStream(0);
  EXPECT_TRUE(Launch(executor, *stream).ok());
  EXPECT_TRUE(stream->SynchronizeAndWait().ok());
  EXPECT_EQ(ran_.load(), 1);
  EXPECT_EQ(Executors(), 0u);
}

// The same when the session is closed in that moment; the refusal says so.
TEST_F(SessionLaunchTest, SessionClosedMidLaunchLeavesTheExecutor) {
  const uint64_t executor = AddExecutor();
  std::shared_ptr<Stream> stream = GetStream(0);
  absl::Status refused =
      Launch(executor, *stream, [&] { session_->CancelWork(); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kCancelled) << refused;
  EXPECT_EQ(refused.message(), "the stream's session was closed");
  EXPECT_EQ(Executors(), 1u);
  EXPECT_TRUE(session_->DestroyExecutor(executor).ok());
}

// And when another launch takes the stream's last free slot.
TEST_F(SessionLaunchTest, StreamFilledMidLaunchLeavesTheExecutor) {
  SessionLimits limits;
  limits.max_queued_per_stream = 1;
  MakeSession(limits);
  const uint64_t executor = AddExecutor();
  std::shared_ptr<Stream> stream = GetStream(0);
  absl::Notification release;
  ASSERT_TRUE(stream
                  ->Enqueue([&] {
                    release.WaitForNotification();
                    return absl::OkStatus();
                  })
                  .ok());
  while (stream->queued() != 0) absl::SleepFor(absl::Milliseconds(1));
  absl::Status refused = Launch(executor, *stream, [&] {
    ASSERT_TRUE(stream->Enqueue([] { return absl::OkStatus(); }).ok());
  });
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(Executors(), 1u);
  release.Notify();
  EXPECT_TRUE(stream->SynchronizeAndWait().ok());
  EXPECT_TRUE(Launch(executor, *stream).ok());
  EXPECT_TRUE(stream->SynchronizeAndWait().ok());
  EXPECT_EQ(ran_.load(), 1);
  EXPECT_EQ(Executors(), 0u);
}

// A refused repeatable executor stays repeatable (it is never taken).
TEST_F(SessionLaunchTest, RefusedRepeatableExecutorStaysRepeatable) {
  const uint64_t executor = AddExecutor();
  ASSERT_TRUE(session_->SetExecutorRepeatable(executor).ok());
  absl::StatusOr<uint64_t> handle = session_->CreateStream();
  ASSERT_TRUE(handle.ok());
  std::shared_ptr<Stream> doomed = GetStream(*handle);
  EXPECT_FALSE(Launch(executor, *doomed, [&] { doomed->Cancel(); }).ok());
  std::shared_ptr<Stream> stream = GetStream(0);
  EXPECT_TRUE(Launch(executor, *stream).ok());
  EXPECT_TRUE(Launch(executor, *stream).ok());
  EXPECT_TRUE(stream->SynchronizeAndWait().ok());
  EXPECT_EQ(ran_.load(), 2);
  EXPECT_EQ(Executors(), 1u);
}

// A device whose Allocate blocks until released: a Malloc that takes long.
class SlowAllocationDevice : public Device {
 public:
  DeviceDescription Describe() const override { return {}; }
  absl::StatusOr<void*> Allocate(uint64_t bytes, uint64_t) override {
    entered_.Notify();
    release_.WaitForNotification();
    return static_cast<void*>(block_);
  }
  void Deallocate(void*, uint64_t) override {}
  uint64_t FreeBytes() const override { return sizeof(block_); }
  absl::StatusOr<std::unique_ptr<DeviceStream>> CreateStream() override {
    return absl::UnimplementedError("no streams");
  }

  absl::Notification entered_;
  absl::Notification release_;
  char block_[64] = {};
};

// A session is in use while a Malloc allocates (populating or clearing a
// large block can outlast a short idle timeout: hardening_test's
// BusySessionsAreNotIdle saw its session reaped during a 256 MiB Malloc), and
// counts as used when the allocation ends.
TEST_F(SessionLaunchTest, SessionIsBusyWhileMallocAllocates) {
  SlowAllocationDevice device;
  JoinedStreamThreads threads;
  Session session("slow", 2, "session_test", &device, &limits_, &account_,
                  threads.get());
  EXPECT_FALSE(session.Busy());
  std::thread malloc([&] { EXPECT_TRUE(session.Malloc(64).ok()); });
  device.entered_.WaitForNotification();
  EXPECT_TRUE(session.Busy());
  const absl::Time before_end = absl::Now();
  device.release_.Notify();
  malloc.join();
  EXPECT_FALSE(session.Busy());
  EXPECT_GE(session.last_used(), before_end);
}

// Every stream's device stream comes from the device: a new kind of device
// needs no change here.
TEST(SessionDeviceTest, StreamsComeFromTheDevice) {
  FakeDevice device;
  SessionLimits limits;
  MemoryAccounting account;
  JoinedStreamThreads threads;
  Session session("d", 3, "session_test", &device, &limits, &account,
                  threads.get());
  EXPECT_EQ(device.streams().size(), 1u) << "the default stream's";
  absl::StatusOr<uint64_t> handle = session.CreateStream();
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(device.streams().size(), 2u);
  std::shared_ptr<Stream> created = *session.GetStream(*handle);
  std::shared_ptr<Stream> default_stream = *session.GetStream(0);
  ASSERT_NE(created->device_stream(), nullptr);
  ASSERT_NE(default_stream->device_stream(), nullptr);
  EXPECT_NE(created->device_stream(), default_stream->device_stream());
}

TEST(SessionDeviceTest, CreateStreamFailsWithTheDevicesError) {
  FakeDevice device(/*max_streams=*/1);
  SessionLimits limits;
  MemoryAccounting account;
  JoinedStreamThreads threads;
  Session session("d", 3, "session_test", &device, &limits, &account,
                  threads.get());
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<uint64_t> handle = session.CreateStream();
    EXPECT_EQ(handle.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(handle.status().message().find("fake device"),
              absl::string_view::npos)
        << handle.status();
  }
  EXPECT_EQ(session.Stats().streams, 0u);
  EXPECT_TRUE((*session.GetStream(0))->SynchronizeAndWait().ok());
}

// Events are handles: unique across kinds, counted, never reused; a
// client's event ids share the executors' rule and counter.
TEST_F(SessionLaunchTest, EventsAreHandlesAndShareClientIds) {
  SessionLimits limits;
  limits.max_handles_per_session = 3;
  MakeSession(limits);
  const uint64_t base = kClientExecutorBase;
  absl::StatusOr<uint64_t> event = session_->CreateEvent(0);
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_TRUE(session_->GetEvent(*event).ok());
  EXPECT_EQ(session_->CreateEvent(0x4).status().code(),
            absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(session_->CreateEventAs(base + 10, kEventSync).ok());
  // The same id, a lower one, or one below 2^62: refused, for either kind.
  EXPECT_EQ(session_->CreateEventAs(base + 10, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session_->CreateEventAs(base + 9, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session_->CreateEventAs(7, 0).code(),
            absl::StatusCode::kInvalidArgument);
  // A plan under an id an event took is refused; a later id is fine.
  auto executor = [&] {
    kernels::TensorView view;
    view.dtype = kernels::DType::kFloat;
    view.shape = {4};
    view.data = data_;
    kernels::OpCall call;
    call.op = kernels::OpKind::kThresholdBackward;
    call.grad_output = view;
    call.self = view;
    call.out = view;
    absl::StatusOr<kernels::ValidCall> valid = kernels::Validate(call);
    EXPECT_TRUE(valid.ok());
    return std::make_shared<Executor>(
        Executor{std::make_unique<DevicePlan>(nullptr, *std::move(valid)), {}});
  };
  EXPECT_EQ(session_->AddExecutorAs(base + 10, executor()).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(session_->AddExecutorAs(base + 11, executor()).ok());
  EXPECT_EQ(session_->CreateEventAs(base + 11, 0).code(),
            absl::StatusCode::kInvalidArgument);

  // Three handles: the limit.
  EXPECT_EQ(session_->CreateEvent(0).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(session_->CreateEventAs(base + 12, 0).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(session_->DestroyEvent(*event).ok());
  EXPECT_EQ(session_->GetEvent(*event).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->DestroyEvent(*event).code(), absl::StatusCode::kNotFound);
  // A new server-chosen handle is never the destroyed one.
  absl::StatusOr<uint64_t> next = session_->CreateEvent(0);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_NE(*next, *event);
}

// The third review, findings 4 and 10: Attach calls and pending
// synchronizes are bounded per session, counted in its stats, and a slot
// given back is free again.
TEST_F(SessionLaunchTest, AttachAndSynchronizeSlotsAreBoundedAndGivenBack) {
  SessionLimits limits;
  limits.max_attach_per_session = 2;
  limits.max_pending_synchronizes_per_session = 1;
  MakeSession(limits);
  EXPECT_FALSE(session_->attached());
  absl::StatusOr<SessionSlot> first = session_->TakeAttachSlot();
  absl::StatusOr<SessionSlot> second = session_->TakeAttachSlot();
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_TRUE(session_->attached());
  absl::StatusOr<SessionSlot> third = session_->TakeAttachSlot();
  EXPECT_EQ(third.status(),
            absl::ResourceExhaustedError(
                "the session has 2 Attach calls open, the limit "
                "(--max_attach_per_session)"));
  EXPECT_EQ(session_->Stats().attach_streams, 2u);
  *first = SessionSlot();  // The call ended.
  EXPECT_EQ(session_->Stats().attach_streams, 1u);
  EXPECT_TRUE(session_->TakeAttachSlot().ok());  // Taken and given back.
  second = SessionSlot();
  EXPECT_FALSE(session_->attached());

  absl::StatusOr<SessionSlot> sync = session_->TakeSynchronizeSlot();
  ASSERT_TRUE(sync.ok());
  EXPECT_EQ(session_->Stats().pending_synchronizes, 1u);
  EXPECT_EQ(session_->TakeSynchronizeSlot().status(),
            absl::ResourceExhaustedError(
                "the session has 1 synchronizes pending, the limit "
                "(--max_pending_synchronizes_per_session); wait for them to "
                "be answered before sending more"));
  sync = absl::CancelledError("answered");
  EXPECT_EQ(session_->Stats().pending_synchronizes, 0u);
  EXPECT_TRUE(session_->TakeSynchronizeSlot().ok());
}

// SynchronizeStream and LaunchCallback take their stream and a synchronize
// slot in one call: an unknown stream takes no slot, a full session is
// refused, and the slot is given back with the call.
TEST_F(SessionLaunchTest, TakeStreamSynchronizeSlotHoldsTheStreamAndASlot) {
  SessionLimits limits;
  limits.max_pending_synchronizes_per_session = 1;
  MakeSession(limits);
  EXPECT_EQ(session_->TakeStreamSynchronizeSlot(42).status(),
            absl::NotFoundError("no stream 42 in this session (never "
                                "created, freed, or another session's)"));
  EXPECT_EQ(session_->Stats().pending_synchronizes, 0u);

  absl::StatusOr<Session::StreamSlot> held =
      session_->TakeStreamSynchronizeSlot(0);
  ASSERT_TRUE(held.ok()) << held.status();
  absl::StatusOr<std::shared_ptr<Stream>> default_stream =
      session_->GetStream(0);
  ASSERT_TRUE(default_stream.ok());
  EXPECT_EQ(held->stream, *default_stream);
  EXPECT_EQ(session_->Stats().pending_synchronizes, 1u);
  EXPECT_EQ(session_->TakeStreamSynchronizeSlot(0).status().code(),
            absl::StatusCode::kResourceExhausted);

  held = absl::CancelledError("answered");
  EXPECT_EQ(session_->Stats().pending_synchronizes, 0u);
  EXPECT_TRUE(session_->TakeStreamSynchronizeSlot(0).ok());
}

// Each open call's state is charged to the session's memory while it
// holds its slot (kCallStateBytes): past --session_memory_bytes the next
// call is refused, whatever its count limit, and an ended call's bytes
// are free again.
TEST_F(SessionLaunchTest, OpenCallsAreChargedToTheSessionsMemory) {
  SessionLimits limits;
  limits.session_memory_bytes = 2 * kCallStateBytes + 100;
  MakeSession(limits);
  absl::StatusOr<SessionSlot> attach = session_->TakeAttachSlot();
  absl::StatusOr<SessionSlot> sync = session_->TakeSynchronizeSlot();
  ASSERT_TRUE(attach.ok() && sync.ok());
  absl::StatusOr<SessionSlot> refused = session_->TakeSynchronizeSlot();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status().message(),
            absl::StrCat("no room for a pending synchronize's state (",
                         kCallStateBytes, " bytes): the session holds ",
                         2 * kCallStateBytes, " of its ",
                         2 * kCallStateBytes + 100,
                         " bytes (--session_memory_bytes: buffers, open calls "
                         "and pending event operations)"));
  EXPECT_EQ(session_->Stats().pending_synchronizes, 1u) << "refused: not held";
  EXPECT_EQ(session_->TakeAttachSlot().status().code(),
            absl::StatusCode::kResourceExhausted);
  *attach = SessionSlot();  // The Attach call ended.
  EXPECT_TRUE(session_->TakeSynchronizeSlot().ok());
}

// The third review, finding 10: events and what they hold outstanding show
// in the stats.
TEST_F(SessionLaunchTest, EventsAndTheirPendingOperationsAreInTheStats) {
  absl::StatusOr<uint64_t> event = session_->CreateEvent(0);
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(session_->Stats().events, 1u);
  std::shared_ptr<Stream> stream = GetStream(0);
  auto gate = std::make_shared<Stream::Gate>();
  ASSERT_TRUE(stream
                  ->Hold(
                      gate, [] {}, nullptr)
                  .ok());
  ASSERT_TRUE((*session_->GetEvent(*event))->Record(*stream).ok());
  EXPECT_EQ(session_->Stats().pending_event_operations, 1u);
  gate.reset();
  EXPECT_TRUE(stream->SynchronizeAndWait().ok());
  EXPECT_EQ(session_->Stats().pending_event_operations, 0u);
  ASSERT_TRUE(session_->DestroyEvent(*event).ok());
  EXPECT_EQ(session_->Stats().events, 0u);
}

}  // namespace
}  // namespace opserver
