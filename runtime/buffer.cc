#include "runtime/buffer.h"

#include <utility>

namespace opserver {

void MemoryAccounting::Add(uint64_t size, int sign) {
  for (MemoryAccounting* a = this; a != nullptr; a = a->parent) {
    if (sign > 0) {
      a->bytes += size;
      a->buffers += 1;
    } else {
      a->bytes -= size;
      a->buffers -= 1;
    }
  }
}

Buffer::Buffer(Device* device, void* data, uint64_t size,
               MemoryAccounting* account,
               std::shared_ptr<std::atomic<uint64_t>> session_bytes,
               uint64_t charged,
               std::shared_ptr<std::atomic<uint64_t>> tenant_bytes)
    : device_(device),
      data_(data),
      size_(size),
      account_(account),
      session_bytes_(std::move(session_bytes)),
      charged_(charged),
      tenant_bytes_(std::move(tenant_bytes)) {
  account_->Add(size_, +1);
}

Buffer::~Buffer() {
  device_->Deallocate(data_, size_);
  account_->Add(size_, -1);
  if (session_bytes_ != nullptr) *session_bytes_ -= charged_;
  if (tenant_bytes_ != nullptr) *tenant_bytes_ -= charged_;
}
}  // namespace opserver
