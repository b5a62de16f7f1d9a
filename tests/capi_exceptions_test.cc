// Exception information, stream failure modes and operator time-outs
// through the C API, over a device whose streams a test can hold
// (FakeDevice): aclrtSetExceptionInfoCallback and its getters for a
// failure deferred from the server, ACL_STOP_ON_FAILURE against
// ACL_CONTINUE_ON_FAILURE, and aclrtSetOpExecuteTimeOut /
// aclrtSetOpWaitTimeout on a held launch and a held event. The held work
// cannot finish whatever the machine's speed: each time-out is the only way
// out, and no test sleeps to make something happen.

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/capi_held_streams.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

// What the exception callback saw (a C callback has no closure).
struct Seen {
  absl::Mutex mu;
  std::vector<std::vector<uint32_t>> calls;  // task, stream, thread, device,
                                             // code
};
Seen& TheSeen() {
  static Seen* seen = new Seen;
  return *seen;
}
void RecordException(aclrtExceptionInfo* info) {
  Seen& seen = TheSeen();
  absl::MutexLock lock(&seen.mu);
  seen.calls.push_back({aclrtGetTaskIdFromExceptionInfo(info),
                        aclrtGetStreamIdFromExceptionInfo(info),
                        aclrtGetThreadIdFromExceptionInfo(info),
                        aclrtGetDeviceIdFromExceptionInfo(info),
                        aclrtGetErrorCodeFromExceptionInfo(info)});
}
std::vector<std::vector<uint32_t>> TakeSeen() {
  Seen& seen = TheSeen();
  absl::MutexLock lock(&seen.mu);
  std::vector<std::vector<uint32_t>> calls;
  calls.swap(seen.calls);
  return calls;
}

class CApiExceptionsTest : public CApiHeldStreamsTest {
 protected:
  void SetUp() override {
    CApiHeldStreamsTest::SetUp();
    TakeSeen();
  }
  void TearDown() override {
    aclrtSetExceptionInfoCallback(nullptr);
    CApiHeldStreamsTest::TearDown();
  }

  // Three buffers for CopyByLaunch (out = grad).
  struct Buffers {
    void* grad;
    void* self;
    void* out;
  };
  Buffers Make() {
    return {Floats(std::vector<float>(kN, 3)),
            Floats(std::vector<float>(kN, 10)),
            Floats(std::vector<float>(kN, -1))};
  }
  // Waits (bounded) until `record`'s launch is held on the device: the
  // stream is then inside the device's synchronize of it.
  static void UntilHeld(FakeStreamRecord& record) {
    for (int i = 0; i < 60000 && record.WaitingLaunches() == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_EQ(record.WaitingLaunches(), 1);
  }
  static std::vector<float> Read(void* device, size_t count) {
    std::vector<float> host(count, 0);
    EXPECT_EQ(aclrtMemcpy(host.data(), count * 4, device, count * 4,
                          ACL_MEMCPY_DEVICE_TO_HOST),
              ACL_SUCCESS)
        << LastError();
    return host;
  }
};

TEST_F(CApiExceptionsTest, BadArgumentsReturnCannCodes) {
  auto [stream, record] = NewStream();
  struct Case {
    const char* what;
    std::function<aclError()> call;
    aclError code;
    const char* message;  // Part of aclGetRecentErrMsg() when it failed.
  };
  const std::vector<Case> cases = {
      {"unknown mode", [&] { return aclrtSetStreamFailureMode(stream, 2); },
       ACL_ERROR_INVALID_PARAM,
       "aclrtSetStreamFailureMode: unknown mode 2 (ACL_CONTINUE_ON_FAILURE 0 "
       "or ACL_STOP_ON_FAILURE 1)"},
      {"default stream",
       [] { return aclrtSetStreamFailureMode(nullptr, ACL_STOP_ON_FAILURE); },
       ACL_ERROR_INVALID_PARAM,
       "aclrtSetStreamFailureMode: stream is NULL (the default stream's mode "
       "cannot be set)"},
      {"unknown stream",
       [] {
         return aclrtSetStreamFailureMode(reinterpret_cast<aclrtStream>(0x10),
                                          ACL_STOP_ON_FAILURE);
       },
       ACL_ERROR_INVALID_PARAM, "aclrtSetStreamFailureMode: "},
      {"stop", [&] { return aclrtSetStreamFailureMode(stream, 1); },
       ACL_SUCCESS, ""},
      {"continue",
       [&] {
         return aclrtSetStreamFailureMode(stream, ACL_CONTINUE_ON_FAILURE);
       },
       ACL_SUCCESS, ""},
      {"execute time-out over a day",
       [] { return aclrtSetOpExecuteTimeOut(86401); }, ACL_ERROR_INVALID_PARAM,
       "aclrtSetOpExecuteTimeOut: timeout 86401 s is over the most, 86400 s "
       "(0: none)"},
      {"wait time-out over a day", [] { return aclrtSetOpWaitTimeout(86401); },
       ACL_ERROR_INVALID_PARAM,
       "aclrtSetOpWaitTimeout: timeout 86401 s is over the most, 86400 s (0: "
       "none)"},
      {"a day", [] { return aclrtSetOpExecuteTimeOut(86400); }, ACL_SUCCESS,
       ""},
      {"none", [] { return aclrtSetOpExecuteTimeOut(0); }, ACL_SUCCESS, ""},
      {"wait none", [] { return aclrtSetOpWaitTimeout(0); }, ACL_SUCCESS, ""},
      {"stream id to NULL", [&] { return aclrtStreamGetId(stream, nullptr); },
       ACL_ERROR_INVALID_PARAM, "aclrtStreamGetId: streamId is NULL"},
      {"callback NULL", [] { return aclrtSetExceptionInfoCallback(nullptr); },
       ACL_SUCCESS, ""},
  };
  for (const Case& c : cases) {
    aclrtGetLastError(ACL_RT_THREAD_LEVEL);
    EXPECT_EQ(c.call(), c.code) << c.what << ": " << LastError();
    if (c.code != ACL_SUCCESS) {
      EXPECT_THAT(LastError(), HasSubstr(c.message)) << c.what;
      EXPECT_EQ(aclrtGetLastError(ACL_RT_THREAD_LEVEL), c.code) << c.what;
    }
  }
  // The getters of a NULL info.
  using Getter = uint32_t (*)(const aclrtExceptionInfo*);
  const std::vector<std::pair<Getter, std::string>> getters = {
      {aclrtGetTaskIdFromExceptionInfo, "aclrtGetTaskIdFromExceptionInfo"},
      {aclrtGetStreamIdFromExceptionInfo, "aclrtGetStreamIdFromExceptionInfo"},
      {aclrtGetThreadIdFromExceptionInfo, "aclrtGetThreadIdFromExceptionInfo"},
      {aclrtGetDeviceIdFromExceptionInfo, "aclrtGetDeviceIdFromExceptionInfo"},
      {aclrtGetErrorCodeFromExceptionInfo,
       "aclrtGetErrorCodeFromExceptionInfo"},
  };
  for (const auto& [get, name] : getters) {
    EXPECT_EQ(get(nullptr), 0xFFFFFFFFu) << name;
    EXPECT_EQ(LastError(), name + ": info is NULL");
    EXPECT_EQ(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM);
  }
  ASSERT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
}

// A launch that fails on the device (an asynchronous fault): the callback
// is called once, by the synchronize that collects it, naming the device,
// the stream, the launch's position on it and the code returned.
TEST_F(CApiExceptionsTest, TheCallbackNamesTheFailedTaskOnce) {
  ASSERT_EQ(aclrtSetExceptionInfoCallback(&RecordException), ACL_SUCCESS);
  auto [stream, record] = NewStream();
  auto [other, other_record] = NewStream();
  int32_t id = -1, other_id = -1;
  ASSERT_EQ(aclrtStreamGetId(stream, &id), ACL_SUCCESS);
  ASSERT_EQ(aclrtStreamGetId(other, &other_id), ACL_SUCCESS);
  EXPECT_NE(id, other_id);
  const Buffers b = Make();
  CopyByLaunch(b.grad, b.self, b.out, stream);  // Task 1.
  CopyByLaunch(b.grad, b.self, b.out, stream);  // Task 2.
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  EXPECT_THAT(TakeSeen(), ::testing::IsEmpty());
  device_->FailNextSynchronize(absl::DataLossError("a kernel fault"));
  CopyByLaunch(b.grad, b.self, b.out, stream);  // Task 3 fails.
  const aclError failed = aclrtSynchronizeStream(stream);
  EXPECT_NE(failed, ACL_SUCCESS);
  EXPECT_THAT(LastError(), HasSubstr("a kernel fault"));
  const std::vector<std::vector<uint32_t>> seen = TakeSeen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0],
            (std::vector<uint32_t>{3, static_cast<uint32_t>(id),
                                   static_cast<uint32_t>(syscall(SYS_gettid)),
                                   0, static_cast<uint32_t>(failed)}));
  // Collected: reported once.
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS) << LastError();
  EXPECT_THAT(TakeSeen(), ::testing::IsEmpty());
  // A read queued behind a failure collects it, on another stream too.
  device_->FailNextSynchronize(absl::DataLossError("another fault"));
  CopyByLaunch(b.grad, b.self, b.out, other);  // Its task 1.
  std::vector<float> host(kN, 0);
  ASSERT_EQ(aclrtMemcpyAsync(host.data(), kN * 4, b.out, kN * 4,
                             ACL_MEMCPY_DEVICE_TO_HOST, other),
            ACL_SUCCESS);
  EXPECT_NE(aclrtSynchronizeStream(other), ACL_SUCCESS);
  const std::vector<std::vector<uint32_t>> read = TakeSeen();
  ASSERT_EQ(read.size(), 1u);
  EXPECT_EQ(read[0][0], 1u);
  EXPECT_EQ(read[0][1], static_cast<uint32_t>(other_id));
  for (void* p : {b.grad, b.self, b.out}) aclrtFree(p);
}

// ACL_STOP_ON_FAILURE skips the stream's later tasks until the error is
// collected, and the synchronize says so; ACL_CONTINUE_ON_FAILURE runs
// them.
TEST_F(CApiExceptionsTest, AStoppedStreamSkipsItsLaterTasks) {
  for (const uint64_t mode : {ACL_STOP_ON_FAILURE, ACL_CONTINUE_ON_FAILURE}) {
    SCOPED_TRACE(mode);
    auto [stream, record] = NewStream();
    ASSERT_EQ(aclrtSetStreamFailureMode(stream, mode), ACL_SUCCESS);
    const Buffers b = Make();
    void* target = Floats(std::vector<float>(16, 1));
    // The launch is held inside the device's synchronize, so the memset
    // queued next cannot be issued with it: it starts after the failure.
    record->HoldLaunches();
    CopyByLaunch(b.grad, b.self, b.out, stream);
    UntilHeld(*record);
    ASSERT_EQ(aclrtMemsetAsync(target, 64, 0, 64, stream), ACL_SUCCESS);
    device_->FailNextSynchronize(absl::DataLossError("a kernel fault"));
    record->ReleaseLaunches();
    EXPECT_NE(aclrtSynchronizeStream(stream), ACL_SUCCESS);
    if (mode == ACL_STOP_ON_FAILURE) {
      EXPECT_THAT(LastError(),
                  HasSubstr("a kernel fault (the stream stops on failure: 1 "
                            "later task was skipped)"));
      EXPECT_EQ(Read(target, 16), std::vector<float>(16, 1));
    } else {
      EXPECT_THAT(LastError(), HasSubstr("a kernel fault"));
      EXPECT_THAT(LastError(), ::testing::Not(HasSubstr("skipped")));
      EXPECT_EQ(Read(target, 16), std::vector<float>(16, 0));
    }
    // Collected: the stream runs its tasks again.
    ASSERT_EQ(aclrtMemsetAsync(target, 64, 0, 64, stream), ACL_SUCCESS);
    ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
    EXPECT_EQ(Read(target, 16), std::vector<float>(16, 0));
    for (void* p : {b.grad, b.self, b.out, target}) aclrtFree(p);
    ASSERT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
  }
}

// A launch held on the device past the operator execute time-out is
// stopped there and reported as ACL_ERROR_RT_TASK_TIMEOUT; the stream
// stays usable.
TEST_F(CApiExceptionsTest, TheExecuteTimeOutStopsAHeldLaunch) {
  ASSERT_EQ(aclrtSetExceptionInfoCallback(&RecordException), ACL_SUCCESS);
  auto [stream, record] = NewStream();
  ASSERT_EQ(aclrtSetOpExecuteTimeOut(1), ACL_SUCCESS) << LastError();
  const Buffers b = Make();
  record->HoldLaunches();  // Never released: only the time-out ends it.
  CopyByLaunch(b.grad, b.self, b.out, stream);
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_ERROR_RT_TASK_TIMEOUT);
  EXPECT_THAT(LastError(),
              HasSubstr("the task ran past the operator execute time-out of "
                        "1s (aclrtSetOpExecuteTimeOut) and was stopped"));
  const std::vector<std::vector<uint32_t>> seen = TakeSeen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0][0], 1u);
  EXPECT_EQ(seen[0][4], static_cast<uint32_t>(ACL_ERROR_RT_TASK_TIMEOUT));
  // Without the time-out, the same stream runs a launch to the end.
  ASSERT_EQ(aclrtSetOpExecuteTimeOut(0), ACL_SUCCESS);
  record->ReleaseLaunches();
  CopyByLaunch(b.grad, b.self, b.out, stream);
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  EXPECT_EQ(Read(b.out, kN), std::vector<float>(kN, 3));
  for (void* p : {b.grad, b.self, b.out}) aclrtFree(p);
}

// A stream waiting on an event whose record is held goes on past the
// operator wait time-out and reports ACL_ERROR_RT_WAIT_TIMEOUT (its
// synchronize returns while the other stream is still held); its later
// work ran.
TEST_F(CApiExceptionsTest, TheWaitTimeOutLetsAWaitingStreamGoOn) {
  auto [held, record] = NewStream();
  auto [waiter, waiter_record] = NewStream();
  ASSERT_EQ(aclrtSetOpWaitTimeout(1), ACL_SUCCESS) << LastError();
  const Buffers b = Make();
  void* target = Floats(std::vector<float>(16, 1));
  record->HoldLaunches();
  CopyByLaunch(b.grad, b.self, b.out, held);
  aclrtEvent event = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&event), ACL_SUCCESS);
  ASSERT_EQ(aclrtRecordEvent(event, held), ACL_SUCCESS);
  ASSERT_EQ(aclrtStreamWaitEvent(waiter, event), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemsetAsync(target, 64, 0, 64, waiter), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(waiter), ACL_ERROR_RT_WAIT_TIMEOUT);
  EXPECT_THAT(LastError(),
              HasSubstr("the stream waited on an event longer than the "
                        "operator wait time-out of 1s (aclrtSetOpWaitTimeout) "
                        "and went on without it"));
  // The held stream still finishes, and its event completes (a
  // synchronous copy waits for every stream: it comes after).
  record->ReleaseLaunches();
  ASSERT_EQ(aclrtSynchronizeStream(held), ACL_SUCCESS) << LastError();
  EXPECT_EQ(Read(target, 16), std::vector<float>(16, 0));
  ASSERT_EQ(aclrtSynchronizeEvent(event), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtSetOpWaitTimeout(0), ACL_SUCCESS);
  ASSERT_EQ(aclrtDestroyEvent(event), ACL_SUCCESS);
  for (void* p : {b.grad, b.self, b.out, target}) aclrtFree(p);
}

}  // namespace
}  // namespace opserver
