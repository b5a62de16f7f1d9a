// DeviceStream's default staged upload (devices/device.cc), on a device the
// host cannot address whose copies run only at Synchronize.
#include "devices/device.h"

#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "devices/testing/fake_device.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

// Three chunks: two whole, one half.
constexpr uint64_t kSize = 2500;
constexpr uint64_t kChunk = 1000;

// kSize bytes no two chunks share.
std::string Pattern() {
  std::string bytes(kSize, '\0');
  for (size_t i = 0; i < kSize; ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  return bytes;
}

// An upload of kSize bytes in kChunk chunks into a zeroed block of a
// FakeDevice that is not host-addressable (the fake's device memory is
// host memory all the same: the test reads it directly).
class DefaultStagedUploadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<DeviceStream>> stream =
        device_.CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *std::move(stream);
    absl::StatusOr<void*> block = device_.Allocate(kSize, 1);
    ASSERT_TRUE(block.ok()) << block.status();
    block_ = static_cast<char*>(*block);
    upload_ = stream_->StageUpload(block_, kSize, kChunk);
  }
  void TearDown() override {
    upload_.reset();
    stream_.reset();
    if (block_ != nullptr) device_.Deallocate(block_, kSize);
  }
  std::string DeviceBytes() const { return std::string(block_, kSize); }
  int Copies() { return device_.streams()[0]->copies.load(); }
  // Fills the next chunk with `bytes` of the pattern from `at` and commits
  // that many.
  void Put(uint64_t at, uint64_t bytes) {
    absl::StatusOr<absl::Span<char>> chunk = upload_->Next();
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    ASSERT_LE(bytes, chunk->size());
    std::memcpy(chunk->data(), data_.data() + at, bytes);
    ASSERT_TRUE(upload_->Commit(bytes).ok());
  }

  const std::string data_ = Pattern();
  FakeDevice device_{-1, /*host_addressable=*/false};
  std::unique_ptr<DeviceStream> stream_;
  char* block_ = nullptr;
  std::unique_ptr<StagedUpload> upload_;
};

TEST_F(DefaultStagedUploadTest, WholeChunksLandInOrder) {
  Put(0, kChunk);
  Put(kChunk, kChunk);
  Put(2 * kChunk, kSize - 2 * kChunk);
  ASSERT_TRUE(upload_->Finish().ok());
  EXPECT_EQ(DeviceBytes(), data_);
  EXPECT_EQ(
      upload_->Next().status(),
      absl::OutOfRangeError("the staged transfer's 2500 bytes are all moved"));
  EXPECT_EQ(Copies(), 3);
}

// An upload that ends early (its sender failed) commits the chunk it was
// filling as far as it got: those bytes land after the chunks before it,
// the rest of the range is untouched, and the transfer is over.
TEST_F(DefaultStagedUploadTest, AShortCommitLandsWhatWasReceivedAndEnds) {
  Put(0, kChunk);
  Put(kChunk, 300);
  ASSERT_TRUE(upload_->Finish().ok());
  EXPECT_EQ(DeviceBytes(),
            data_.substr(0, 1300) + std::string(kSize - 1300, '\0'));
  EXPECT_EQ(upload_->Next().status(),
            absl::OutOfRangeError("the staged transfer ended after 1300 of "
                                  "its 2500 bytes (its last chunk was "
                                  "committed short)"));
}

TEST_F(DefaultStagedUploadTest, ACommitPastItsChunkIsRefused) {
  ASSERT_TRUE(upload_->Next().ok());
  EXPECT_EQ(upload_->Commit(kChunk + 1),
            absl::InvalidArgumentError(
                "a staged chunk of 1000 bytes committed as 1001 bytes"));
  EXPECT_EQ(Copies(), 0);
}

// After a failed copy nothing more is copied, a short chunk neither: the
// transfer answers with that copy's error.
TEST_F(DefaultStagedUploadTest, AFailedCopyFailsTheShortCommitToo) {
  const absl::Status fault = absl::DataLossError("copy engine fault");
  ASSERT_TRUE(upload_->Next().ok());
  device_.FailNextSynchronize(fault);
  EXPECT_EQ(upload_->Commit(kChunk), fault);
  EXPECT_EQ(upload_->Next().status(), fault);
  EXPECT_EQ(upload_->Commit(300), fault);
  EXPECT_EQ(upload_->Finish(), fault);
  EXPECT_EQ(Copies(), 1);
}

}  // namespace
}  // namespace opserver
