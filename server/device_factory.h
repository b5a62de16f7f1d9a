#ifndef OPSERVER_SERVER_DEVICE_FACTORY_H_
#define OPSERVER_SERVER_DEVICE_FACTORY_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/device.h"

namespace opserver {

// Creates the device `options.kind` names. INVALID_ARGUMENT naming the
// kinds this build supports for an unknown kind, or for negative threads.
// A new device kind adds its files and one line here; nothing else in the
// server changes.
absl::StatusOr<std::unique_ptr<Device>> CreateDevice(
    const DeviceOptions& options);

// The `options.devices` devices of kind `options.kind`, index 0 first (what
// the server owns). INVALID_ARGUMENT as for CreateDevice, and for a count
// below 1 or one the kind cannot split its memory into (each device needs
// at least one page).
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateDevices(
    const DeviceOptions& options);

}  // namespace opserver

#endif  // OPSERVER_SERVER_DEVICE_FACTORY_H_
