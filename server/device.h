#ifndef OPSERVER_SERVER_DEVICE_H_
#define OPSERVER_SERVER_DEVICE_H_

#include <cstdint>
#include <string>

namespace opserver {

// What a device reports about itself (GetDeviceInfo).
struct DeviceDescription {
  std::string kind;  // The --device value that created it, e.g. "cpu".
  std::string name;  // Human-readable, e.g. the CPU model.
  uint64_t memory_bytes = 0;
  uint32_t threads = 0;
};

// One accelerator owned by the server. The RPC layer talks only to this
// interface, so further devices (CUDA, Ascend through CANN) slot in without
// touching it. Implementations are thread-safe.
class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceDescription Describe() const = 0;
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_DEVICE_H_
