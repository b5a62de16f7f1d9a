// The one place that names device kinds: makes the devices a server owns
// from --device and its flags.
#ifndef OPSERVER_DEVICES_DEVICE_FACTORY_H_
#define OPSERVER_DEVICES_DEVICE_FACTORY_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "devices/device.h"

namespace opserver {

// The devices `options` describe, index 0 first (what the server owns):
// options.kind names the kind ("cpu", or "ascend:0,1", a kind and what
// follows its colon), and the kind reads the options that apply to it.
// INVALID_ARGUMENT naming the kinds this build has for an unknown one, for
// negative threads, and for whatever the kind refuses (a --devices count
// the CPU cannot split its memory into, an NPU id list that does not
// parse); the kind's own error when its devices cannot be opened.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateDevices(
    const DeviceOptions& options);

// The same for a caller that wants exactly one device: INVALID_ARGUMENT
// when `options` name several.
absl::StatusOr<std::unique_ptr<Device>> CreateDevice(
    const DeviceOptions& options);

}  // namespace opserver

#endif  // OPSERVER_DEVICES_DEVICE_FACTORY_H_
