#include "server/device_factory.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/cpu_device.h"

namespace opserver {

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(
    absl::string_view kind, int threads, uint64_t memory_cache_bytes,
    uint64_t memory_bytes) {
  if (threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be >= 0 (0 = one per core), got ", threads));
  }
  if (kind == "cpu")
    return std::make_unique<CpuDevice>(threads, memory_cache_bytes,
                                       memory_bytes);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", kind, "'; this build supports: cpu"));
}

}  // namespace opserver
