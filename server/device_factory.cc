#include "server/device_factory.h"

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "devices/ascend/ascend_device.h"
#include "kernels/thread_pool.h"
#include "server/cpu_device.h"

namespace opserver {
namespace {

// The largest number of logical devices --devices may ask for: far more
// than anyone needs, and small enough that every share is a useful size.
constexpr int kMaxDevices = 64;

absl::Status CheckOptions(const DeviceOptions& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "threads must be >= 0 (0 = one per core), got ", options.threads));
  }
  if (options.kind != "cpu" && !ascend::IsAscendKind(options.kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown device '", options.kind,
                     "'; this build supports: cpu, ascend, ascend:N,M,..."));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(
    const DeviceOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (ascend::IsAscendKind(options.kind)) {
    return ascend::CreateAscendDevice(options);
  }
  return std::make_unique<CpuDevice>(
      options.threads, options.memory_cache_bytes, options.memory_bytes);
}

absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateDevices(
    const DeviceOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (ascend::IsAscendKind(options.kind)) {
    // NPUs are named, not split: ascend:0,1,2,3.
    if (options.devices != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "devices applies to cpu; name the NPUs instead (ascend:0,1,...), "
          "got devices ",
          options.devices));
    }
    return ascend::CreateAscendDevices(options);
  }
  if (options.devices < 1 || options.devices > kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "devices must be 1 to ", kMaxDevices, ", got ", options.devices));
  }
  const uint64_t count = static_cast<uint64_t>(options.devices);
  const uint64_t total = options.memory_bytes != 0
                             ? options.memory_bytes
                             : CpuDevice::DefaultMemoryBytes();
  constexpr uint64_t kPage = 4096;
  // Whole pages, so no share holds a partial page another could use.
  const uint64_t share = total / count / kPage * kPage;
  if (share == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory of ", total, " bytes cannot be split into ", count,
                     " devices of at least ", kPage, " bytes each"));
  }
  // One pool of compute threads for all logical devices: they are the same
  // cores, so a pool per device would run `devices` times as many compute
  // threads as cores whenever several devices are busy, and every launch
  // would slow down by the oversubscription. With one pool, a device alone
  // still gets every core, and busy devices share them; the pool takes
  // concurrent launches from many streams already (one device's streams
  // run concurrently on it today).
  auto compute = std::make_shared<kernels::ThreadPool>(
      CpuDevice::ResolveThreads(options.threads));
  std::vector<std::unique_ptr<Device>> devices;
  for (uint64_t i = 0; i < count; ++i) {
    devices.push_back(std::make_unique<CpuDevice>(
        compute, options.memory_cache_bytes / count, share));
  }
  return devices;
}

}  // namespace opserver
