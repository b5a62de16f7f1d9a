#include "devices/device.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/tensor.h"

namespace opserver {

DevicePlan::DevicePlan(const Device* device, kernels::ValidCall valid)
    : device_(device),
      valid_(std::move(valid)),
      numel_(kernels::NumElements(valid_.out_shape)) {}

absl::Status StagedTransferEnded(uint64_t moved, uint64_t size) {
  if (moved == size) {
    return absl::OutOfRangeError(
        absl::StrCat("the staged transfer's ", size, " bytes are all moved"));
  }
  return absl::OutOfRangeError(
      absl::StrCat("the staged transfer ended after ", moved, " of its ", size,
                   " bytes (its last chunk was committed short)"));
}

absl::Status CheckStagedCommit(uint64_t filled, uint64_t chunk_size) {
  if (filled <= chunk_size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("a staged chunk of ", chunk_size, " bytes committed as ",
                   filled, " bytes"));
}

absl::Status StagedUpload::End(uint64_t filled) {
  if (filled > 0) RETURN_IF_ERROR(Commit(filled));
  return Finish();
}

namespace {

// DeviceStream's default staging: one chunk of host memory, copied and
// synchronized before the next is handed out, so nothing overlaps.
class SyncStagedUpload : public StagedUpload {
 public:
  SyncStagedUpload(DeviceStream* stream, char* dst, uint64_t size,
                   uint64_t chunk)
      : stream_(stream),
        dst_(dst),
        size_(size),
        chunk_(std::max<uint64_t>(chunk, 1)) {}

  absl::StatusOr<absl::Span<char>> Next() override {
    RETURN_IF_ERROR(error_);
    if (at_ == size_ || ended_) return StagedTransferEnded(at_, size_);
    staging_.resize(std::min(chunk_, size_ - at_));
    return absl::MakeSpan(staging_);
  }
  absl::Status Commit(uint64_t filled) override {
    RETURN_IF_ERROR(error_);
    RETURN_IF_ERROR(CheckStagedCommit(filled, staging_.size()));
    ended_ = filled < staging_.size();
    error_ = stream_->CopyToDevice(dst_ + at_, staging_.data(), filled);
    if (error_.ok()) error_ = stream_->Synchronize();
    at_ += filled;
    return error_;
  }
  absl::Status Finish() override { return error_; }

 private:
  DeviceStream* const stream_;
  char* const dst_;
  const uint64_t size_;
  const uint64_t chunk_;
  uint64_t at_ = 0;
  bool ended_ = false;  // A chunk was committed short.
  std::string staging_;
  absl::Status error_;
};

class SyncStagedDownload : public StagedDownload {
 public:
  SyncStagedDownload(DeviceStream* stream, const char* src, uint64_t size,
                     uint64_t chunk)
      : stream_(stream),
        src_(src),
        size_(size),
        chunk_(std::max<uint64_t>(chunk, 1)) {}

  absl::StatusOr<absl::Span<const char>> Next() override {
    RETURN_IF_ERROR(error_);
    if (at_ == size_) return StagedTransferEnded(size_, size_);
    staging_.resize(std::min(chunk_, size_ - at_));
    error_ =
        stream_->CopyFromDevice(staging_.data(), src_ + at_, staging_.size());
    if (error_.ok()) error_ = stream_->Synchronize();
    RETURN_IF_ERROR(error_);
    at_ += staging_.size();
    return absl::MakeConstSpan(staging_);
  }

 private:
  DeviceStream* const stream_;
  const char* const src_;
  const uint64_t size_;
  const uint64_t chunk_;
  uint64_t at_ = 0;
  std::string staging_;
  absl::Status error_;
};

}  // namespace

std::unique_ptr<StagedUpload> DeviceStream::StageUpload(void* device_dst,
                                                        uint64_t size,
                                                        uint64_t chunk) {
  return std::make_unique<SyncStagedUpload>(
      this, static_cast<char*>(device_dst), size, chunk);
}

std::unique_ptr<StagedDownload> DeviceStream::StageDownload(
    const void* device_src, uint64_t size, uint64_t chunk) {
  return std::make_unique<SyncStagedDownload>(
      this, static_cast<const char*>(device_src), size, chunk);
}

}  // namespace opserver
