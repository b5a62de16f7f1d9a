#ifndef OPSERVER_RUNTIME_BUFFER_H_
#define OPSERVER_RUNTIME_BUFFER_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "devices/device.h"

namespace opserver {

// Accounting of device memory held by buffers: one per device, each
// counting into the server-wide one (its `parent`), so the totals and the
// per-device figures cannot disagree.
struct MemoryAccounting {
  explicit MemoryAccounting(MemoryAccounting* parent = nullptr)
      : parent(parent) {}
  // Adds (or, with `sign` -1, removes) one buffer of `size` bytes here and
  // in every parent.
  void Add(uint64_t size, int sign);

  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> buffers{0};
  MemoryAccounting* const parent;
};

// A block of device memory. Shared by the session's handle table and by any
// queued work that uses it, so freeing a buffer that queued work still needs
// releases the memory only after that work ran. `charged` bytes are taken
// from `session_bytes` and `tenant_bytes` until then: a session's (and its
// owner's) memory is refunded only when it is really released, not when its
// handle is freed.
class Buffer {
 public:
  Buffer(Device* device, void* data, uint64_t size, MemoryAccounting* account,
         std::shared_ptr<std::atomic<uint64_t>> session_bytes = nullptr,
         uint64_t charged = 0,
         std::shared_ptr<std::atomic<uint64_t>> tenant_bytes = nullptr);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The device the memory is on (its session's): transfers address and
  // copy it through this one.
  Device* device() const { return device_; }
  // Its handle was freed (Session::Free): work that still holds the memory
  // may finish, but a graph replayed after this refuses to run on it.
  void MarkFreed() { freed_.store(true, std::memory_order_relaxed); }
  bool freed() const { return freed_.load(std::memory_order_relaxed); }

 private:
  Device* const device_;
  void* const data_;
  const uint64_t size_;
  MemoryAccounting* const account_;
  const std::shared_ptr<std::atomic<uint64_t>> session_bytes_;
  const uint64_t charged_;
  const std::shared_ptr<std::atomic<uint64_t>> tenant_bytes_;
  std::atomic<bool> freed_{false};
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_BUFFER_H_
