// The device layer: what the server asks of a device (Device, DeviceStream,
// DevicePlan), and nothing of any particular one. Each kind lives in a
// folder of its own next to this file (devices/cpu/, devices/ascend/) and
// is created by devices/device_factory.cc; session, service and pipeline
// code sees only this header.
#ifndef OPSERVER_DEVICES_DEVICE_H_
#define OPSERVER_DEVICES_DEVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/op_kind.h"
#include "kernels/op_spec.h"
#include "kernels/validate.h"

namespace opserver {

// What a device reports about itself (GetDeviceInfo).
struct DeviceDescription {
  std::string kind;  // The --device value that created it, e.g. "cpu".
  std::string name;  // Human-readable, e.g. the CPU model.
  // The capacity Allocate enforces (--device_memory_bytes).
  uint64_t memory_bytes = 0;
  uint32_t threads = 0;
};

// How a device is configured (--device and its flags; CreateDevice). A new
// kind of device reads the fields that apply to it and may add its own.
struct DeviceOptions {
  std::string kind = "cpu";
  // Compute threads (host threads driving the device); 0 = one per
  // hardware thread.
  int threads = 0;
  // Freed device memory kept for reuse (devices/memory_pool.h), counted in
  // the capacity: the cache gives way to new allocations. The CPU device
  // splits it between its logical devices (`devices`); each Ascend NPU
  // keeps this much of its own memory, as NPUs do not share memory.
  uint64_t memory_cache_bytes = 4ull << 30;
  // The capacity Allocate enforces; 0 = the device's safe default.
  uint64_t memory_bytes = 0;
  // Devices to make of this kind (CreateDevices; --devices). The CPU
  // device is split into this many logical devices: each gets
  // memory_bytes / devices (rounded down to whole 4 KiB pages) of capacity
  // and memory_cache_bytes / devices of reuse cache, and all share one pool
  // of `threads` compute threads. The Ascend device takes its devices from
  // the ids in `kind` (ascend:0,1,...) instead.
  int devices = 1;
  // The Ascend device (--device=ascend): CANN's libraries to load
  // (--cann_libraries); empty = CANN's own (ascend::CannLibrary).
  std::vector<std::string> cann_libraries;
  // The Ascend device: page-locked host memory (aclrtMallocHost) each NPU's
  // running transfers may stage through at once (--max_staging_bytes);
  // a transfer whose next staging buffer would go past it fails
  // RESOURCE_EXHAUSTED.
  uint64_t staging_bytes = 1ull << 30;
  // The largest chunk a transfer stages through (the server's --chunk_bytes
  // and --staging_chunk_bytes): staging_bytes must hold one transfer's.
  uint64_t staging_chunk_bytes = 4ull << 20;
};

class Device;

// A launch a device prepared (Device::Prepare; the aclOpExecutor of the
// API): the validated call, whose tensors' data are pointers into the
// device's memory, and whatever the device derived from it to launch it
// (the CPU device's iteration plan; a device that describes the call to
// its own library at launch, as the Ascend device does, keeps nothing
// more). An Executor holds one and each Execute launches it on a
// DeviceStream of the same device. Immutable once prepared, so a
// repeatable executor may be launched from several streams at once.
class DevicePlan {
 public:
  DevicePlan(const Device* device, kernels::ValidCall valid);
  virtual ~DevicePlan() = default;
  DevicePlan(const DevicePlan&) = delete;
  DevicePlan& operator=(const DevicePlan&) = delete;

  // The device that prepared it: only its streams may launch it.
  const Device* device() const { return device_; }
  const kernels::ValidCall& valid() const { return valid_; }
  const kernels::OpCall& call() const { return valid_.call; }
  // Bytes of workspace the launch needs: the opserver contract the client
  // computes itself (kernels::Validate), the same on every device.
  uint64_t workspace_size() const { return valid_.workspace_size; }
  // Elements of the output.
  int64_t numel() const { return numel_; }

 private:
  const Device* const device_;
  const kernels::ValidCall valid_;
  const int64_t numel_;
};

// A device's own form of a run of a graph's operations (runtime/graph.h),
// recorded once and replayed as one (CANN's aclmdlRI): made by
// Device::CaptureGraph, replayed by DeviceStream::ReplayGraph, released by
// destroying it. Whoever holds it destroys it only after the replays
// queued with it are done (after a Synchronize that followed them), and
// before the device and the plans and memory its operations use.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
};

class DeviceStream;

// A host-to-device transfer of a range of device memory that the host
// cannot address, in chunks, through host staging memory of the device's
// own (DeviceStream::StageUpload): the caller fills a chunk's staging
// buffer (receiving it from the network) and commits it; the device may
// copy it while the caller fills the next one, so that the two overlap. At
// most three chunks' staging memory is held at once. Made by a caller
// holding the stream, which issues nothing else on it until the transfer
// is destroyed (the transfer's copies run on it, or on streams of the
// device's own, possibly from threads of the device's own). Not
// thread-safe. Must not outlive its stream.
//
// A transfer that ends early (its sender failed) ends through End, which
// commits the chunk it was filling as far as it got: then device memory
// holds every byte received, as it would on a device the host addresses,
// where the bytes go straight into place.
class StagedUpload {
 public:
  // Waits for the copy in flight, drops those queued behind it, and frees
  // the staging memory: on every path, including an abandoned transfer.
  virtual ~StagedUpload() = default;
  // The staging memory of the next chunk (the range's chunks in order,
  // each `chunk` bytes, the last one shorter), once the copy that used it
  // before is done. The error of an earlier copy (the transfer has
  // failed), or OUT_OF_RANGE past the last chunk or after a short one.
  virtual absl::StatusOr<absl::Span<char>> Next() = 0;
  // Queues the copy of the chunk Next returned, its first `filled` bytes,
  // to its place, after the chunks committed before it. `filled` is the
  // chunk's size, or less for a transfer that ends here short (that chunk
  // is its last); INVALID_ARGUMENT past the chunk's size.
  virtual absl::Status Commit(uint64_t filled) = 0;
  // Waits until every committed chunk is in device memory: OK, or the
  // first copy's error.
  virtual absl::Status Finish() = 0;
  // Ends the transfer where it stands, on success or failure: commits the
  // first `filled` bytes of the chunk Next returned (0: no chunk is open,
  // or nothing is in it), then Finish.
  absl::Status End(uint64_t filled);
};

// What StagedUpload's implementations answer alike: Next's OUT_OF_RANGE
// once `moved` of the transfer's `size` bytes are moved (all of them, or
// up to a short chunk), and Commit's check of `filled` against the size of
// the chunk Next returned.
absl::Status StagedTransferEnded(uint64_t moved, uint64_t size);
absl::Status CheckStagedCommit(uint64_t filled, uint64_t chunk_size);

// The other direction (DeviceStream::StageDownload): the range's chunks in
// order, the copy of the next one running on the device while the caller
// sends this one. The same rules as StagedUpload.
class StagedDownload {
 public:
  virtual ~StagedDownload() = default;
  // The bytes of the next chunk, once copied from the device; valid until
  // the next call. The copy's error (the transfer has failed), or
  // OUT_OF_RANGE past the last chunk.
  virtual absl::StatusOr<absl::Span<const char>> Next() = 0;
};

// What CaptureGraph records: it issues the operations on the stream it is
// given (Launch, Memset, CopyOnDevice), in order; an error stops the
// capture.
using GraphIssuer = std::function<absl::Status(DeviceStream&)>;

// A device's in-order queue of operations (a CUDA device would wrap a
// cudaStream_t, an Ascend one an aclrtStream): the launches and transfers of
// one host-side Stream (runtime/stream.h) run on the device stream that
// Device::CreateStream made for it, in issue order. Operations on different
// device streams may run concurrently.
//
// Launch and the copies may return before the device has finished (an
// asynchronous device only enqueues them); Synchronize is the completion
// point. Whoever issues operations calls Synchronize before it treats them
// as done: before reading host memory a CopyFromDevice wrote, before
// reusing or releasing host memory a CopyToDevice reads, and before
// releasing device memory a launch uses. The host-side Stream does that
// for its tasks: a task (and the buffers and host memory it holds) counts
// as done only after a Synchronize that followed it. On a device whose
// asynchronous() is true it does not call Synchronize after every task but
// once per batch of consecutive tasks: when its queue runs dry, before a
// callback, gate or transfer that needs the device done, or after
// Stream::kMaxUnsynchronizedTasks tasks (runtime/stream.h). So launches
// follow each other on the device stream without a host wait between
// them, and one Synchronize's error stands for the whole batch. Operations
// a callback or transfer issues itself (holding the stream) start on a
// device stream with nothing of the tasks' outstanding.
//
// Not thread-safe: one caller at a time. The host-side Stream guarantees
// that (its thread, an inline task, or a transfer holding its gate). It may
// be destroyed after its host-side Stream, on that stream's thread, but
// never after its Device (SessionManager waits for its stream threads).
class DeviceStream {
 public:
  // Waits for the operations still outstanding (an asynchronous device),
  // so memory they use may be released after it; their errors are lost.
  virtual ~DeviceStream() = default;

  // Host -> device and device -> host copies of `bytes`, ordered after the
  // operations issued before them on this stream. `host_src` must stay
  // valid, and `host_dst` must not be read, until Synchronize returns. An
  // error here means the copy was not queued.
  virtual absl::Status CopyToDevice(void* device_dst, const void* host_src,
                                    uint64_t bytes) = 0;
  virtual absl::Status CopyFromDevice(void* host_dst, const void* device_src,
                                      uint64_t bytes) = 0;

  // Transfers of `size` bytes at device_dst / device_src in chunks of
  // `chunk` bytes (> 0) through staging memory (StagedUpload,
  // StagedDownload), for memory the host cannot address. The default
  // stages each chunk in host memory and copies it with CopyToDevice /
  // CopyFromDevice and Synchronize, one chunk after the other; a device
  // whose copies can overlap the caller's work overrides them.
  virtual std::unique_ptr<StagedUpload> StageUpload(void* device_dst,
                                                    uint64_t size,
                                                    uint64_t chunk);
  virtual std::unique_ptr<StagedDownload> StageDownload(const void* device_src,
                                                        uint64_t size,
                                                        uint64_t chunk);

  // Device-side fills and copies, ordered after the operations issued
  // before them like the copies above (aclrtMemsetAsync and a
  // device-to-device aclrtMemcpyAsync). Memset sets each of `bytes` bytes
  // at `dst` to `value & 0xff`. CopyOnDevice copies `bytes` from `src` to
  // `dst`, which may overlap (as memmove). Both pointers are device
  // pointers the caller checked (inside buffers it holds until
  // Synchronize returns). An error means the operation was not queued.
  virtual absl::Status Memset(void* dst, int value, uint64_t bytes) = 0;
  virtual absl::Status CopyOnDevice(void* dst, const void* src,
                                    uint64_t bytes) = 0;

  // Runs (or enqueues) `plan`, which this stream's device prepared, after
  // the operations issued before it. `workspace` holds at least
  // plan.workspace_size() bytes (`workspace_size` says how many); scratch
  // the device needs beyond that contract it allocates itself. INTERNAL
  // for a plan another device prepared. The plan stays alive until
  // Synchronize returns.
  virtual absl::Status Launch(const DevicePlan& plan, void* workspace,
                              uint64_t workspace_size) = 0;

  // Queues one run of `graph` (made by this stream's device's
  // CaptureGraph) after the operations issued before it, as one operation
  // (aclmdlRIExecuteAsync). UNIMPLEMENTED on a device without graphs;
  // INTERNAL for another device's graph. An error here means nothing was
  // queued; errors while it runs are Synchronize's, like a launch's.
  virtual absl::Status ReplayGraph(const DeviceGraph& graph) {
    return absl::UnimplementedError("this device has no graphs");
  }

  // Asks the launch running now, and every later one, to stop early with
  // CANCELLED: the host-side Stream calls it when it is cancelled (stream
  // destroyed, session closed, shutdown), after which nothing it runs
  // matters. The one call that may come from another thread than the
  // stream's user. A device that cannot stop a launch ignores it.
  virtual void CancelRunning() {}

  // While `on`, the operation running now (and any that starts) stops
  // early with CANCELLED where the device can stop it; once cleared, later
  // operations run as usual: the host-side Stream sets it when a task runs
  // past the session's operator execute time-out (aclrtSetOpExecuteTimeOut)
  // and clears it once the task ended. May come from another thread. A
  // device that cannot stop an operation ignores it (the task then ends in
  // its own time, and is still reported as timed out).
  virtual void SetInterrupted(bool /*on*/) {}

  // Blocks until every operation issued on this stream so far has finished,
  // and returns the first error one of them hit since the previous call (OK
  // if none). A synchronous device (the CPU device, whose operations are
  // complete when they return) returns OK at once. An asynchronous device
  // records an event on its stream and waits for it (cudaEventRecord +
  // cudaEventSynchronize; or cudaStreamSynchronize), turning a kernel's
  // asynchronous failure into the status returned here.
  virtual absl::Status Synchronize() = 0;

  // True for a device whose operations may still be running when they
  // return (and whose Synchronize may wait): the host-side Stream then
  // batches its Synchronize calls (see above). False, the default, for a
  // synchronous device (CpuDevice): the Stream synchronizes after each
  // task, as that costs nothing. A device that is asynchronous but leaves
  // this false stays correct, only slower.
  virtual bool asynchronous() const { return false; }
};

// One accelerator owned by the server. The RPC layer talks only to this
// interface, so further devices (CUDA, Ascend through CANN) slot in without
// touching it: a new kind implements Device and DeviceStream (and, if it
// plans launches ahead, DevicePlan) in a folder of its own and adds one
// line to devices/device_factory.cc.
// Implementations are thread-safe.
//
// Device memory is addressed by the pointers Allocate returns; the RPC layer
// never dereferences them itself (unless HostAddress says it may) but copies
// through a DeviceStream, and launches go through one too.
class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceDescription Describe() const = 0;
  // Freed memory the device keeps for reuse (for metrics); 0 if none.
  virtual uint64_t CachedBytes() const { return 0; }
  // What Allocate could still hand out now, in bytes (memory kept cached
  // for reuse counts as free when it gives way to new allocations): the
  // free memory GetServerStats reports per device, and aclrtGetMemInfo
  // with it. A snapshot; concurrent allocations change it at once.
  virtual uint64_t FreeBytes() const = 0;

  // At least `bytes` of device memory (0 is allowed) for `owner` (a session
  // serial; 0 = nobody in particular). RESOURCE_EXHAUSTED when the device's
  // capacity (DeviceDescription::memory_bytes) is used up. The memory never
  // shows bytes another owner wrote: it is zero unless `owner` (non-zero)
  // wrote it last.
  virtual absl::StatusOr<void*> Allocate(uint64_t bytes, uint64_t owner) = 0;
  virtual void Deallocate(void* block, uint64_t bytes) = 0;

  // GetWorkspaceSize's device half: prepares a launch of `valid` (a call
  // kernels::Validate passed, whose tensors' data are this device's
  // pointers) for this device's streams. The plan's workspace size is
  // valid.workspace_size, unchanged. An error reaches the client as it is
  // (its aclnn status in the payload). The default keeps the call as it
  // is, for a device that reads it at launch.
  virtual absl::StatusOr<std::unique_ptr<DevicePlan>> Prepare(
      kernels::ValidCall valid) const {
    return std::make_unique<DevicePlan>(this, std::move(valid));
  }

  // The largest launch, in output elements, that costs less to run on the
  // thread that received it (a Pipeline worker or an RPC thread, when its
  // stream is idle) than to hand to the stream's thread: below it the
  // hand-off (a wake-up, a context switch, a cache gone cold) costs more
  // than the work. The runtime counts a memset, copy or write as its bytes
  // / 4 against it, and lets a graph's replay run there within a multiple
  // of it (runtime/executor.h). 0, the default: nothing runs on the
  // receiving thread, every operation goes to its stream's thread.
  virtual int64_t inline_launch_elements() const { return 0; }

  // Whether the device can run `op`. ListOperators lists only the
  // operators it can, and planning one it cannot is refused (a device whose
  // operator library lacks some, such as an Ascend device whose aclnn
  // library has no aclnnXxx for it).
  virtual bool SupportsOp(kernels::OpKind op) const { return true; }

  // A new device stream. Every host-side Stream of a session owns one, and
  // Evaluate makes a transient one per call, so this is called per session,
  // per CreateStream RPC and per Evaluate. An error (RESOURCE_EXHAUSTED when
  // the device has no more streams, or the driver's status) is returned to
  // the client as is.
  virtual absl::StatusOr<std::unique_ptr<DeviceStream>> CreateStream() = 0;

  // Graphs (DeviceGraph). True when CaptureGraph makes them: the server
  // then captures each run of a graph's device work once, at definition,
  // and replays it with one ReplayGraph. False (the default; the CPU
  // device, whose operations cost nothing to issue), and the server runs
  // the graph's tasks one by one on each replay.
  virtual bool captures_graphs() const { return false; }
  // Records what `issue` issues on a stream of this device into a
  // DeviceGraph, without running it (aclmdlRICaptureBegin, the operations,
  // aclmdlRICaptureEnd on a stream of the capture's own). The error
  // `issue` returned, or the device's (the capture is then dropped);
  // UNIMPLEMENTED when the device cannot capture (captures_graphs() false,
  // or its runtime declined this capture), and the server then runs these
  // operations one by one on each replay. Thread-safe.
  virtual absl::StatusOr<std::unique_ptr<DeviceGraph>> CaptureGraph(
      const GraphIssuer& issue) {
    return absl::UnimplementedError("this device has no graphs");
  }
  // A line the server logs at start about how this device works, when it
  // takes a fallback its operator should know of (an Ascend device whose
  // CANN has no graph capture); empty for none.
  virtual std::string StartNotice() const { return ""; }

  // For devices whose memory the host can address directly (the CPU
  // device): the host address of `device_ptr`, so transfers can read and
  // write it in place without a staging copy through a DeviceStream (the
  // zero-copy path of Upload and Download). nullptr otherwise.
  virtual void* HostAddress(void* device_ptr) { return nullptr; }
};

}  // namespace opserver

#endif  // OPSERVER_DEVICES_DEVICE_H_
