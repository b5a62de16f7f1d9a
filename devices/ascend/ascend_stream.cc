// AscendStream: copies, memsets, launches, graph capture and replay on an
// aclrtStream, and the staged transfers through two pinned host buffers
// (ascend_device.h).
#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/thread_start.h"
#include "devices/ascend/ascend_device.h"
#include "kernels/aclnn_status.h"

namespace opserver::ascend {

// ---- AscendStream ----------------------------------------------------------

AscendStream::~AscendStream() {
  (void)device_->Bind();
  const CannApi& api = device_->cann().api();
  // Whatever the launches still use is released only once they are done.
  api.aclrtSynchronizeStream(stream_);
  ReleasePending();
  device_->FreeRaw(scratch_, scratch_bytes_);
  api.aclrtDestroyStream(stream_);
}

void AscendStream::ReleasePending() {
  for (auto [block, bytes] : pending_.retired_scratch) {
    device_->FreeRaw(block, bytes);
  }
  pending_ = Pending();
}

absl::StatusOr<void*> AscendStream::Scratch(uint64_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  ASSIGN_OR_RETURN(void* block, device_->AllocateRaw(bytes));
  if (scratch_ != nullptr) {
    pending_.retired_scratch.emplace_back(scratch_, scratch_bytes_);
  }
  scratch_ = block;
  scratch_bytes_ = bytes;
  return scratch_;
}

absl::Status AscendStream::CopyToDevice(void* device_dst, const void* host_src,
                                        uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(device_->Bind());
  if (aclError error = device_->cann().api().aclrtMemcpyAsync(
          device_dst, bytes, host_src, bytes, ACL_MEMCPY_HOST_TO_DEVICE,
          stream_);
      error != ACL_SUCCESS) {
    return AclError(device_->cann(), "aclrtMemcpyAsync (host to device)",
                    error);
  }
  return absl::OkStatus();
}

absl::Status AscendStream::CopyFromDevice(void* host_dst,
                                          const void* device_src,
                                          uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(device_->Bind());
  if (aclError error = device_->cann().api().aclrtMemcpyAsync(
          host_dst, bytes, device_src, bytes, ACL_MEMCPY_DEVICE_TO_HOST,
          stream_);
      error != ACL_SUCCESS) {
    return AclError(device_->cann(), "aclrtMemcpyAsync (device to host)",
                    error);
  }
  return absl::OkStatus();
}

// ---- Staged transfers ------------------------------------------------------

namespace {

// The chunks of a staged transfer and the thread that copies them through
// two staging buffers, in order: chunk k uses buffer k % 2. The caller
// queues chunk k only once it is done with buffer k % 2's previous chunk
// (k - 2), so the copier never writes or reads a buffer the caller uses.
// An upload's chunk may be queued short (its first bytes only): the last
// one of an upload that ended early.
class ChunkCopier {
 public:
  ChunkCopier(AscendDevice* device, AscendStream* stream, bool upload,
              char* device_base, uint64_t size, uint64_t chunk)
      : device_(device),
        stream_(stream),
        upload_(upload),
        device_base_(device_base),
        size_(size),
        chunk_(std::max<uint64_t>(chunk, 1)),
        count_(size == 0 ? 0 : (size - 1) / chunk_ + 1) {}

  // Lets the copy in flight end (nothing can stop an NPU's copy), drops
  // the queued ones and frees the staging memory.
  ~ChunkCopier() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (worker_.joinable()) worker_.join();
    for (char* buffer : buffers_) {
      if (buffer != nullptr) device_->FreeHost(buffer);
    }
  }

  uint64_t count() const { return count_; }

  // Chunk k's staging memory (allocated at its buffer's first use).
  absl::StatusOr<absl::Span<char>> Buffer(uint64_t k) {
    char*& buffer = buffers_[k % 2];
    if (buffer == nullptr) {
      ASSIGN_OR_RETURN(void* block,
                       device_->AllocateHost(std::min(chunk_, size_)));
      buffer = static_cast<char*>(block);
    }
    return absl::MakeSpan(buffer, Bytes(k));
  }

  // Chunk k's size.
  uint64_t Bytes(uint64_t k) const {
    return std::min(chunk_, size_ - k * chunk_);
  }

  // Queues the copy of the next chunk's first `bytes` bytes (at most its
  // size). A range of one chunk is copied here.
  absl::Status Queue(uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(error_);
    const uint64_t k = queued_++;
    lengths_[k % 2] = bytes;
    if (count_ == 1) {
      mu_.Unlock();
      absl::Status copied = Copy(k, bytes);
      mu_.Lock();
      Copied(copied);
      return copied;
    }
    if (!worker_.joinable()) {
      absl::StatusOr<std::thread> started = StartThread(
          "the Ascend device's staging copy thread", [this] { Run(); });
      if (!started.ok()) {
        error_ = started.status();
        return error_;
      }
      worker_ = *std::move(started);
    }
    return absl::OkStatus();
  }

  // Waits until the first `n` chunks are copied, or one failed.
  absl::Status WaitCopied(uint64_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return copied_ >= n || !error_.ok();
    };
    mu_.Await(absl::Condition(&done));
    return error_;
  }

  uint64_t queued() {
    absl::MutexLock lock(&mu_);
    return queued_;
  }

 private:
  // The first `bytes` of chunk k between its staging buffer and device
  // memory, done when this returns (one staging buffer per chunk in
  // flight, so the stream is synchronized before it is reused).
  absl::Status Copy(uint64_t k, uint64_t bytes) {
    char* device = device_base_ + k * chunk_;
    char* host = buffers_[k % 2];
    RETURN_IF_ERROR(upload_ ? stream_->CopyToDevice(device, host, bytes)
                            : stream_->CopyFromDevice(host, device, bytes));
    return stream_->Synchronize();
  }

  void Copied(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (status.ok()) {
      ++copied_;
    } else if (error_.ok()) {
      error_ = status;
    }
  }

  void Run() {
    absl::MutexLock lock(&mu_);
    for (;;) {
      auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || (error_.ok() && copied_ < queued_);
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      const uint64_t k = copied_;
      const uint64_t bytes = lengths_[k % 2];
      mu_.Unlock();
      absl::Status copied = Copy(k, bytes);
      mu_.Lock();
      Copied(copied);
    }
  }

  AscendDevice* const device_;
  AscendStream* const stream_;
  const bool upload_;
  char* const device_base_;
  const uint64_t size_;
  const uint64_t chunk_;
  const uint64_t count_;
  // Set once, before the worker reads them (Buffer precedes Queue).
  char* buffers_[2] = {nullptr, nullptr};
  std::thread worker_;
  absl::Mutex mu_;
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t copied_ ABSL_GUARDED_BY(mu_) = 0;
  // The bytes to copy of the chunk queued in each buffer.
  uint64_t lengths_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

class AscendStagedUpload : public StagedUpload {
 public:
  AscendStagedUpload(AscendDevice* device, AscendStream* stream, char* dst,
                     uint64_t size, uint64_t chunk)
      : size_(size), copier_(device, stream, true, dst, size, chunk) {}

  absl::StatusOr<absl::Span<char>> Next() override {
    const uint64_t k = copier_.queued();
    if (k == copier_.count() || ended_) {
      return StagedTransferEnded(committed_, size_);
    }
    // Chunk k - 2 left buffer k % 2.
    RETURN_IF_ERROR(copier_.WaitCopied(k < 2 ? 0 : k - 1));
    return copier_.Buffer(k);
  }
  // A short chunk is queued like a whole one, so it lands after the chunks
  // before it (the copier copies in order).
  absl::Status Commit(uint64_t filled) override {
    const uint64_t chunk = copier_.Bytes(copier_.queued());
    RETURN_IF_ERROR(CheckStagedCommit(filled, chunk));
    RETURN_IF_ERROR(copier_.Queue(filled));
    committed_ += filled;
    ended_ = filled < chunk;
    return absl::OkStatus();
  }
  absl::Status Finish() override {
    return copier_.WaitCopied(copier_.queued());
  }

 private:
  const uint64_t size_;
  uint64_t committed_ = 0;  // Bytes queued.
  bool ended_ = false;      // A chunk was committed short.
  ChunkCopier copier_;
};

class AscendStagedDownload : public StagedDownload {
 public:
  AscendStagedDownload(AscendDevice* device, AscendStream* stream,
                       const char* src, uint64_t size, uint64_t chunk)
      : size_(size),
        copier_(device, stream, false, const_cast<char*>(src), size, chunk) {}

  absl::StatusOr<absl::Span<const char>> Next() override {
    const uint64_t k = taken_;
    if (k == copier_.count()) return StagedTransferEnded(size_, size_);
    // The caller is done with chunk k - 1: its buffer takes chunk k + 1,
    // copied while the caller sends chunk k.
    for (uint64_t next = copier_.queued(); next <= k + 1; ++next) {
      if (next == copier_.count()) break;
      RETURN_IF_ERROR(copier_.Buffer(next).status());
      RETURN_IF_ERROR(copier_.Queue(copier_.Bytes(next)));
    }
    RETURN_IF_ERROR(copier_.WaitCopied(k + 1));
    ++taken_;
    ASSIGN_OR_RETURN(absl::Span<char> bytes, copier_.Buffer(k));
    return absl::Span<const char>(bytes);
  }

 private:
  const uint64_t size_;
  uint64_t taken_ = 0;
  ChunkCopier copier_;
};

}  // namespace

std::unique_ptr<StagedUpload> AscendStream::StageUpload(void* device_dst,
                                                        uint64_t size,
                                                        uint64_t chunk) {
  return std::make_unique<AscendStagedUpload>(
      device_, this, static_cast<char*>(device_dst), size, chunk);
}

std::unique_ptr<StagedDownload> AscendStream::StageDownload(
    const void* device_src, uint64_t size, uint64_t chunk) {
  return std::make_unique<AscendStagedDownload>(
      device_, this, static_cast<const char*>(device_src), size, chunk);
}

absl::Status AscendStream::Memset(void* dst, int value, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(device_->Bind());
  const CannApi& api = device_->cann().api();
  if (api.has_memset()) {
    if (aclError error =
            api.aclrtMemsetAsync(dst, bytes, value & 0xff, bytes, stream_);
        error != ACL_SUCCESS) {
      return AclError(device_->cann(), "aclrtMemsetAsync", error);
    }
    return absl::OkStatus();
  }
  // The copy reads the staged bytes until the next Synchronize.
  pending_.staged.emplace_back(bytes, static_cast<char>(value & 0xff));
  if (aclError error =
          api.aclrtMemcpyAsync(dst, bytes, pending_.staged.back().data(), bytes,
                               ACL_MEMCPY_HOST_TO_DEVICE, stream_);
      error != ACL_SUCCESS) {
    return AclError(device_->cann(), "aclrtMemcpyAsync (memset)", error);
  }
  return absl::OkStatus();
}

absl::Status AscendStream::CopyOnDevice(void* dst, const void* src,
                                        uint64_t bytes) {
  if (bytes == 0 || dst == src) return absl::OkStatus();
  RETURN_IF_ERROR(device_->Bind());
  const CannApi& api = device_->cann().api();
  auto copy = [&](void* to, const void* from) -> absl::Status {
    if (aclError error = api.aclrtMemcpyAsync(
            to, bytes, from, bytes, ACL_MEMCPY_DEVICE_TO_DEVICE, stream_);
        error != ACL_SUCCESS) {
      return AclError(device_->cann(), "aclrtMemcpyAsync (device to device)",
                      error);
    }
    return absl::OkStatus();
  };
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto s = reinterpret_cast<uintptr_t>(src);
  if (d + bytes <= s || s + bytes <= d) return copy(dst, src);
  ASSIGN_OR_RETURN(void* scratch, Scratch(bytes));
  RETURN_IF_ERROR(copy(scratch, src));
  return copy(dst, scratch);
}

absl::Status AscendStream::Launch(const DevicePlan& plan, void* workspace,
                                  uint64_t workspace_size) {
  if (cancelled_.load(std::memory_order_relaxed)) {
    return absl::CancelledError("the stream was cancelled");
  }
  const auto* ascend = dynamic_cast<const AscendPlan*>(&plan);
  if (plan.device() != device_ || ascend == nullptr) {
    return absl::InternalError(
        "a launch was prepared by another device than the stream's");
  }
  RETURN_IF_ERROR(device_->Bind());
  ASSIGN_OR_RETURN(const uint64_t needed, ascend->Planned());
  // opserver's workspace follows its own contract (kernels' workspace
  // rules); an aclnn kernel that needs more gets the stream's scratch.
  void* launch_workspace = workspace;
  uint64_t launch_workspace_size = workspace_size;
  if (needed > workspace_size) {
    ASSIGN_OR_RETURN(launch_workspace, Scratch(needed));
    launch_workspace_size = needed;
  }
  if (aclnnStatus status =
          ascend->Launch(launch_workspace, launch_workspace_size, stream_);
      status != ACLNN_SUCCESS) {
    return AclnnFailure(device_->cann(), AclnnName(plan.call().op), status);
  }
  return absl::OkStatus();
}

absl::Status AscendStream::ReplayGraph(const DeviceGraph& graph) {
  if (cancelled_.load(std::memory_order_relaxed)) {
    return absl::CancelledError("the stream was cancelled");
  }
  const auto* ascend = dynamic_cast<const AscendGraph*>(&graph);
  if (ascend == nullptr || ascend->device() != device_) {
    return absl::InternalError(
        "a graph was captured by another device than the stream's");
  }
  RETURN_IF_ERROR(device_->Bind());
  if (aclError error =
          device_->cann().api().aclmdlRIExecuteAsync(ascend->model(), stream_);
      error != ACL_SUCCESS) {
    return AclError(device_->cann(), "aclmdlRIExecuteAsync", error);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<AscendGraph>> AscendStream::Capture(
    const GraphIssuer& issue) {
  RETURN_IF_ERROR(device_->Bind());
  const CannApi& api = device_->cann().api();
  if (aclError error = api.aclmdlRICaptureBegin(
          stream_, ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL);
      error != ACL_SUCCESS) {
    absl::Status status =
        AclError(device_->cann(), "aclmdlRICaptureBegin", error);
    // A runtime that has the call but not the feature now (CANN on an SoC
    // without it; libaclnn_remote.so unpipelined): the graph still runs,
    // task by task.
    if (error == ACL_ERROR_RT_FEATURE_NOT_SUPPORT) {
      return absl::UnimplementedError(status.message());
    }
    return status;
  }
  const absl::Status issued = issue(*this);
  aclmdlRI model = nullptr;
  const aclError ended = api.aclmdlRICaptureEnd(stream_, &model);
  if (!issued.ok()) {
    if (ended == ACL_SUCCESS && model != nullptr) api.aclmdlRIDestroy(model);
    return issued;
  }
  if (ended != ACL_SUCCESS) {
    return AclError(device_->cann(), "aclmdlRICaptureEnd", ended);
  }
  if (model == nullptr) {
    return AclError(device_->cann(), "aclmdlRICaptureEnd (no model)",
                    ACL_ERROR_FAILURE);
  }
  // Every scratch block a captured launch may use goes with the model:
  // the current one and those it replaced during the capture.
  std::vector<std::pair<void*, uint64_t>> scratch =
      std::move(pending_.retired_scratch);
  pending_.retired_scratch.clear();
  if (scratch_ != nullptr) scratch.emplace_back(scratch_, scratch_bytes_);
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  return std::make_unique<AscendGraph>(device_, model, std::move(scratch));
}

absl::Status AscendStream::Synchronize() {
  RETURN_IF_ERROR(device_->Bind());
  const aclError error = device_->cann().api().aclrtSynchronizeStream(stream_);
  // Before the destroys below, which may replace the thread's last error.
  absl::Status status =
      error == ACL_SUCCESS
          ? absl::OkStatus()
          : AclError(device_->cann(), "aclrtSynchronizeStream", error);
  // Done or failed, the stream has stopped using them.
  ReleasePending();
  return status;
}
}  // namespace opserver::ascend
