// The device addresses the aclnn C API hands out: each aclrtMalloc gets a
// range of a reserved address space (never dereferenced, never reused), so
// that a pointer anywhere inside an allocation, as aclnn programs form them
// by pointer arithmetic, resolves to the server buffer behind it and a byte
// offset, and a stale or foreign pointer is recognised instead of
// dereferenced.
#ifndef OPSERVER_CLIENT_DEVICE_ADDRESSES_H_
#define OPSERVER_CLIENT_DEVICE_ADDRESSES_H_

#include <cstdint>
#include <map>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/client.h"

namespace opserver {

// Not thread-safe: the C API holds its lock around every use.
//
//   DeviceAddressSpace space;
//   void* p = *space.Add(48, buffer);                     // aclrtMalloc
//   auto r = space.Resolve(static_cast<char*>(p) + 16, "self");
//   // r->buffer, r->offset == 16, r->available == 32
class DeviceAddressSpace {
 public:
  // Where addresses start, and the alignment of each allocation's start; a
  // gap of at least one alignment unit follows each allocation, so one
  // allocation's end never touches the next one's start.
  static constexpr uintptr_t kBase = uintptr_t{0x10} << 40;
  static constexpr uintptr_t kAlign = 4096;

  struct Range {
    uint64_t buffer;     // The server buffer's handle.
    uint32_t device;     // The device ordinal the buffer is on.
    uint64_t offset;     // Bytes from the allocation's start.
    uint64_t available;  // Bytes from `offset` to the allocation's end.
  };

  // The address of a new allocation of `size` bytes backed by `buffer`
  // (moved in), a buffer on device ordinal `device`. RESOURCE_EXHAUSTED once
  // the reserved space is used up (2^44 bytes of addresses: never in practice,
  // but the arithmetic must not wrap); `buffer` then stays the caller's.
  absl::StatusOr<void*> Add(uint64_t size, remote::DeviceBuffer& buffer,
                            uint32_t device = 0);

  // The allocation `pointer` lies in (its first byte up to its last; the
  // start of an empty allocation). INVALID_ARGUMENT naming `what`
  // otherwise.
  absl::StatusOr<Range> Resolve(const void* pointer,
                                absl::string_view what) const;

  // Removes the allocation that starts at `pointer` and gives its buffer to
  // the caller (to free); INVALID_ARGUMENT when no allocation starts there.
  absl::StatusOr<remote::DeviceBuffer> Remove(const void* pointer);

  // Forgets every allocation without freeing (their session is gone).
  // Addresses stay used: a pointer from before never names a later
  // allocation.
  void ReleaseAll();
  // The same for the allocations on device ordinal `device` only (its
  // session is gone; the other devices' are not).
  void ReleaseDevice(uint32_t device);

  size_t size() const { return allocations_.size(); }

 private:
  struct Allocation {
    uint64_t size;
    remote::DeviceBuffer buffer;
    uint32_t device;
  };
  uintptr_t next_ = kBase;
  std::map<uintptr_t, Allocation> allocations_;  // By start address.
};

}  // namespace opserver

#endif  // OPSERVER_CLIENT_DEVICE_ADDRESSES_H_
