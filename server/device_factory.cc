#include "server/device_factory.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "devices/ascend/ascend_device.h"
#include "server/cpu_device.h"

namespace opserver {

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(
    const DeviceOptions& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "threads must be >= 0 (0 = one per core), got ", options.threads));
  }
  if (options.kind == "cpu") {
    return std::make_unique<CpuDevice>(
        options.threads, options.memory_cache_bytes, options.memory_bytes);
  }
  if (ascend::IsAscendKind(options.kind)) {
    return ascend::CreateAscendDevice(options);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", options.kind,
                   "'; this build supports: cpu, ascend, ascend:N"));
}

}  // namespace opserver
