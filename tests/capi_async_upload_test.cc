// aclrtMemcpyAsync between page-locked (aclrtMallocHost) memory and the
// device, large enough for the data path: the call returns once the server
// has ordered the copy on its stream, and the bytes move while the caller
// goes on. Each test holds the stream (FakeDevice), so a copy that waited for
// its bytes would never return: the order is certain, nothing sleeps.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "acl/acl.h"
#include "devices/testing/fake_device.h"
#include "gtest/gtest.h"
#include "testing/metrics_scrape.h"
#include "tests/capi_held_streams.h"

namespace opserver {
namespace {

// Over the client's data-path threshold (4 MiB), a whole number of floats.
constexpr size_t kFloats = (5u << 20) / sizeof(float);
constexpr size_t kBytes = kFloats * sizeof(float);

// A page-locked block of kFloats floats, 1, 2, 3, ...
float* PinnedCounting() {
  void* block = nullptr;
  EXPECT_EQ(aclrtMallocHost(&block, kBytes), ACL_SUCCESS);
  float* values = static_cast<float*>(block);
  for (size_t i = 0; i < kFloats; ++i) values[i] = static_cast<float>(i + 1);
  return values;
}

// The device bytes [dev, dev + kBytes) as floats.
std::vector<float> Read(void* dev) {
  std::vector<float> back(kFloats, -7);
  EXPECT_EQ(aclrtMemcpy(back.data(), kBytes, dev, kBytes,
                        ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_SUCCESS);
  return back;
}

class CApiAsyncUploadTest : public CApiHeldStreamsTest {
 protected:
  // A stream whose launch is held (HoldOne), and behind it the copy of a
  // page-locked block counting 1, 2, 3, ... into new device memory: queued,
  // the stream cannot reach it until the launch is released.
  void QueueBehindAHeldLaunch() {
    std::tie(stream_, record_) = NewStream();
    held_ = HoldOne(stream_, *record_);
    pinned_ = PinnedCounting();
    sent_.assign(pinned_, pinned_ + kFloats);
    ASSERT_EQ(aclrtMalloc(&dev_, kBytes, ACL_MEM_MALLOC_HUGE_FIRST),
              ACL_SUCCESS);
    ASSERT_EQ(aclrtMemcpyAsync(dev_, kBytes, pinned_, kBytes,
                               ACL_MEMCPY_HOST_TO_DEVICE, stream_),
              ACL_SUCCESS)
        << LastError();
  }

  aclrtStream stream_ = nullptr;
  std::shared_ptr<FakeStreamRecord> record_;
  Held held_{};
  float* pinned_ = nullptr;
  std::vector<float> sent_;
  void* dev_ = nullptr;
};

// Returns although the stream cannot reach the copy yet (a copy that
// waited for its bytes would never have returned), and a launch queued
// after it reads what it wrote.
TEST_F(CApiAsyncUploadTest, ReturnsBeforeTheHeldStreamLetsItsBytesIn) {
  QueueBehindAHeldLaunch();
  // y2 = the copy's first kN floats, by a launch after it.
  void* self = Floats(std::vector<float>(kN, 10));
  void* y2 = Floats(std::vector<float>(kN, -1));
  CopyByLaunch(dev_, self, y2, stream_);
  aclrtStreamStatus status = ACL_STREAM_STATUS_COMPLETE;
  ASSERT_EQ(aclrtStreamQuery(stream_, &status), ACL_SUCCESS) << LastError();
  EXPECT_EQ(status, ACL_STREAM_STATUS_NOT_READY);

  record_->ReleaseLaunches();
  ASSERT_EQ(aclrtSynchronizeStream(stream_), ACL_SUCCESS) << LastError();
  ExpectRan(held_);
  EXPECT_EQ(Read(dev_), sent_);
  std::vector<float> y(kN, 0);
  ASSERT_EQ(aclrtMemcpy(y.data(), kN * 4, y2, kN * 4,
                        ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_SUCCESS);
  EXPECT_EQ(y, std::vector<float>(sent_.begin(), sent_.begin() + kN));
  EXPECT_EQ(aclrtFreeHost(pinned_), ACL_SUCCESS);
  for (void* p : {dev_, self, y2}) aclrtFree(p);
  EXPECT_EQ(aclrtDestroyStream(stream_), ACL_SUCCESS);
}

TEST_F(CApiAsyncUploadTest, FreeHostWaitsForTheCopyStillReadingTheBlock) {
  QueueBehindAHeldLaunch();
  // The free cannot return before the release below lets the copy read
  // the block (had it freed it, the copy would read unmapped memory).
  aclError freed = ACL_ERROR_INVALID_PARAM;
  std::thread free_host([&] { freed = aclrtFreeHost(pinned_); });
  record_->ReleaseLaunches();
  free_host.join();
  EXPECT_EQ(freed, ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtSynchronizeStream(stream_), ACL_SUCCESS) << LastError();
  ExpectRan(held_);
  EXPECT_EQ(Read(dev_), sent_);
  aclrtFree(dev_);
  EXPECT_EQ(aclrtDestroyStream(stream_), ACL_SUCCESS);
}

TEST_F(CApiAsyncUploadTest, ResetWaitsForACopyStillQueuedOnItsStream) {
  QueueBehindAHeldLaunch();
  // As CANN's, the reset first lets the device's queued work run: it
  // returns only after the release, with the copy's thread gone, so the
  // block can be freed at once.
  aclError reset = ACL_ERROR_INVALID_PARAM;
  std::thread resetting([&] { reset = aclrtResetDevice(0); });
  record_->ReleaseLaunches();
  resetting.join();
  EXPECT_EQ(reset, ACL_SUCCESS) << LastError();
  EXPECT_EQ(aclrtFreeHost(pinned_), ACL_SUCCESS);
}

// The other way: a large copy into page-locked memory returns before the
// held stream lets its bytes out (the block is untouched), and the block
// holds them once the stream is synchronized; aclrtFreeHost of a block a
// copy still writes waits for it (had it freed the block, the copy would
// write unmapped memory).
TEST_F(CApiAsyncUploadTest, ACopyIntoPageLockedMemoryReturnsBeforeItsBytes) {
  QueueBehindAHeldLaunch();
  record_->ReleaseLaunches();
  ASSERT_EQ(aclrtSynchronizeStream(stream_), ACL_SUCCESS) << LastError();
  ExpectRan(held_);
  // dev_ holds sent_ now; read it back behind a held launch, twice.
  float* back[2] = {nullptr, nullptr};
  for (float*& block : back) {
    ASSERT_EQ(aclrtMallocHost(reinterpret_cast<void**>(&block), kBytes),
              ACL_SUCCESS);
    std::fill(block, block + kFloats, -3.0f);
  }
  for (float* block : back) {
    held_ = HoldOne(stream_, *record_);
    ASSERT_EQ(aclrtMemcpyAsync(block, kBytes, dev_, kBytes,
                               ACL_MEMCPY_DEVICE_TO_HOST, stream_),
              ACL_SUCCESS)
        << LastError();
    EXPECT_EQ(std::count(block, block + kFloats, -3.0f),
              static_cast<std::ptrdiff_t>(kFloats));  // Nothing came yet.
    if (block == back[0]) {
      record_->ReleaseLaunches();
      ASSERT_EQ(aclrtSynchronizeStream(stream_), ACL_SUCCESS) << LastError();
      EXPECT_EQ(std::vector<float>(block, block + kFloats), sent_);
      EXPECT_EQ(aclrtFreeHost(block), ACL_SUCCESS);
    } else {
      aclError freed = ACL_ERROR_INVALID_PARAM;
      std::thread free_host([&] { freed = aclrtFreeHost(block); });
      record_->ReleaseLaunches();
      free_host.join();
      EXPECT_EQ(freed, ACL_SUCCESS) << LastError();
      EXPECT_EQ(aclrtSynchronizeStream(stream_), ACL_SUCCESS) << LastError();
    }
    ExpectRan(held_);
  }
  EXPECT_EQ(aclrtFreeHost(pinned_), ACL_SUCCESS);
  aclrtFree(dev_);
  EXPECT_EQ(aclrtDestroyStream(stream_), ACL_SUCCESS);
}

TEST_F(CApiAsyncUploadTest, PageableMemoryIsCopiedBeforeTheCallReturns) {
  auto [stream, record] = NewStream();
  std::vector<float> pageable(kFloats);
  for (size_t i = 0; i < kFloats; ++i) pageable[i] = static_cast<float>(i);
  void* dev = nullptr;
  ASSERT_EQ(aclrtMalloc(&dev, kBytes, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemcpyAsync(dev, kBytes, pageable.data(), kBytes,
                             ACL_MEMCPY_HOST_TO_DEVICE, stream),
            ACL_SUCCESS)
      << LastError();
  // The caller may reuse pageable memory at once, as with CANN.
  const std::vector<float> sent = pageable;
  std::fill(pageable.begin(), pageable.end(), -1.0f);
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  EXPECT_EQ(Read(dev), sent);
  aclrtFree(dev);
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
}

// The server's count of what a synchronize of a stream asks it: unary
// SynchronizeStream calls and Pipeline fences (which carry the pipelined
// synchronize; none here, counted so that one would be seen).
class CApiCleanStreamTest : public CApiHeldStreamsTest {
 protected:
  void Configure(Options& options) override {
    options.metrics_listen = "127.0.0.1:0";
    options.data_drop_accepted = [this] { return drop_data_.load(); };
    options.data_drop_kept = options.data_drop_accepted;
  }
  double SynchronizesAsked() {
    const std::string page = scrape::Metrics(server_->metrics_address());
    EXPECT_FALSE(page.empty());
    return scrape::Sum(page, "grpc_server_call_started_total",
                       "SynchronizeStream\"") +
           scrape::Sum(page, "opserver_pipeline_commands_total",
                       "command=\"fence\"");
  }

  // Set: the server closes every data-path connection unread (a kept one
  // when its next ticket comes).
  std::atomic<bool> drop_data_{false};
};

// A stream a synchronize found idle, with only an async copy of
// page-locked memory since: the next synchronize waits for the copy and
// asks the server nothing (the copy's own call reported its end). One with
// nothing since still asks (it may be checking on the server), and so does
// one after work queued on the stream.
TEST_F(CApiCleanStreamTest, ASynchronizeAfterOnlyACopyAsksTheServerNothing) {
  auto [stream, record] = NewStream();
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  const double asked = SynchronizesAsked();
  ASSERT_GE(asked, 1);

  float* pinned = PinnedCounting();
  const std::vector<float> sent(pinned, pinned + kFloats);
  void* dev = nullptr;
  ASSERT_EQ(aclrtMalloc(&dev, kBytes, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemcpyAsync(dev, kBytes, pinned, kBytes,
                             ACL_MEMCPY_HOST_TO_DEVICE, stream),
            ACL_SUCCESS)
      << LastError();
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  EXPECT_EQ(SynchronizesAsked(), asked);
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  EXPECT_EQ(SynchronizesAsked(), asked + 1);
  EXPECT_EQ(Read(dev), sent);

  ASSERT_EQ(aclrtMemsetAsync(dev, kBytes, 0, kBytes, stream), ACL_SUCCESS)
      << LastError();
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  EXPECT_GT(SynchronizesAsked(), asked);
  EXPECT_EQ(Read(dev), std::vector<float>(kFloats, 0.0f));
  aclrtFree(dev);
  EXPECT_EQ(aclrtFreeHost(pinned), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
}

// A copy that failed (the server closes its data connections, so its
// bytes never move) leaves the stream unknown: the synchronize reports the
// copy's failure and asks the server, which may hold one for the stream.
TEST_F(CApiCleanStreamTest, AfterAFailedCopyTheSynchronizeAsksTheServer) {
  auto [stream, record] = NewStream();
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  const double asked = SynchronizesAsked();
  float* pinned = PinnedCounting();
  void* dev = nullptr;
  ASSERT_EQ(aclrtMalloc(&dev, kBytes, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  drop_data_ = true;
  ASSERT_EQ(aclrtMemcpyAsync(dev, kBytes, pinned, kBytes,
                             ACL_MEMCPY_HOST_TO_DEVICE, stream),
            ACL_SUCCESS)
      << LastError();
  EXPECT_NE(aclrtSynchronizeStream(stream), ACL_SUCCESS);
  drop_data_ = false;
  EXPECT_GT(SynchronizesAsked(), asked);
  aclrtFree(dev);
  EXPECT_EQ(aclrtFreeHost(pinned), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
}

}  // namespace
}  // namespace opserver
