#ifndef OPSERVER_SERVER_DEVICE_FACTORY_H_
#define OPSERVER_SERVER_DEVICE_FACTORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/device.h"

namespace opserver {

// Creates the device named by --device. `threads` is the number of compute
// threads (0 = one per hardware thread); `memory_cache_bytes` caps freed
// device memory kept for reuse; `memory_bytes` is the device's capacity
// (0 = the device's safe default). Unknown kinds are INVALID_ARGUMENT naming
// the kinds this build supports.
absl::StatusOr<std::unique_ptr<Device>> CreateDevice(
    absl::string_view kind, int threads, uint64_t memory_cache_bytes,
    uint64_t memory_bytes = 0);

}  // namespace opserver

#endif  // OPSERVER_SERVER_DEVICE_FACTORY_H_
