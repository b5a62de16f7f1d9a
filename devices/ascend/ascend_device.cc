// AscendDevice: binding, memory, streams and graphs of one Ascend device,
// and --device=ascend's devices. Its plans are in ascend_plan.cc, its
// streams in ascend_stream.cc.
#include "devices/ascend/ascend_device.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "kernels/validate.h"

namespace opserver::ascend {
namespace {

// The device bound on this thread (AscendDevice::Bind): its serial, 0 for
// none.
thread_local uint64_t bound_serial = 0;
std::atomic<uint64_t> next_serial{1};

}  // namespace

std::string WithRecentError(const CannLibrary& cann) {
  std::string message = cann.RecentError();
  return message.empty() ? "" : absl::StrCat(": ", message);
}

absl::string_view AclnnName(kernels::OpKind op) {
  return kernels::OpRegistry()[static_cast<int>(op)].aclnn_name;
}

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
    uint64_t memory_cache_bytes, uint64_t staging_bytes) {
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
  device->staging_limit_ = staging_bytes;
  device->memory_ = std::make_unique<MemoryPool>(
      std::make_unique<Backing>(device.get()), memory_cache_bytes,
      d.memory_bytes,
      "--device_memory_bytes, or what aclrtGetMemInfo reported free");
  return device;
}

AscendDevice::~AscendDevice() {
  // The cached blocks go back to CANN while the context they were
  // allocated in still exists (the backing binds it); so do the kept
  // staging blocks (every transfer has given its own back).
  memory_.reset();
  {
    absl::MutexLock lock(&staging_mu_);
    FreeStaging(staging_kept_);
    staging_kept_.clear();
  }
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

absl::StatusOr<void*> AscendDevice::TakeKeptOrReserve(
    uint64_t bytes, std::vector<StagingBlock>* evicted) const {
  absl::MutexLock lock(&staging_mu_);
  // The newest kept block of this size: the likeliest still warm.
  for (size_t i = staging_kept_.size(); i-- > 0;) {
    if (staging_kept_[i].bytes != bytes) continue;
    void* block = staging_kept_[i].block;
    staging_kept_.erase(staging_kept_.begin() + i);
    return block;
  }
  auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(staging_mu_) {
    return bytes <= staging_limit_ && staging_held_ <= staging_limit_ - bytes;
  };
  // Kept blocks give way to a transfer that needs the room.
  if (!fits()) {
    for (const StagingBlock& kept : staging_kept_) {
      staging_held_ -= kept.bytes;
    }
    evicted->swap(staging_kept_);
  }
  if (!fits()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "transfer staging: ", bytes,
        " more bytes of page-locked memory would pass the device's cap of ",
        staging_limit_, " (--max_staging_bytes), with ", staging_held_,
        " held by the transfers running now; try again once fewer run"));
  }
  // Reserved before aclrtMallocHost, so transfers starting together cannot
  // all pass.
  staging_held_ += bytes;
  return nullptr;
}

absl::StatusOr<void*> AscendDevice::AllocateHost(uint64_t bytes) const {
  std::vector<StagingBlock> evicted;
  absl::StatusOr<void*> kept = TakeKeptOrReserve(bytes, &evicted);
  FreeStaging(evicted);
  if (!kept.ok() || *kept != nullptr) return kept;
  void* block = nullptr;
  absl::Status bound = Bind();
  aclError error = ACL_SUCCESS;
  if (bound.ok()) error = cann_->api().aclrtMallocHost(&block, bytes);
  if (bound.ok() && error == ACL_SUCCESS && block != nullptr) return block;
  {
    absl::MutexLock lock(&staging_mu_);
    staging_held_ -= bytes;
  }
  RETURN_IF_ERROR(bound);
  return absl::ResourceExhaustedError(
      absl::StrCat("aclrtMallocHost of ", bytes,
                   " bytes (transfer staging) failed with "
                   "acl error ",
                   error, WithRecentError(*cann_)));
}

void AscendDevice::FreeHost(void* block, uint64_t bytes) const {
  std::vector<StagingBlock> evicted;
  {
    absl::MutexLock lock(&staging_mu_);
    staging_kept_.push_back({block, bytes});
    if (staging_kept_.size() > kKeptStagingBlocks) {
      evicted.push_back(staging_kept_.front());
      staging_kept_.erase(staging_kept_.begin());
      staging_held_ -= evicted.front().bytes;
    }
  }
  FreeStaging(evicted);
}

size_t AscendDevice::KeptStagingBlocks() const {
  absl::MutexLock lock(&staging_mu_);
  return staging_kept_.size();
}

void AscendDevice::FreeStaging(const std::vector<StagingBlock>& blocks) const {
  if (blocks.empty()) return;
  // Freed even if binding failed: aclrtFreeHost reports the error, which
  // has no one to go to.
  (void)Bind();
  for (const StagingBlock& staging : blocks) {
    cann_->api().aclrtFreeHost(staging.block);
  }
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
  // Checked before CANN is loaded: a cap no transfer fits is a mistake in
  // the flags, whatever the machine has.
  const uint64_t one_transfer =
      kStagingChunksPerTransfer * options.staging_chunk_bytes;
  if (options.staging_bytes < one_transfer) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_staging_bytes (", options.staging_bytes,
                     ") must hold one transfer's ", kStagingChunksPerTransfer,
                     " staging chunks of the larger of --chunk_bytes and "
                     "--staging_chunk_bytes: at least ",
                     one_transfer));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<CannLibrary> cann,
                   CannLibrary::Load(options.cann_libraries.empty()
                                         ? CannLibrary::DefaultLibraries()
                                         : options.cann_libraries));
  std::vector<std::unique_ptr<Device>> devices;
  for (int32_t id : ids) {
    ASSIGN_OR_RETURN(std::unique_ptr<AscendDevice> device,
                     AscendDevice::Create(cann, id, options.memory_bytes,
                                          options.memory_cache_bytes,
                                          options.staging_bytes));
    devices.push_back(std::move(device));
  }
  return devices;
}

}  // namespace opserver::ascend
