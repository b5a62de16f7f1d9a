#include "devices/device_factory.h"

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "devices/ascend/ascend_device.h"
#include "devices/cpu/cpu_device.h"

namespace opserver {
namespace {

struct DeviceKind {
  // The --device value, alone or before a colon and the kind's own
  // arguments ("ascend:0,1").
  absl::string_view name;
  absl::StatusOr<std::vector<std::unique_ptr<Device>>> (*create)(
      const DeviceOptions& options);
};

// Every device kind this build has, one line each; --device=cpu is the
// default (DeviceOptions).
constexpr DeviceKind kDeviceKinds[] = {
    {"cpu", &cpu::CreateCpuDevices},
    {"ascend", &ascend::CreateAscendDevices},
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateDevices(
    const DeviceOptions& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "threads must be >= 0 (0 = one per core), got ", options.threads));
  }
  for (const DeviceKind& kind : kDeviceKinds) {
    if (options.kind == kind.name ||
        absl::StartsWith(options.kind, absl::StrCat(kind.name, ":"))) {
      return kind.create(options);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", options.kind, "'; this build supports: ",
                   absl::StrJoin(kDeviceKinds, ", ",
                                 [](std::string* out, const DeviceKind& kind) {
                                   absl::StrAppend(out, kind.name);
                                 })));
}

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(
    const DeviceOptions& options) {
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Device>> devices,
                   CreateDevices(options));
  if (devices.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", options.kind, " names ", devices.size(),
                     " devices; one is wanted here"));
  }
  return std::move(devices.front());
}

}  // namespace opserver
