// The Ascend NPU device: opserver's Device and DeviceStream on top of CANN's
// runtime (acl/acl_rt.h) and aclnn operator libraries, called through the
// functions CannLibrary loaded. Nothing here links against CANN, so it
// builds without CANN installed.
#ifndef OPSERVER_DEVICES_ASCEND_ASCEND_DEVICE_H_
#define OPSERVER_DEVICES_ASCEND_ASCEND_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "devices/ascend/cann_library.h"
#include "devices/device.h"
#include "devices/memory_pool.h"

namespace opserver::ascend {

// An acl error as a Status: INTERNAL carrying aclnn 361001, with the call,
// the acl error number and aclGetRecentErrMsg's text in the message.
absl::Status AclError(const CannLibrary& cann, absl::string_view call,
                      aclError error);

// An aclnn status as a Status that keeps the number (kernels/aclnn_status.h)
// and aclGetRecentErrMsg's text: INVALID_ARGUMENT for the parameter errors
// (1610xx), INTERNAL otherwise.
absl::Status AclnnFailure(const CannLibrary& cann, absl::string_view call,
                          aclnnStatus status);

// ": " and aclGetRecentErrMsg's text, or "" when CANN has none.
std::string WithRecentError(const CannLibrary& cann);

// The name of `op`'s aclnn function ("aclnnThresholdBackward").
absl::string_view AclnnName(kernels::OpKind op);

class AscendDevice;

// The Ascend device's DevicePlan (AscendDevice::Prepare): the call as CANN
// objects, an aclTensor per view and an aclScalar per parameter, planned by
// aclnnXxxGetWorkspaceSize into an aclOpExecutor made repeatable. Planned
// at its first launch, on the stream's thread (where the per-launch work of
// a single-use executor ran before; planning at GetWorkspaceSize, on the
// thread that applies the client's commands, measured twice as slow through
// the chain: BENCHMARKS.md), and kept: every later launch of a repeatable
// opserver executor enqueues the same aclnn executor, so CANN's host-side
// planning runs once per executor, not per launch. The CANN objects are
// destroyed with the plan, on whichever thread lets it go (bound to the
// device first): after the opserver executor is released and its last
// launch is done, as a launch holds the executor until its stream has
// synchronized. Thread-safe: launches from several streams take turns.
class AscendPlan : public DevicePlan {
 public:
  AscendPlan(const AscendDevice* device, kernels::ValidCall valid);
  ~AscendPlan() override;

  // Plans the call with CANN the first time (the device bound on the
  // calling thread) and returns the workspace aclnnXxxGetWorkspaceSize
  // asked for (a launch with less gets the stream's scratch). A failure
  // leaves nothing made: the next call plans again.
  absl::StatusOr<uint64_t> Planned() const;
  // aclnnXxx(workspace, workspace_size, executor, stream), after Planned
  // succeeded. Launches take turns on the host: aclnnXxx sets the
  // executor's workspace before it enqueues the kernel.
  aclnnStatus Launch(void* workspace, uint64_t workspace_size,
                     aclrtStream stream) const;

 private:
  absl::Status PlanLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DestroyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AscendDevice* const device_;
  mutable absl::Mutex mu_;
  mutable std::vector<aclTensor*> tensors_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<aclScalar*> scalars_ ABSL_GUARDED_BY(mu_);
  mutable aclOpExecutor* executor_ ABSL_GUARDED_BY(mu_) = nullptr;
  mutable uint64_t aclnn_workspace_size_ ABSL_GUARDED_BY(mu_) = 0;
};

// A graph's device work as CANN's own graph: the aclmdlRI an AscendStream
// captured (AscendDevice::CaptureGraph), and the scratch workspaces its
// launches were captured with (the capture stream's, handed over, so that
// no other stream or graph writes them). Destroying it calls
// aclmdlRIDestroy, then frees the scratch.
class AscendGraph : public DeviceGraph {
 public:
  AscendGraph(AscendDevice* device, aclmdlRI model,
              std::vector<std::pair<void*, uint64_t>> scratch)
      : device_(device), model_(model), scratch_(std::move(scratch)) {}
  ~AscendGraph() override;

  const AscendDevice* device() const { return device_; }
  aclmdlRI model() const { return model_; }

 private:
  AscendDevice* const device_;
  const aclmdlRI model_;
  const std::vector<std::pair<void*, uint64_t>> scratch_;
};

// One aclrtStream. Launch enqueues an AscendPlan's aclnn executor, with the
// stream's scratch when aclnn asked for more workspace than opserver's.
// Not thread-safe (DeviceStream's contract). Must not outlive its device.
class AscendStream : public DeviceStream {
 public:
  AscendStream(AscendDevice* device, aclrtStream stream)
      : device_(device), stream_(stream) {}
  // Synchronizes, releases what the launches used and destroys the stream.
  ~AscendStream() override;

  absl::Status CopyToDevice(void* device_dst, const void* host_src,
                            uint64_t bytes) override;
  absl::Status CopyFromDevice(void* host_dst, const void* device_src,
                              uint64_t bytes) override;
  // Through three chunks of page-locked staging memory (aclrtMallocHost,
  // allocated at first use, freed with the transfer), copied on two lanes:
  // two threads of the transfer's own, each copying every other chunk on
  // a stream of its own (this one, and a side stream kept for the next
  // transfer) with aclrtMemcpyAsync, then aclrtSynchronizeStream before
  // its buffer is reused, while the caller fills or sends a third chunk.
  // Threads, not the stream's asynchrony alone, since aclrtMemcpyAsync may
  // block its caller (libaclnn_remote.so moves a copy from pageable memory
  // before it returns); two lanes, so that one copy's fixed cost (through
  // libaclnn_remote.so, a round trip or two) overlaps the other's bytes.
  // The second lane starts after the first lane's first copy, which orders
  // it after the work issued on this stream before the transfer. A range
  // of one chunk is copied on the caller's thread.
  std::unique_ptr<StagedUpload> StageUpload(void* device_dst, uint64_t size,
                                            uint64_t chunk) override;
  std::unique_ptr<StagedDownload> StageDownload(const void* device_src,
                                                uint64_t size,
                                                uint64_t chunk) override;
  // Side stream `i` of this stream (created at first use, destroyed with
  // it): a staged transfer's second copy lane.
  absl::StatusOr<aclrtStream> SideStream(int i);
  // aclrtMemcpyAsync between `device` and `host` (`to_device`: host to
  // device) on `on`, then aclrtSynchronizeStream of `on`.
  absl::Status CopyAndWaitOn(aclrtStream on, bool to_device, void* device,
                             void* host, uint64_t bytes);
  // aclrtMemsetAsync of `value & 0xff` (without it in the loaded runtime:
  // a host-to-device copy of a staged block of that byte).
  absl::Status Memset(void* dst, int value, uint64_t bytes) override;
  // A device-to-device aclrtMemcpyAsync; overlapping ranges go through the
  // stream's scratch (two copies, in order), as CANN does not promise
  // memmove.
  absl::Status CopyOnDevice(void* dst, const void* src,
                            uint64_t bytes) override;
  absl::Status Launch(const DevicePlan& plan, void* workspace,
                      uint64_t workspace_size) override;
  // aclmdlRIExecuteAsync of an AscendGraph of this device.
  absl::Status ReplayGraph(const DeviceGraph& graph) override;
  // aclmdlRICaptureBegin (THREAD_LOCAL mode: other threads' synchronous
  // calls, such as the zeroing of fresh memory, stay allowed), what
  // `issue` issues here, aclmdlRICaptureEnd: the model, which takes this
  // stream's scratch with it. Nothing else may be issued on this stream
  // meanwhile (AscendDevice::CaptureGraph makes one for the capture).
  absl::StatusOr<std::unique_ptr<AscendGraph>> Capture(
      const GraphIssuer& issue);
  // An NPU kernel cannot be stopped: launches issued after it are refused
  // with CANCELLED, the running one finishes.
  void CancelRunning() override {
    cancelled_.store(true, std::memory_order_relaxed);
  }
  absl::Status Synchronize() override;
  // aclnn launches and the *Async copies only enqueue on the aclrtStream.
  bool asynchronous() const override { return true; }

 private:
  // What the operations issued since the last Synchronize still use.
  struct Pending {
    // Scratch workspaces replaced by larger ones: freed once the launches
    // that used them are done.
    std::vector<std::pair<void*, uint64_t>> retired_scratch;
    // Host bytes asynchronous copies read (Memset without aclrtMemset).
    std::vector<std::string> staged;
  };

  // aclrtMemcpyAsync of `bytes` from `src` to `dst` (`kind`: host to
  // device or device to host) on `on`.
  absl::Status MemcpyOn(aclrtStream on, void* dst, const void* src,
                        uint64_t bytes, aclrtMemcpyKind kind);
  // Destroys what `pending_` holds (after the stream is idle).
  void ReleasePending();
  // A workspace of at least `bytes` the device allocated for this stream,
  // for an aclnn executor that needs more than opserver's workspace.
  absl::StatusOr<void*> Scratch(uint64_t bytes);

  AscendDevice* const device_;
  const aclrtStream stream_;
  // Copy lanes of staged transfers (SideStream); used by one transfer at a
  // time, as the stream is.
  std::vector<aclrtStream> side_streams_;
  std::atomic<bool> cancelled_{false};
  Pending pending_;
  void* scratch_ = nullptr;
  uint64_t scratch_bytes_ = 0;
};

// Chunks of page-locked staging memory one transfer holds at most
// (AscendStream::StageUpload / StageDownload).
inline constexpr int kStagingChunksPerTransfer = 3;

// One NPU (device id) of the loaded CANN. Its context is created once and
// set on every thread before it calls CANN for this device (CANN's current
// context is per thread). Memory comes from aclrtMalloc through the reuse
// cache every device shares (devices/memory_pool.h), capped by
// `memory_bytes` (0 = what aclrtGetMemInfo reports free at start) and never
// above that: buffers in use, cached blocks and stream scratch together.
// aclrtMalloc's memory holds whatever the NPU stored there last, so a
// fresh block is zeroed (aclrtMemset) before it is handed out, and a cached
// one when it changes owner: no owner sees another's bytes, and reuse
// within an owner calls CANN not at all. Thread-safe.
class AscendDevice : public Device {
 public:
  // aclrtSetDevice / aclrtCreateContext on `device_id`, its SoC name and
  // memory; up to `memory_cache_bytes` of freed memory is kept for reuse.
  // FAILED_PRECONDITION naming the call for a device CANN does not have
  // (or whatever CANN reports).
  // Transfers stage through at most `staging_bytes` of page-locked host
  // memory at once (AllocateHost).
  static absl::StatusOr<std::unique_ptr<AscendDevice>> Create(
      std::shared_ptr<CannLibrary> cann, int32_t device_id,
      uint64_t memory_bytes, uint64_t memory_cache_bytes,
      uint64_t staging_bytes = 1ull << 30);
  // Gives the cached blocks back (aclrtFree), destroys the context and
  // resets the device; every stream and buffer must be gone.
  ~AscendDevice() override;

  // The unit allocations are rounded up to, as the caching allocators of
  // CUDA and torch_npu round (their smallest block): sizes that differ by
  // a few bytes share cached blocks. aclrtMalloc rounds to 32 bytes itself.
  static constexpr uint64_t kGranule = 512;

  DeviceDescription Describe() const override;
  // Freed memory kept for reuse.
  uint64_t CachedBytes() const override;
  // The capacity less what is in use (buffers and stream scratch): the
  // cache gives way to new allocations, so it counts as free.
  uint64_t FreeBytes() const override;
  absl::StatusOr<void*> Allocate(uint64_t bytes, uint64_t owner) override;
  void Deallocate(void* block, uint64_t bytes) override;
  absl::StatusOr<std::unique_ptr<DeviceStream>> CreateStream() override;
  // Whether the loaded aclnn library has the operator (ListOperators lists
  // only these; the others are refused when planned).
  // An AscendPlan, which CANN plans at its first launch.
  absl::StatusOr<std::unique_ptr<DevicePlan>> Prepare(
      kernels::ValidCall valid) const override {
    return std::make_unique<AscendPlan>(this, std::move(valid));
  }
  bool SupportsOp(kernels::OpKind op) const override {
    return cann_->api().has_op(op);
  }
  // CANN's graph capture, when the loaded runtime has it
  // (CannApi::has_graphs) and aclrtMemsetAsync, which a captured memset
  // needs (the fallback's host copy cannot be captured).
  bool captures_graphs() const override {
    return cann_->api().has_graphs() && cann_->api().has_memset();
  }
  // On a stream made for it and destroyed after (the model does not need
  // it): AscendStream::Capture.
  absl::StatusOr<std::unique_ptr<DeviceGraph>> CaptureGraph(
      const GraphIssuer& issue) override;
  // Says so when the loaded CANN cannot capture graphs.
  std::string StartNotice() const override;
  // Issuing a launch only queues it on the NPU's stream: up to this many
  // elements it is issued from the thread that received it when its
  // stream is idle, the hand-off to the stream's thread costing more (the
  // same bound as the CPU device's).
  static constexpr int64_t kInlineLaunchElements = 16 * 1024;
  int64_t inline_launch_elements() const override {
    return kInlineLaunchElements;
  }

  const CannLibrary& cann() const { return *cann_; }
  int32_t device_id() const { return device_id_; }

  // Makes this device current on the calling thread (aclrtSetCurrentContext
  // or, without contexts, aclrtSetDevice), once per thread until another
  // device is bound there. Every call into CANN for this device comes
  // after it.
  absl::Status Bind() const;

  // Page-locked host memory (aclrtMallocHost; given back by FreeHost with
  // the same size), for transfers' staging, within the device's staging
  // cap. The last kKeptStagingBlocks blocks given back stay allocated
  // and go to the next request of their size: pinning memory is what
  // makes aclrtMallocHost slow on an NPU host, and every transfer would
  // otherwise pin its chunks anew. They count against the cap, and are
  // freed when a request needs their room or the device goes.
  // RESOURCE_EXHAUSTED naming the cap, or the acl error.
  absl::StatusOr<void*> AllocateHost(uint64_t bytes) const;
  void FreeHost(void* block, uint64_t bytes) const;
  // Two transfers' staging (kStagingChunksPerTransfer chunks each).
  static constexpr size_t kKeptStagingBlocks = 2 * kStagingChunksPerTransfer;
  // The staging blocks kept now: every other one CANN has handed out is
  // held by a transfer.
  size_t KeptStagingBlocks() const;

  // Device memory outside Allocate's cache and zeroing (stream scratch),
  // within the same capacity: the cache gives way to it.
  absl::StatusOr<void*> AllocateRaw(uint64_t bytes);
  void FreeRaw(void* block, uint64_t bytes);

 private:
  // The pool's MemoryBacking: aclrtMalloc, aclrtFree and Zero with this
  // device bound.
  class Backing;
  // A page-locked staging block and its size.
  struct StagingBlock {
    void* block;
    uint64_t bytes;
  };

  AscendDevice(std::shared_ptr<CannLibrary> cann, int32_t device_id);
  // Sets `bytes` at `block` to zero, synchronously (this device bound).
  absl::Status Zero(void* block, uint64_t bytes);

  // A kept staging block of `bytes`; or, with none, nullptr once `bytes`
  // are reserved within the cap (the kept blocks moved to `evicted` if
  // they were in the way), or RESOURCE_EXHAUSTED naming the cap.
  absl::StatusOr<void*> TakeKeptOrReserve(
      uint64_t bytes, std::vector<StagingBlock>* evicted) const;
  // aclrtFreeHost of each of `blocks`, this device bound.
  void FreeStaging(const std::vector<StagingBlock>& blocks) const;

  const std::shared_ptr<CannLibrary> cann_;
  const int32_t device_id_;
  // Distinguishes devices in the per-thread record of the bound one
  // (addresses and context handles may be reused; serials are not).
  const uint64_t serial_;
  aclrtContext context_ = nullptr;
  // aclrtSetDevice succeeded: the destructor calls aclrtResetDevice.
  bool claimed_ = false;
  DeviceDescription description_;
  // Made once the capacity is known (Create); null before.
  std::unique_ptr<MemoryPool> memory_;
  // Page-locked staging memory: the cap; what is allocated (held by
  // transfers, or kept), and the kept blocks, oldest first.
  uint64_t staging_limit_ = 0;
  mutable absl::Mutex staging_mu_;
  mutable uint64_t staging_held_ ABSL_GUARDED_BY(staging_mu_) = 0;
  mutable std::vector<StagingBlock> staging_kept_ ABSL_GUARDED_BY(staging_mu_);
};

// The NPU ids --device=`kind` names, in order: "ascend" is {0},
// "ascend:0,2" {0, 2}. INVALID_ARGUMENT for anything else, or an id named
// twice.
absl::StatusOr<std::vector<int32_t>> AscendDeviceIds(absl::string_view kind);

// --device=ascend[:IDS] (devices/device_factory.cc): one AscendDevice per
// id options.kind names (AscendDeviceIds), in that order, on one CANN loaded
// from options.cann_libraries (CannLibrary::DefaultLibraries() when empty);
// options.memory_bytes caps each, and each keeps up to
// options.memory_cache_bytes cached (not a share: every NPU has its own
// memory). FAILED_PRECONDITION, one line naming the
// library or symbol, when CANN cannot be loaded, or naming the call when an NPU
// cannot be opened.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateAscendDevices(
    const DeviceOptions& options);

}  // namespace opserver::ascend

#endif  // OPSERVER_DEVICES_ASCEND_ASCEND_DEVICE_H_
