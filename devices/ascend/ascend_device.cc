#include "devices/ascend/ascend_device.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "common/thread_start.h"
#include "common/values.h"
#include "kernels/aclnn_status.h"
#include "kernels/op_signatures.h"
#include "kernels/tensor.h"
#include "kernels/validate.h"

namespace opserver::ascend {
namespace {

using kernels::OpKind;

// The device bound on this thread (AscendDevice::Bind): its serial, 0 for
// none.
thread_local uint64_t bound_serial = 0;
std::atomic<uint64_t> next_serial{1};

std::string WithRecentError(const CannLibrary& cann) {
  std::string message = cann.RecentError();
  return message.empty() ? "" : absl::StrCat(": ", message);
}

absl::string_view AclnnName(OpKind op) {
  return kernels::OpRegistry()[static_cast<int>(op)].aclnn_name;
}

// aclCreateTensor's storage shape for `view`: the one the caller gave, or
// the smallest 1-D storage that holds every element (from view.data).
std::vector<int64_t> StorageDims(const kernels::TensorView& view) {
  if (!view.storage_shape.empty()) return view.storage_shape;
  int64_t max_element = -1;
  // The view was validated when it was planned; a failure here cannot
  // happen, and would leave the empty storage below for CANN to refuse.
  if (!kernels::CheckTensorLayout(view, "tensor", &max_element).ok()) {
    return {0};
  }
  return {max_element + 1};
}

// One element of the scalar's own dtype, as aclCreateScalar reads it.
absl::StatusOr<std::string> ScalarBytes(const kernels::Scalar& scalar) {
  const double value = kernels::IsFloating(scalar.dtype)
                           ? scalar.f
                           : static_cast<double>(scalar.i);
  return EncodeValues(scalar.dtype, absl::MakeConstSpan(&value, 1));
}

// An operator's parameters as its aclnn function takes them, by the kinds
// of the signature table (kernels/op_signatures.h): FLOAT and SCALAR as
// aclScalar objects made by `make` (the plan's, destroyed with it), DOUBLE
// and BOOL as they are.
struct ScalarArgs {
  std::function<absl::Status(void*, aclDataType, aclScalar**)> make;

  absl::StatusOr<aclScalar*> FLOAT(double value) const {
    float f = static_cast<float>(value);
    aclScalar* out = nullptr;
    RETURN_IF_ERROR(make(&f, ACL_FLOAT, &out));
    return out;
  }
  absl::StatusOr<aclScalar*> SCALAR(const kernels::Scalar& value) const {
    ASSIGN_OR_RETURN(std::string bytes, ScalarBytes(value));
    aclScalar* out = nullptr;
    RETURN_IF_ERROR(
        make(bytes.data(), static_cast<aclDataType>(value.dtype), &out));
    return out;
  }
  absl::StatusOr<double> DOUBLE(double value) const { return value; }
  absl::StatusOr<bool> BOOL(bool value) const { return value; }
};

}  // namespace

absl::Status AclError(const CannLibrary& cann, absl::string_view call,
                      aclError error) {
  return kernels::AclnnError(kernels::kAclnnErrRuntimeError,
                             absl::StatusCode::kInternal,
                             absl::StrCat(call, " failed with acl error ",
                                          error, WithRecentError(cann)));
}

absl::Status AclnnFailure(const CannLibrary& cann, absl::string_view call,
                          aclnnStatus status) {
  const bool parameter = status == kernels::kAclnnErrParamNullptr ||
                         status == kernels::kAclnnErrParamInvalid;
  std::string message = cann.RecentError();
  return kernels::AclnnError(
      status,
      parameter ? absl::StatusCode::kInvalidArgument
                : absl::StatusCode::kInternal,
      message.empty() ? absl::StrCat(call, " failed with aclnn status ", status)
                      : absl::StrCat(call, ": ", message));
}

// ---- AscendDevice ----------------------------------------------------------

class AscendDevice::Backing : public MemoryBacking {
 public:
  explicit Backing(AscendDevice* device) : device_(device) {}

  absl::StatusOr<void*> Map(uint64_t size) override {
    RETURN_IF_ERROR(device_->Bind());
    const CannLibrary& cann = *device_->cann_;
    void* block = nullptr;
    if (aclError error =
            cann.api().aclrtMalloc(&block, size, ACL_MEM_MALLOC_HUGE_FIRST);
        error != ACL_SUCCESS || block == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("aclrtMalloc of ", size, " bytes failed with acl error ",
                       error, WithRecentError(cann)));
    }
    return block;
  }

  void Unmap(void* block, uint64_t /*size*/) override {
    // Freed even if binding failed: aclrtFree reports the error, which has
    // no one to go to.
    (void)device_->Bind();
    device_->cann_->api().aclrtFree(block);
  }

  absl::Status Zero(void* block, uint64_t size) override {
    RETURN_IF_ERROR(device_->Bind());
    return device_->Zero(block, size);
  }

  // aclrtMalloc does not initialize memory (CANN's documentation says to
  // aclrtMemset it before use).
  bool FreshIsZero() const override { return false; }
  uint64_t granule() const override { return kGranule; }

 private:
  AscendDevice* const device_;
};

AscendDevice::AscendDevice(std::shared_ptr<CannLibrary> cann, int32_t device_id)
    : cann_(std::move(cann)),
      device_id_(device_id),
      serial_(next_serial.fetch_add(1)) {}

absl::StatusOr<std::unique_ptr<AscendDevice>> AscendDevice::Create(
    std::shared_ptr<CannLibrary> cann, int32_t device_id, uint64_t memory_bytes,
    uint64_t memory_cache_bytes) {
  const CannApi& api = cann->api();
  std::unique_ptr<AscendDevice> device(
      new AscendDevice(std::move(cann), device_id));
  // aclrtSetDevice claims the device (aclrtResetDevice in the destructor
  // gives it back) and makes its default context current here.
  if (aclError error = api.aclrtSetDevice(device_id); error != ACL_SUCCESS) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Ascend device ", device_id, ": aclrtSetDevice failed with acl error ",
        error, WithRecentError(*device->cann_)));
  }
  // Set from here on: the destructor resets the device.
  device->claimed_ = true;
  if (api.has_contexts()) {
    aclrtContext context = nullptr;
    if (aclError error = api.aclrtCreateContext(&context, device_id);
        error != ACL_SUCCESS) {
      return absl::FailedPreconditionError(
          absl::StrCat("Ascend device ", device_id,
                       ": aclrtCreateContext failed with acl error ", error,
                       WithRecentError(*device->cann_)));
    }
    device->context_ = context;
  }
  bound_serial = 0;
  if (absl::Status s = device->Bind(); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Ascend device ", device_id, ": ", s.message()));
  }
  size_t free = 0, total = 0;
  if (aclError error = api.aclrtGetMemInfo(ACL_HBM_MEM, &free, &total);
      error != ACL_SUCCESS) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Ascend device ", device_id, ": aclrtGetMemInfo failed with acl error ",
        error, WithRecentError(*device->cann_)));
  }
  const char* soc = api.aclrtGetSocName();
  DeviceDescription& d = device->description_;
  d.kind = "ascend";
  d.name = absl::StrCat(soc != nullptr && *soc != '\0' ? soc : "unknown SoC",
                        " (NPU ", device_id, ")");
  // What CANN has free now bounds everything: the flag may only lower it.
  d.memory_bytes = memory_bytes != 0 ? std::min<uint64_t>(memory_bytes, free)
                                     : static_cast<uint64_t>(free);
  d.threads = 0;
  device->memory_ = std::make_unique<MemoryPool>(
      std::make_unique<Backing>(device.get()), memory_cache_bytes,
      d.memory_bytes,
      "--device_memory_bytes, or what aclrtGetMemInfo reported free");
  return device;
}

AscendDevice::~AscendDevice() {
  // The cached blocks go back to CANN while the context they were
  // allocated in still exists (the backing binds it).
  memory_.reset();
  const CannApi& api = cann_->api();
  if (context_ != nullptr) {
    api.aclrtDestroyContext(context_);
  }
  if (claimed_) api.aclrtResetDevice(device_id_);
  // The thread's binding named this device, whose context is gone.
  bound_serial = 0;
}

absl::Status AscendDevice::Bind() const {
  if (bound_serial == serial_) return absl::OkStatus();
  const CannApi& api = cann_->api();
  if (context_ != nullptr) {
    if (aclError error = api.aclrtSetCurrentContext(context_);
        error != ACL_SUCCESS) {
      return AclError(*cann_, "aclrtSetCurrentContext", error);
    }
  } else if (aclError error = api.aclrtSetDevice(device_id_);
             error != ACL_SUCCESS) {
    return AclError(*cann_, "aclrtSetDevice", error);
  }
  bound_serial = serial_;
  return absl::OkStatus();
}

DeviceDescription AscendDevice::Describe() const { return description_; }

uint64_t AscendDevice::CachedBytes() const { return memory_->cached_bytes(); }

uint64_t AscendDevice::FreeBytes() const {
  return description_.memory_bytes -
         std::min(description_.memory_bytes, memory_->in_use_bytes());
}

absl::StatusOr<void*> AscendDevice::AllocateHost(uint64_t bytes) const {
  RETURN_IF_ERROR(Bind());
  void* block = nullptr;
  if (aclError error = cann_->api().aclrtMallocHost(&block, bytes);
      error != ACL_SUCCESS || block == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("aclrtMallocHost of ", bytes,
                     " bytes (transfer staging) failed with "
                     "acl error ",
                     error, WithRecentError(*cann_)));
  }
  return block;
}

void AscendDevice::FreeHost(void* block) const {
  // Freed even if binding failed: aclrtFreeHost reports the error, which
  // has no one to go to.
  (void)Bind();
  cann_->api().aclrtFreeHost(block);
}

absl::StatusOr<void*> AscendDevice::AllocateRaw(uint64_t bytes) {
  // Counted in the pool's capacity, which trims its cache to make room.
  RETURN_IF_ERROR(memory_->Reserve(bytes));
  if (absl::Status s = Bind(); !s.ok()) {
    memory_->Unreserve(bytes);
    return s;
  }
  void* block = nullptr;
  // aclrtMalloc refuses 0 bytes; a 0-byte buffer still needs an address.
  const size_t size = bytes == 0 ? 1 : static_cast<size_t>(bytes);
  if (aclError error =
          cann_->api().aclrtMalloc(&block, size, ACL_MEM_MALLOC_HUGE_FIRST);
      error != ACL_SUCCESS || block == nullptr) {
    memory_->Unreserve(bytes);
    return absl::ResourceExhaustedError(
        absl::StrCat("aclrtMalloc of ", bytes, " bytes failed with acl error ",
                     error, WithRecentError(*cann_)));
  }
  return block;
}

void AscendDevice::FreeRaw(void* block, uint64_t bytes) {
  if (block == nullptr) return;
  // Freed even if binding failed: aclrtFree reports the error, which has
  // no one to go to.
  (void)Bind();
  cann_->api().aclrtFree(block);
  // After the free, so that the capacity it gives back is free in CANN.
  memory_->Unreserve(bytes);
}

absl::Status AscendDevice::Zero(void* block, uint64_t bytes) {
  const CannApi& api = cann_->api();
  if (bytes == 0) return absl::OkStatus();
  if (api.has_memset()) {
    if (aclError error = api.aclrtMemset(block, bytes, 0, bytes);
        error != ACL_SUCCESS) {
      return AclError(*cann_, "aclrtMemset", error);
    }
    return absl::OkStatus();
  }
  // No aclrtMemset in the loaded runtime: copy zeros from the host.
  static const std::vector<char>* const zeros =
      new std::vector<char>(1 << 20, 0);
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min<uint64_t>(zeros->size(), bytes - done);
    if (aclError error =
            api.aclrtMemcpy(static_cast<char*>(block) + done, bytes - done,
                            zeros->data(), n, ACL_MEMCPY_HOST_TO_DEVICE);
        error != ACL_SUCCESS) {
      return AclError(*cann_, "aclrtMemcpy (zeroing)", error);
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> AscendDevice::Allocate(uint64_t bytes, uint64_t owner) {
  return memory_->Allocate(bytes, owner);
}

void AscendDevice::Deallocate(void* block, uint64_t bytes) {
  memory_->Deallocate(block, bytes);
}

absl::StatusOr<std::unique_ptr<DeviceStream>> AscendDevice::CreateStream() {
  RETURN_IF_ERROR(Bind());
  aclrtStream stream = nullptr;
  if (aclError error = cann_->api().aclrtCreateStream(&stream);
      error != ACL_SUCCESS) {
    return AclError(*cann_, "aclrtCreateStream", error);
  }
  return std::make_unique<AscendStream>(this, stream);
}

absl::StatusOr<std::unique_ptr<DeviceGraph>> AscendDevice::CaptureGraph(
    const GraphIssuer& issue) {
  if (!captures_graphs()) {
    return absl::UnimplementedError(
        "the loaded CANN has no graph capture (aclmdlRI)");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceStream> stream, CreateStream());
  ASSIGN_OR_RETURN(std::unique_ptr<AscendGraph> graph,
                   static_cast<AscendStream&>(*stream).Capture(issue));
  return graph;
}

std::string AscendDevice::StartNotice() const {
  if (captures_graphs()) return "";
  return absl::StrCat(
      "Ascend device ", device_id_,
      ": the loaded CANN has no graph capture (aclmdlRICaptureBegin, "
      "aclmdlRICaptureEnd, aclmdlRIExecuteAsync, aclmdlRIDestroy and "
      "aclrtMemsetAsync): graphs are replayed task by task");
}

// ---- AscendGraph -----------------------------------------------------------

AscendGraph::~AscendGraph() {
  // Released even if binding failed: aclmdlRIDestroy reports the error,
  // which has no one to go to.
  (void)device_->Bind();
  device_->cann().api().aclmdlRIDestroy(model_);
  for (auto [block, bytes] : scratch_) device_->FreeRaw(block, bytes);
}

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

  // Queues the next chunk's copy. A range of one chunk is copied here.
  absl::Status Queue() {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(error_);
    const uint64_t k = queued_++;
    if (count_ == 1) {
      mu_.Unlock();
      absl::Status copied = Copy(k);
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
  uint64_t Bytes(uint64_t k) const {
    return std::min(chunk_, size_ - k * chunk_);
  }

  // Chunk k between its staging buffer and device memory, done when this
  // returns (one staging buffer per chunk in flight, so the stream is
  // synchronized before it is reused).
  absl::Status Copy(uint64_t k) {
    char* device = device_base_ + k * chunk_;
    char* host = buffers_[k % 2];
    RETURN_IF_ERROR(upload_ ? stream_->CopyToDevice(device, host, Bytes(k))
                            : stream_->CopyFromDevice(host, device, Bytes(k)));
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
      mu_.Unlock();
      absl::Status copied = Copy(k);
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
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status AllMoved(uint64_t size) {
  return absl::OutOfRangeError(
      absl::StrCat("the staged transfer's ", size, " bytes are all moved"));
}

class AscendStagedUpload : public StagedUpload {
 public:
  AscendStagedUpload(AscendDevice* device, AscendStream* stream, char* dst,
                     uint64_t size, uint64_t chunk)
      : size_(size), copier_(device, stream, true, dst, size, chunk) {}

  absl::StatusOr<absl::Span<char>> Next() override {
    const uint64_t k = copier_.queued();
    if (k == copier_.count()) return AllMoved(size_);
    // Chunk k - 2 left buffer k % 2.
    RETURN_IF_ERROR(copier_.WaitCopied(k < 2 ? 0 : k - 1));
    return copier_.Buffer(k);
  }
  absl::Status Commit() override { return copier_.Queue(); }
  absl::Status Finish() override {
    return copier_.WaitCopied(copier_.queued());
  }

 private:
  const uint64_t size_;
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
    if (k == copier_.count()) return AllMoved(size_);
    // The caller is done with chunk k - 1: its buffer takes chunk k + 1,
    // copied while the caller sends chunk k.
    for (uint64_t next = copier_.queued(); next <= k + 1; ++next) {
      if (next == copier_.count()) break;
      RETURN_IF_ERROR(copier_.Buffer(next).status());
      RETURN_IF_ERROR(copier_.Queue());
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

AscendPlan::AscendPlan(const AscendDevice* device, kernels::ValidCall valid)
    : DevicePlan(device, std::move(valid)), device_(device) {}

AscendPlan::~AscendPlan() {
  absl::MutexLock lock(&mu_);
  if (tensors_.empty() && scalars_.empty() && executor_ == nullptr) return;
  // Destroyed where the last owner lets go (a stream or RPC thread): bound
  // first, as every CANN call is. A failed bind has no one to report to.
  (void)device_->Bind();
  DestroyLocked();
}

aclnnStatus AscendPlan::Launch(void* workspace, uint64_t workspace_size,
                               aclrtStream stream) const {
  const CannApi::OpFunctions& functions =
      device_->cann().api().ops[static_cast<int>(call().op)];
  absl::MutexLock lock(&mu_);
  return reinterpret_cast<decltype(&::aclnnThresholdBackward)>(
      functions.launch)(workspace, workspace_size, executor_, stream);
}

absl::StatusOr<uint64_t> AscendPlan::Planned() const {
  absl::MutexLock lock(&mu_);
  if (executor_ != nullptr) return aclnn_workspace_size_;
  if (absl::Status s = PlanLocked(); !s.ok()) {
    // Nothing half-made stays: the next launch plans again.
    DestroyLocked();
    return s;
  }
  return aclnn_workspace_size_;
}

void AscendPlan::DestroyLocked() const {
  const CannApi& api = device_->cann().api();
  for (aclTensor* tensor : tensors_) api.aclDestroyTensor(tensor);
  for (aclScalar* scalar : scalars_) api.aclDestroyScalar(scalar);
  if (executor_ != nullptr) api.aclDestroyAclOpExecutor(executor_);
  tensors_.clear();
  scalars_.clear();
  executor_ = nullptr;
}

absl::Status AscendPlan::PlanLocked() const {
  const AscendPlan* const plan = this;
  const kernels::OpCall& call = this->call();
  const CannLibrary& cann = device_->cann();
  const CannApi& api = cann.api();
  const absl::string_view name = AclnnName(call.op);
  if (!api.has_op(call.op)) {
    return kernels::AclnnError(
        kernels::kAclnnErrRuntimeError, absl::StatusCode::kUnimplemented,
        absl::StrCat(name, " is not in the loaded CANN libraries"));
  }

  // Every object made here is the plan's, destroyed with it.
  auto tensor = [&](const std::optional<kernels::TensorView>& view,
                    aclTensor** out) -> absl::Status {
    const std::vector<int64_t> strides = kernels::EffectiveStrides(*view);
    const std::vector<int64_t> storage = StorageDims(*view);
    aclTensor* t = api.aclCreateTensor(
        view->shape.data(), view->shape.size(),
        static_cast<aclDataType>(view->dtype), strides.data(), view->offset,
        ACL_FORMAT_ND, storage.data(), storage.size(), view->data);
    if (t == nullptr) {
      return kernels::AclnnError(
          kernels::kAclnnErrInnerNullptr, absl::StatusCode::kInternal,
          absl::StrCat("aclCreateTensor returned NULL", WithRecentError(cann)));
    }
    plan->tensors_.push_back(t);
    *out = t;
    return absl::OkStatus();
  };
  auto scalar = [&](void* value, aclDataType dtype,
                    aclScalar** out) -> absl::Status {
    aclScalar* s = api.aclCreateScalar(value, dtype);
    if (s == nullptr) {
      return kernels::AclnnError(
          kernels::kAclnnErrInnerNullptr, absl::StatusCode::kInternal,
          absl::StrCat("aclCreateScalar returned NULL", WithRecentError(cann)));
    }
    plan->scalars_.push_back(s);
    *out = s;
    return absl::OkStatus();
  };
  // A validated call has all three tensors (for DropoutBackward, `self` is
  // the mask; for SoftshrinkBackward, `out` is gradInput).
  aclTensor *grad = nullptr, *self = nullptr, *out = nullptr;
  RETURN_IF_ERROR(tensor(call.grad_output, &grad));
  RETURN_IF_ERROR(tensor(call.self, &self));
  RETURN_IF_ERROR(tensor(call.out, &out));

  const CannApi::OpFunctions& functions = api.ops[static_cast<int>(call.op)];
  uint64_t needed = 0;
  aclOpExecutor* executor = nullptr;
  aclnnStatus status = ACLNN_SUCCESS;
  // One case per operator, generated from the signature table: the two
  // inputs, the parameters as aclnn takes them, the output. A signature
  // that differs from its aclnnop/ header does not compile.
  ScalarArgs args{scalar};
  switch (call.op) {
#define OPSERVER_ASCEND_MAKE(KIND, name, field)    \
  const auto field = args.KIND(call.params.field); \
  if (!field.ok()) return field.status();
#define OPSERVER_ASCEND_PASS(KIND, name, field) , *field
#define OPSERVER_ASCEND_CASE(Name, in0, in1, out_name, PARAMS)                 \
  case OpKind::k##Name: {                                                      \
    PARAMS(OPSERVER_ASCEND_MAKE)                                               \
    status = reinterpret_cast<decltype(&::aclnn##Name##GetWorkspaceSize)>(     \
        functions.get_workspace_size)(grad, self PARAMS(OPSERVER_ASCEND_PASS), \
                                      out, &needed, &executor);                \
    break;                                                                     \
  }
    OPSERVER_OPERATORS(OPSERVER_ASCEND_CASE)
#undef OPSERVER_ASCEND_CASE
#undef OPSERVER_ASCEND_PASS
#undef OPSERVER_ASCEND_MAKE
  }
  const std::string plan_call = absl::StrCat(name, "GetWorkspaceSize");
  if (status != ACLNN_SUCCESS) return AclnnFailure(cann, plan_call, status);
  if (executor == nullptr) {
    return kernels::AclnnError(
        kernels::kAclnnErrInnerNullptr, absl::StatusCode::kInternal,
        absl::StrCat(plan_call, " returned no executor"));
  }
  // Repeatable, so that it is ours to destroy whether it is launched once,
  // many times or never (a single-use executor is released by CANN only
  // when it runs), and so that every launch of a repeatable opserver
  // executor reuses it.
  if (aclnnStatus s = api.aclSetAclOpExecutorRepeatable(executor);
      s != ACLNN_SUCCESS) {
    return AclnnFailure(cann, "aclSetAclOpExecutorRepeatable", s);
  }
  plan->executor_ = executor;
  plan->aclnn_workspace_size_ = needed;
  return absl::OkStatus();
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

// ---- --device=ascend -------------------------------------------------------

absl::StatusOr<std::vector<int32_t>> AscendDeviceIds(absl::string_view kind) {
  if (kind == "ascend") return std::vector<int32_t>{0};
  std::vector<int32_t> ids;
  for (absl::string_view id :
       absl::StrSplit(absl::StripPrefix(kind, "ascend:"), ',')) {
    int32_t n = 0;
    if (!absl::SimpleAtoi(id, &n) || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", kind,
          "': want ascend, or ascend:IDS with IDS NPU ids >= 0 separated by "
          "commas"));
    }
    if (std::find(ids.begin(), ids.end(), n) != ids.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", kind, "' names NPU ", n, " twice"));
    }
    ids.push_back(n);
  }
  return ids;
}

absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateAscendDevices(
    const DeviceOptions& options) {
  // NPUs are named, not split.
  if (options.devices != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "devices applies to cpu; name the NPUs instead (ascend:0,1,...), "
        "got devices ",
        options.devices));
  }
  ASSIGN_OR_RETURN(const std::vector<int32_t> ids,
                   AscendDeviceIds(options.kind));
  ASSIGN_OR_RETURN(std::shared_ptr<CannLibrary> cann,
                   CannLibrary::Load(options.cann_libraries.empty()
                                         ? CannLibrary::DefaultLibraries()
                                         : options.cann_libraries));
  std::vector<std::unique_ptr<Device>> devices;
  for (int32_t id : ids) {
    ASSIGN_OR_RETURN(std::unique_ptr<AscendDevice> device,
                     AscendDevice::Create(cann, id, options.memory_bytes,
                                          options.memory_cache_bytes));
    devices.push_back(std::move(device));
  }
  return devices;
}

}  // namespace opserver::ascend
