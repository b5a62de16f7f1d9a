#ifndef OPSERVER_SERVER_DEVICE_H_
#define OPSERVER_SERVER_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops.h"

namespace opserver {

// What a device reports about itself (GetDeviceInfo).
struct DeviceDescription {
  std::string kind;  // The --device value that created it, e.g. "cpu".
  std::string name;  // Human-readable, e.g. the CPU model.
  // The capacity Allocate enforces (--device_memory_bytes).
  uint64_t memory_bytes = 0;
  uint32_t threads = 0;
};

// How a device is configured (--device and its flags; CreateDevice). A new
// kind of device reads the fields that apply to it and may add its own.
struct DeviceOptions {
  std::string kind = "cpu";
  // Compute threads (host threads driving the device); 0 = one per
  // hardware thread.
  int threads = 0;
  // Freed device memory kept for reuse.
  uint64_t memory_cache_bytes = 4ull << 30;
  // The capacity Allocate enforces; 0 = the device's safe default.
  uint64_t memory_bytes = 0;
};

// One accelerator owned by the server. The RPC layer talks only to this
// interface, so further devices (CUDA, Ascend through CANN) slot in without
// touching it. Implementations are thread-safe.
//
// Device memory is addressed by the pointers Allocate returns; the RPC layer
// never dereferences them itself but goes through CopyToDevice /
// CopyFromDevice, and Launch receives plans whose tensor data pointers are
// device pointers.
class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceDescription Describe() const = 0;

  // At least `bytes` of device memory (0 is allowed) for `owner` (a session
  // serial; 0 = nobody in particular). RESOURCE_EXHAUSTED when the device's
  // capacity (DeviceDescription::memory_bytes) is used up. The memory never
  // shows bytes another owner wrote: it is zero unless `owner` (non-zero)
  // wrote it last.
  virtual absl::StatusOr<void*> Allocate(uint64_t bytes, uint64_t owner) = 0;
  virtual void Deallocate(void* block, uint64_t bytes) = 0;

  // Synchronous copies between host memory and device memory.
  virtual void CopyToDevice(void* device_dst, const void* host_src,
                            uint64_t bytes) = 0;
  virtual void CopyFromDevice(void* host_dst, const void* device_src,
                              uint64_t bytes) = 0;

  // For devices whose memory the host can address directly (the CPU
  // device): the host address of `device_ptr`, so transfers can read and
  // write it in place without a staging copy. nullptr otherwise.
  virtual void* HostAddress(void* device_ptr) { return nullptr; }

  // Runs a validated operator plan to completion on the calling (stream)
  // thread, using the device's compute resources.
  virtual absl::Status Launch(const kernels::Plan& plan, void* workspace,
                              uint64_t workspace_size) = 0;
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_DEVICE_H_
