#include "server/device_factory.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/cpu_device.h"

namespace opserver {

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(absl::string_view kind,
                                                     int threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be >= 0 (0 = one per core), got ", threads));
  }
  if (kind == "cpu") return std::make_unique<CpuDevice>(threads);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", kind, "'; this build supports: cpu"));
}

}  // namespace opserver
