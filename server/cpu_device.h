#ifndef OPSERVER_SERVER_CPU_DEVICE_H_
#define OPSERVER_SERVER_CPU_DEVICE_H_

#include <memory>

#include "server/device.h"

namespace opserver {

// The embedded default device: host memory and a pool of compute threads.
// Needs nothing installed.
class CpuDevice : public Device {
 public:
  // `threads` <= 0 means one per hardware thread.
  explicit CpuDevice(int threads);
  DeviceDescription Describe() const override;

 private:
  DeviceDescription description_;
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_CPU_DEVICE_H_
