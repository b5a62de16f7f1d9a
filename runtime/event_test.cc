// Event semantics on host-only streams, without the transport: a stream is
// held still by a test gate (Stream::Hold) so records stay pending for as
// long as a test needs, with no timing involved.

#include "runtime/event.h"

#include <atomic>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"
#include "runtime/memory_charge.h"
#include "runtime/stream.h"

namespace opserver {
namespace {

// `status` without its payloads (a stream's error carries its task's
// position: common/task_position.h).
absl::Status Plain(const absl::Status& status) {
  return absl::Status(status.code(), status.message());
}

// Holds `stream` (work queued after it waits) until the returned gate is
// dropped.
std::shared_ptr<Stream::Gate> Block(Stream& stream) {
  auto gate = std::make_shared<Stream::Gate>();
  EXPECT_TRUE(stream
                  .Hold(
                      gate, [] {}, nullptr)
                  .ok());
  return gate;
}


// Each outstanding operation of a session's events is charged to the
// session's memory too (kEventOperationBytes): without room, the next one
// is refused and nothing is taken; a given-back one frees its bytes.
TEST(EventBudgetTest, OperationsAreChargedToTheSessionsMemory) {
  auto bytes = std::make_shared<std::atomic<uint64_t>>(0);
  EventBudget budget(/*limit=*/10, bytes, 2 * kEventOperationBytes);
  ASSERT_TRUE(budget.Take().ok());
  ASSERT_TRUE(budget.Take().ok());
  EXPECT_EQ(bytes->load(), 2 * kEventOperationBytes);
  absl::Status refused = budget.Take();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("no room for an event operation"),
            absl::string_view::npos)
      << refused;
  EXPECT_EQ(budget.held(), 2u);
  budget.Give();
  EXPECT_EQ(bytes->load(), kEventOperationBytes);
  EXPECT_TRUE(budget.Take().ok());
}

TEST(EventTest, FlagsAreCannsAndUnknownBitsAreRefused) {
  EXPECT_TRUE(CheckEventFlags(0).ok());
  EXPECT_TRUE(CheckEventFlags(kEventSync | kEventTimeLine | kEventIpc |
                              kEventExternal | kEventCaptureStreamProgress)
                  .ok());
  EXPECT_EQ(CheckEventFlags(0x4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckEventFlags(0x80000000u).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EventTest, AnUnrecordedEventIsCompleteAndHasNoTimestamp) {
  Event event(0);
  EXPECT_TRUE(event.Complete());
  EXPECT_FALSE(event.Recorded());
  absl::StatusOr<Event::Clock::time_point> time = event.CompletionTime();
  EXPECT_EQ(time.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(kernels::GetAclnnStatus(time.status()),
            kAclErrorRtEventTimestampInvalid);
  bool called = false;
  ASSERT_TRUE(event
                  .WhenComplete([&](absl::Status s) {
                    EXPECT_TRUE(s.ok());
                    called = true;
                  })
                  .ok());
  EXPECT_TRUE(called);

  // Waiting on it holds nothing: the stream runs on.
  Stream b;
  ASSERT_TRUE(event.Wait(b).ok());
  std::atomic<bool> ran{false};
  ASSERT_TRUE(b.Enqueue([&] {
                 ran = true;
                 return absl::OkStatus();
               }).ok());
  EXPECT_TRUE(b.SynchronizeAndWait().ok());
  EXPECT_TRUE(ran);
}

TEST(EventTest, AWaitingStreamRunsOnlyOnceTheRecordCompletes) {
  Stream a, b;
  Event event(0);
  std::shared_ptr<Stream::Gate> blocker = Block(a);
  ASSERT_TRUE(event.Record(a).ok());
  EXPECT_FALSE(event.Complete());
  EXPECT_TRUE(event.Recorded());
  ASSERT_TRUE(event.Wait(b).ok());
  std::atomic<bool> ran{false};
  ASSERT_TRUE(b.Enqueue([&] {
                 ran = true;
                 return absl::OkStatus();
               }).ok());
  // Without the wait, the idle stream b would have run it by now.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(ran);
  EXPECT_EQ(b.queued(), 1u);
  EXPECT_EQ(event.CompletionTime().status().code(),
            absl::StatusCode::kFailedPrecondition);

  absl::Notification synced;
  ASSERT_TRUE(event
                  .WhenComplete([&](absl::Status s) {
                    EXPECT_TRUE(s.ok());
                    synced.Notify();
                  })
                  .ok());
  EXPECT_FALSE(synced.HasBeenNotified());
  blocker.reset();
  EXPECT_TRUE(b.SynchronizeAndWait().ok());
  EXPECT_TRUE(ran);
  // The synchronize is answered on a's thread, maybe after b went on.
  EXPECT_TRUE(a.SynchronizeAndWait().ok());
  EXPECT_TRUE(synced.HasBeenNotified());
  EXPECT_TRUE(event.Complete());
  EXPECT_TRUE(event.CompletionTime().ok());
}

TEST(EventTest, AWaitIssuedBeforeTheRecordDoesNotWaitForIt) {
  Stream a, b;
  Event event(0);
  std::shared_ptr<Stream::Gate> blocker = Block(a);
  ASSERT_TRUE(event.Wait(b).ok());  // Not recorded yet: a no-op.
  ASSERT_TRUE(event.Record(a).ok());
  EXPECT_TRUE(b.SynchronizeAndWait().ok());
  EXPECT_FALSE(event.Complete());
}

TEST(EventTest, CancellingTheWaitingStreamReleasesIt) {
  Stream a, b;
  Event event(0);
  std::shared_ptr<Stream::Gate> blocker = Block(a);
  ASSERT_TRUE(event.Record(a).ok());
  ASSERT_TRUE(event.Wait(b).ok());
  absl::Notification reached;
  b.WhenReached([&] { reached.Notify(); });
  EXPECT_FALSE(reached.HasBeenNotified());
  b.Cancel("test");
  EXPECT_TRUE(reached.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(event.Complete());  // a is still held.
}

TEST(EventTest, CancellingTheRecordingStreamCompletesTheRecord) {
  Stream a, b;
  Event event(0);
  std::shared_ptr<Stream::Gate> blocker = Block(a);
  ASSERT_TRUE(event.Record(a).ok());
  ASSERT_TRUE(event.Wait(b).ok());
  absl::Notification reached;
  b.WhenReached([&] { reached.Notify(); });
  a.Cancel("test");
  EXPECT_TRUE(reached.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(event.Complete());
  // Nothing records on a cancelled stream.
  EXPECT_EQ(event.Record(a).code(), absl::StatusCode::kCancelled);
}

TEST(EventTest, DestroyingTheEventReleasesWaitersAndSynchronizes) {
  Stream a, b;
  auto budget = std::make_shared<EventBudget>(100);
  auto event = std::make_unique<Event>(0, budget);
  std::shared_ptr<Stream::Gate> blocker = Block(a);
  ASSERT_TRUE(event->Record(a).ok());
  ASSERT_TRUE(event->Wait(b).ok());
  absl::Notification reached;
  b.WhenReached([&] { reached.Notify(); });
  absl::Status synced = absl::UnknownError("not called");
  ASSERT_TRUE(
      event->WhenComplete([&](absl::Status s) { synced = std::move(s); }).ok());
  EXPECT_EQ(budget->held(), 3u);  // The record, the wait, the synchronize.
  event.reset();
  EXPECT_TRUE(reached.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(synced.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(budget->held(), 1u);  // The record, still queued on a.
  blocker.reset();
  EXPECT_TRUE(a.SynchronizeAndWait().ok());
  EXPECT_EQ(budget->held(), 0u);
}

// The third review, finding 11: a record whose stream is cancelled before
// reaching it completes (nothing waits forever), but with CANCELLED, not as
// a normal completion, until a new record replaces it.
TEST(EventTest, ARecordCancelledBeforeItsStreamReachedItFails) {
  Stream a, b;
  Event event(0);
  std::shared_ptr<Stream::Gate> blocker = Block(a);
  ASSERT_TRUE(event.Record(a).ok());
  ASSERT_TRUE(event.Wait(b).ok());
  absl::Notification answered;
  absl::Status synced;
  ASSERT_TRUE(event
                  .WhenComplete([&](absl::Status s) {
                    synced = std::move(s);
                    answered.Notify();
                  })
                  .ok());
  a.Cancel("the stream was destroyed");
  const std::string why =
      "the event's record was cancelled before its stream reached it (the "
      "stream was destroyed): the work before it may not have run";
  // The waiting stream goes on, with the cancellation as its error.
  EXPECT_EQ(Plain(b.SynchronizeAndWait()), absl::CancelledError(why));
  EXPECT_TRUE(b.SynchronizeAndWait().ok());  // Reported once.
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(synced, absl::CancelledError(why));
  EXPECT_TRUE(event.Complete());
  EXPECT_TRUE(event.Recorded());
  EXPECT_EQ(event.RecordError(), absl::CancelledError(why));
  absl::StatusOr<Event::Clock::time_point> time = event.CompletionTime();
  EXPECT_EQ(time.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(time.status().message(), why + "; it has no timestamp");
  EXPECT_EQ(kernels::GetAclnnStatus(time.status()),
            kAclErrorRtEventTimestampInvalid);
  Stream c;
  Event done(0);
  ASSERT_TRUE(done.Record(c).ok());
  ASSERT_TRUE(c.SynchronizeAndWait().ok());
  absl::StatusOr<float> ms = Event::ElapsedMs(done, event);
  EXPECT_EQ(ms.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(kernels::GetAclnnStatus(ms.status()),
            kAclErrorRtEventTimestampInvalid);
  // Later synchronizes and waits see it too.
  absl::Status later = absl::UnknownError("not called");
  ASSERT_TRUE(event.WhenComplete([&](absl::Status s) { later = s; }).ok());
  EXPECT_EQ(later, absl::CancelledError(why));
  ASSERT_TRUE(event.Wait(c).ok());
  EXPECT_EQ(Plain(c.SynchronizeAndWait()), absl::CancelledError(why));
  // A new record replaces it.
  ASSERT_TRUE(event.Record(c).ok());
  ASSERT_TRUE(c.SynchronizeAndWait().ok());
  EXPECT_TRUE(event.RecordError().ok());
  EXPECT_TRUE(event.CompletionTime().ok());
}

// The third review, finding 3: a synchronize whose caller stopped waiting
// is dropped at once, with its budget, not when the record completes.
TEST(EventTest, AForgottenSynchronizeIsDroppedAtOnce) {
  Stream a;
  auto budget = std::make_shared<EventBudget>(100);
  Event event(0, budget);
  std::shared_ptr<Stream::Gate> blocker = Block(a);
  ASSERT_TRUE(event.Record(a).ok());
  bool called = false;
  absl::StatusOr<uint64_t> ticket =
      event.WhenCompleteOrForgotten([&](absl::Status) { called = true; });
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ASSERT_NE(*ticket, 0u);
  EXPECT_EQ(budget->held(), 2u);
  EXPECT_TRUE(event.Forget(*ticket));
  EXPECT_EQ(budget->held(), 1u);
  EXPECT_FALSE(event.Forget(*ticket));
  blocker.reset();
  EXPECT_TRUE(a.SynchronizeAndWait().ok());
  EXPECT_FALSE(called);
  EXPECT_EQ(budget->held(), 0u);
  // Complete: answered at once, nothing to forget.
  ticket = event.WhenCompleteOrForgotten([&](absl::Status) { called = true; });
  ASSERT_TRUE(ticket.ok());
  EXPECT_EQ(*ticket, 0u);
  EXPECT_TRUE(called);
}

TEST(EventTest, ResetMakesTheEventUnrecordedInStreamOrder) {
  Stream a;
  Event event(0);
  ASSERT_TRUE(event.Record(a).ok());
  ASSERT_TRUE(a.SynchronizeAndWait().ok());
  EXPECT_TRUE(event.Recorded());
  EXPECT_TRUE(event.CompletionTime().ok());

  std::shared_ptr<Stream::Gate> blocker = Block(a);
  ASSERT_TRUE(event.Reset(a).ok());
  EXPECT_TRUE(event.Recorded());  // Not reached yet.
  blocker.reset();
  ASSERT_TRUE(a.SynchronizeAndWait().ok());
  EXPECT_FALSE(event.Recorded());
  EXPECT_TRUE(event.Complete());
  EXPECT_EQ(kernels::GetAclnnStatus(event.CompletionTime().status()),
            kAclErrorRtEventTimestampInvalid);
}

TEST(EventTest, ARecordIssuedAfterTheResetSurvivesIt) {
  Stream a, b;
  Event event(0);
  std::shared_ptr<Stream::Gate> blocker = Block(a);
  ASSERT_TRUE(event.Reset(a).ok());
  ASSERT_TRUE(event.Record(b).ok());
  ASSERT_TRUE(b.SynchronizeAndWait().ok());
  blocker.reset();
  ASSERT_TRUE(a.SynchronizeAndWait().ok());
  EXPECT_TRUE(event.Recorded());
  EXPECT_TRUE(event.CompletionTime().ok());
}

TEST(EventTest, ReRecordingMakesItIncompleteAgainWithALaterTimestamp) {
  Stream a;
  Event event(0);
  ASSERT_TRUE(event.Record(a).ok());
  ASSERT_TRUE(a.SynchronizeAndWait().ok());
  absl::StatusOr<Event::Clock::time_point> first = event.CompletionTime();
  ASSERT_TRUE(first.ok());

  std::shared_ptr<Stream::Gate> blocker = Block(a);
  ASSERT_TRUE(event.Record(a).ok());
  EXPECT_FALSE(event.Complete());
  EXPECT_FALSE(event.CompletionTime().ok());
  blocker.reset();
  ASSERT_TRUE(a.SynchronizeAndWait().ok());
  absl::StatusOr<Event::Clock::time_point> second = event.CompletionTime();
  ASSERT_TRUE(second.ok());
  EXPECT_GE(*second, *first);
}

TEST(EventTest, ElapsedTimeIsBetweenCompletionsAndNeedsBoth) {
  Stream a;
  Event start(0), end(0), never(0);
  ASSERT_TRUE(start.Record(a).ok());
  ASSERT_TRUE(a.Enqueue([] {
                 absl::SleepFor(absl::Milliseconds(5));
                 return absl::OkStatus();
               }).ok());
  ASSERT_TRUE(end.Record(a).ok());
  ASSERT_TRUE(a.SynchronizeAndWait().ok());
  absl::StatusOr<float> ms = Event::ElapsedMs(start, end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GT(*ms, 0);
  absl::StatusOr<float> back = Event::ElapsedMs(end, start);
  ASSERT_TRUE(back.ok());
  EXPECT_LT(*back, 0);

  absl::StatusOr<float> bad = Event::ElapsedMs(start, never);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(kernels::GetAclnnStatus(bad.status()),
            kAclErrorRtEventTimestampInvalid);
}

TEST(EventTest, TheBudgetBoundsWhatIsOutstanding) {
  Stream a, b;
  auto budget = std::make_shared<EventBudget>(2);
  Event event(0, budget);
  std::shared_ptr<Stream::Gate> blocker = Block(a);
  ASSERT_TRUE(event.Record(a).ok());
  ASSERT_TRUE(event.Wait(b).ok());
  EXPECT_EQ(event.Record(a).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(event.Wait(b).code(), absl::StatusCode::kResourceExhausted);
  blocker.reset();
  ASSERT_TRUE(a.SynchronizeAndWait().ok());
  ASSERT_TRUE(b.SynchronizeAndWait().ok());
  EXPECT_EQ(budget->held(), 0u);
  EXPECT_TRUE(event.Record(a).ok());
}

}  // namespace
}  // namespace opserver
