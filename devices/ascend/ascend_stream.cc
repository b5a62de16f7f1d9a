// AscendStream: copies, memsets, launches, graph capture and replay on an
// aclrtStream, and the staged transfers through pinned host buffers, copied
// on two lanes (ascend_device.h).
#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

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
  // Idle: their copies are waited for by the transfers that made them.
  for (aclrtStream side : side_streams_) api.aclrtDestroyStream(side);
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
  return MemcpyOn(stream_, device_dst, host_src, bytes,
                  ACL_MEMCPY_HOST_TO_DEVICE);
}

absl::Status AscendStream::CopyFromDevice(void* host_dst,
                                          const void* device_src,
                                          uint64_t bytes) {
  return MemcpyOn(stream_, host_dst, device_src, bytes,
                  ACL_MEMCPY_DEVICE_TO_HOST);
}

absl::Status AscendStream::MemcpyOn(aclrtStream on, void* dst,
                                    const void* src, uint64_t bytes,
                                    aclrtMemcpyKind kind) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(device_->Bind());
  if (aclError error = device_->cann().api().aclrtMemcpyAsync(
          dst, bytes, src, bytes, kind, on);
      error != ACL_SUCCESS) {
    return AclError(device_->cann(),
                    kind == ACL_MEMCPY_HOST_TO_DEVICE
                        ? "aclrtMemcpyAsync (host to device)"
                        : "aclrtMemcpyAsync (device to host)",
                    error);
  }
  return absl::OkStatus();
}

// ---- Staged transfers ------------------------------------------------------

namespace {

// Threads that copy a staged transfer's chunks, and the page-locked slots
// the chunks pass through. Chunk k uses slot k % kStagingSlots and is
// copied by lane k % kCopyLanes; each lane is a thread with a stream of its
// own (lane 0 the transfer's, the others the stream's side streams), so
// while one lane waits for its copy (libaclnn_remote.so's copy of a chunk
// costs a round trip or two besides its bytes) another one's copy runs. The
// chunks are disjoint ranges, so the lanes need no order among themselves;
// but a side stream is not ordered after the work issued on the transfer's
// stream before it, so the side lanes start only once lane 0's first copy
// is done (that work is done then too). A transfer of one chunk is copied
// on the caller's thread.
//
// A slot is free, queued (filled for an upload, asked for by a download)
// or copied (a download's bytes, until the caller releases them).
constexpr int kCopyLanes = 2;
constexpr int kStagingSlots = kCopyLanes + 1;
static_assert(kStagingSlots == kStagingChunksPerTransfer);

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

  // Lets the copies in flight end (nothing can stop an NPU's copy), drops
  // the queued ones and frees the staging memory.
  ~ChunkCopier() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& lane : lanes_) lane.join();
    for (Slot& slot : slots_) {
      if (slot.buffer != nullptr) device_->FreeHost(slot.buffer, SlotBytes());
    }
  }

  uint64_t count() const { return count_; }
  // A slot's staging memory: a chunk, or the whole range when smaller.
  uint64_t SlotBytes() const { return std::min(chunk_, size_); }

  // Chunk k's size.
  uint64_t Bytes(uint64_t k) const {
    return std::min(chunk_, size_ - k * chunk_);
  }

  // Chunk k's slot, once free (the chunk that used it before is copied, or
  // released): its staging memory, allocated at first use.
  absl::StatusOr<absl::Span<char>> FreeSlot(uint64_t k) {
    Slot& slot = slots_[k % kStagingSlots];
    {
      absl::MutexLock lock(&mu_);
      auto free = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return slot.state == kFree || !error_.ok();
      };
      mu_.Await(absl::Condition(&free));
      RETURN_IF_ERROR(error_);
    }
    if (slot.buffer == nullptr) {
      ASSIGN_OR_RETURN(void* block, device_->AllocateHost(SlotBytes()));
      slot.buffer = static_cast<char*>(block);
    }
    return absl::MakeSpan(slot.buffer, Bytes(k));
  }

  // Hands chunk k (its slot from FreeSlot) to its lane: an upload's first
  // `bytes` bytes, filled; a download's, to be copied in. A transfer of
  // one chunk is copied here.
  absl::Status Queue(uint64_t k, uint64_t bytes) {
    Slot& slot = slots_[k % kStagingSlots];
    if (count_ == 1) {
      absl::Status copied = Copy(0, k, slot.buffer, bytes);
      absl::MutexLock lock(&mu_);
      slot.chunk = k;
      slot.bytes = bytes;
      ++queued_;
      Finished(slot, copied);
      return copied;
    }
    RETURN_IF_ERROR(StartLanes());
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(error_);
    slot.chunk = k;
    slot.bytes = bytes;
    slot.state = kQueued;
    ++queued_;
    return absl::OkStatus();
  }

  // Waits until chunk k is copied in (a download); its bytes.
  absl::StatusOr<absl::Span<const char>> Copied(uint64_t k) {
    Slot& slot = slots_[k % kStagingSlots];
    absl::MutexLock lock(&mu_);
    auto copied = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return (slot.state == kCopied && slot.chunk == k) || !error_.ok();
    };
    mu_.Await(absl::Condition(&copied));
    RETURN_IF_ERROR(error_);
    return absl::Span<const char>(slot.buffer, slot.bytes);
  }

  // The caller is done with download chunk k's bytes: its slot is free.
  void Release(uint64_t k) {
    absl::MutexLock lock(&mu_);
    slots_[k % kStagingSlots].state = kFree;
  }

  // Waits until every queued chunk is copied, or one failed.
  absl::Status WaitAllCopied() {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return copied_ >= queued_ || !error_.ok();
    };
    mu_.Await(absl::Condition(&done));
    return error_;
  }

  uint64_t queued() {
    absl::MutexLock lock(&mu_);
    return queued_;
  }

 private:
  enum State { kFree, kQueued, kCopied };
  struct Slot {
    char* buffer = nullptr;  // Set before its first Queue, by the caller.
    State state = kFree;
    uint64_t chunk = 0;
    uint64_t bytes = 0;
  };

  // The lanes' threads and side streams, at the first Queue. A failure is
  // the transfer's, as a copy's would be.
  absl::Status StartLanes() {
    if (!lanes_.empty()) return absl::OkStatus();
    absl::Status started = StartLanesOnce();
    absl::MutexLock lock(&mu_);
    if (!started.ok() && error_.ok()) error_ = started;
    return error_;
  }
  absl::Status StartLanesOnce() {
    aclrtStream streams[kCopyLanes] = {nullptr};
    for (int lane = 1; lane < kCopyLanes; ++lane) {
      ASSIGN_OR_RETURN(streams[lane], stream_->SideStream(lane - 1));
    }
    for (int lane = 0; lane < kCopyLanes; ++lane) {
      ASSIGN_OR_RETURN(
          std::thread thread,
          StartThread("the Ascend device's staging copy thread",
                      [this, lane, on = streams[lane]] { Run(lane, on); }));
      lanes_.push_back(std::move(thread));
    }
    return absl::OkStatus();
  }

  // Lane `lane`'s chunks, in order, on `on` (nullptr: the transfer's
  // stream), until the transfer is destroyed.
  void Run(int lane, aclrtStream on) {
    for (uint64_t k = lane; k < count_; k += kCopyLanes) {
      Slot& slot = slots_[k % kStagingSlots];
      uint64_t bytes;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
          return stopping_ || (error_.ok() && slot.state == kQueued &&
                               slot.chunk == k && (lane == 0 || primed_));
        };
        mu_.Await(absl::Condition(&ready));
        if (stopping_) return;
        bytes = slot.bytes;
      }
      absl::Status copied = Copy(lane, k, slot.buffer, bytes, on);
      absl::MutexLock lock(&mu_);
      Finished(slot, copied);
      if (!copied.ok()) return;
    }
  }

  // The copy of the chunk in `slot` ended: the slot is free (an upload) or
  // holds the bytes (a download), or the transfer has failed.
  void Finished(Slot& slot, const absl::Status& copied)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!copied.ok()) {
      if (error_.ok()) error_ = copied;
      return;
    }
    slot.state = upload_ ? kFree : kCopied;
    primed_ = true;
    ++copied_;
  }

  // The first `bytes` of chunk k between `host` and device memory, on
  // `on` (nullptr: the transfer's stream), done when this returns.
  absl::Status Copy(int lane, uint64_t k, char* host, uint64_t bytes,
                    aclrtStream on = nullptr) {
    char* device = device_base_ + k * chunk_;
    if (lane == 0) {
      RETURN_IF_ERROR(upload_ ? stream_->CopyToDevice(device, host, bytes)
                              : stream_->CopyFromDevice(host, device, bytes));
      return stream_->Synchronize();
    }
    return stream_->CopyAndWaitOn(on, upload_, device, host, bytes);
  }

  AscendDevice* const device_;
  AscendStream* const stream_;
  const bool upload_;
  char* const device_base_;
  const uint64_t size_;
  const uint64_t chunk_;
  const uint64_t count_;
  Slot slots_[kStagingSlots];
  std::vector<std::thread> lanes_;
  absl::Mutex mu_;
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t copied_ ABSL_GUARDED_BY(mu_) = 0;
  // Lane 0 copied a chunk: the side lanes may start.
  bool primed_ ABSL_GUARDED_BY(mu_) = false;
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
    return copier_.FreeSlot(k);
  }
  // A short chunk is queued like a whole one: its lane copies it after
  // nothing, and it lands with the others before Finish returns.
  absl::Status Commit(uint64_t filled) override {
    const uint64_t k = copier_.queued();
    RETURN_IF_ERROR(CheckStagedCommit(filled, copier_.Bytes(k)));
    RETURN_IF_ERROR(copier_.Queue(k, filled));
    committed_ += filled;
    ended_ = filled < copier_.Bytes(k);
    return absl::OkStatus();
  }
  absl::Status Finish() override { return copier_.WaitAllCopied(); }

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
    // The caller is done with chunk k - 1: its slot takes a chunk ahead.
    if (k > 0) copier_.Release(k - 1);
    for (uint64_t next = copier_.queued();
         next < std::min(copier_.count(), k + kStagingSlots); ++next) {
      RETURN_IF_ERROR(copier_.FreeSlot(next).status());
      RETURN_IF_ERROR(copier_.Queue(next, copier_.Bytes(next)));
    }
    ASSIGN_OR_RETURN(absl::Span<const char> bytes, copier_.Copied(k));
    ++taken_;
    return bytes;
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

absl::StatusOr<aclrtStream> AscendStream::SideStream(int i) {
  if (side_streams_.size() > static_cast<size_t>(i)) return side_streams_[i];
  RETURN_IF_ERROR(device_->Bind());
  while (side_streams_.size() <= static_cast<size_t>(i)) {
    aclrtStream side = nullptr;
    if (aclError error = device_->cann().api().aclrtCreateStream(&side);
        error != ACL_SUCCESS) {
      return AclError(device_->cann(), "aclrtCreateStream (a copy lane)",
                      error);
    }
    side_streams_.push_back(side);
  }
  return side_streams_[i];
}

absl::Status AscendStream::CopyAndWaitOn(aclrtStream on, bool to_device,
                                         void* device, void* host,
                                         uint64_t bytes) {
  RETURN_IF_ERROR(to_device ? MemcpyOn(on, device, host, bytes,
                                       ACL_MEMCPY_HOST_TO_DEVICE)
                            : MemcpyOn(on, host, device, bytes,
                                       ACL_MEMCPY_DEVICE_TO_HOST));
  RETURN_IF_ERROR(device_->Bind());
  if (aclError error = device_->cann().api().aclrtSynchronizeStream(on);
      error != ACL_SUCCESS) {
    return AclError(device_->cann(), "aclrtSynchronizeStream", error);
  }
  return absl::OkStatus();
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
