#include "client/device_addresses.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace opserver {
namespace {

// The end of the reserved space (the C API's stream and executor handles
// live from 0x20 << 40 on).
constexpr uintptr_t kLimit = uintptr_t{0x20} << 40;

}  // namespace

absl::StatusOr<void*> DeviceAddressSpace::Add(uint64_t size,
                                              remote::DeviceBuffer& buffer,
                                              uint32_t device) {
  // The allocation, rounded up to kAlign, plus one kAlign of gap; counted
  // in units so that no size can make the arithmetic wrap.
  const uint64_t units = size / kAlign + (size % kAlign != 0 ? 1 : 0) + 1;
  if (units > (kLimit - next_) / kAlign) {
    return absl::ResourceExhaustedError(
        "aclrtMalloc: the client's device address space is used up");
  }
  const uintptr_t base = next_;
  next_ += units * kAlign;
  allocations_.emplace(base, Allocation{size, std::move(buffer), device});
  return reinterpret_cast<void*>(base);
}

absl::StatusOr<DeviceAddressSpace::Range> DeviceAddressSpace::Resolve(
    const void* pointer, absl::string_view what) const {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  auto it = allocations_.upper_bound(address);
  if (it != allocations_.begin()) {
    --it;
    const uintptr_t base = it->first;
    const uint64_t size = it->second.size;
    if (address - base < size || (address == base && size == 0)) {
      return Range{it->second.buffer.handle(), it->second.device,
                   address - base, size - (address - base)};
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " (", absl::Hex(address),
                   ") is not inside any live aclrtMalloc allocation"));
}

absl::StatusOr<remote::DeviceBuffer> DeviceAddressSpace::Remove(
    const void* pointer) {
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(pointer));
  if (it == allocations_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(absl::Hex(reinterpret_cast<uintptr_t>(pointer)),
                     " is not the start of a live aclrtMalloc allocation"));
  }
  remote::DeviceBuffer buffer = std::move(it->second.buffer);
  allocations_.erase(it);
  return buffer;
}

void DeviceAddressSpace::ReleaseAll() {
  for (auto& [address, allocation] : allocations_) allocation.buffer.Release();
  allocations_.clear();
}

void DeviceAddressSpace::ReleaseDevice(uint32_t device) {
  for (auto it = allocations_.begin(); it != allocations_.end();) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    it->second.buffer.Release();
    it = allocations_.erase(it);
  }
}

}  // namespace opserver
