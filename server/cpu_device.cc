#include "server/cpu_device.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace opserver {
namespace {

std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (absl::StartsWith(line, "model name")) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "unknown CPU";
}

}  // namespace

int CpuDevice::ResolveThreads(int threads) {
  if (threads > 0) return threads;
  int hw = static_cast<int>(std::thread::hardware_concurrency());
  return hw > 0 ? hw : 1;
}

uint64_t CpuDevice::DefaultMemoryBytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 4ull << 30;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) / 2;
}

CpuDevice::CpuDevice(int threads, uint64_t pool_cache_bytes,
                     uint64_t memory_bytes)
    : CpuDevice(std::make_shared<kernels::ThreadPool>(ResolveThreads(threads)),
                pool_cache_bytes, memory_bytes) {}

CpuDevice::CpuDevice(std::shared_ptr<kernels::ThreadPool> compute,
                     uint64_t pool_cache_bytes, uint64_t memory_bytes)
    : memory_(pool_cache_bytes,
              memory_bytes != 0 ? memory_bytes : DefaultMemoryBytes()),
      compute_(std::move(compute)) {
  description_.kind = "cpu";
  description_.name = CpuModelName();
  description_.threads = static_cast<uint32_t>(compute_->num_threads());
  description_.memory_bytes = memory_.capacity_bytes();
}

uint64_t CpuDevice::FreeBytes() const {
  const uint64_t capacity = memory_.capacity_bytes();
  return capacity - std::min(capacity, memory_.in_use_bytes());
}

DeviceDescription CpuDevice::Describe() const { return description_; }

absl::StatusOr<void*> CpuDevice::Allocate(uint64_t bytes, uint64_t owner) {
  return memory_.Allocate(bytes, owner);
}

void CpuDevice::Deallocate(void* block, uint64_t bytes) {
  memory_.Deallocate(block, bytes);
}

absl::StatusOr<std::unique_ptr<DeviceStream>> CpuDevice::CreateStream() {
  return std::make_unique<CpuStream>(compute_.get());
}

absl::Status CpuStream::CopyToDevice(void* device_dst, const void* host_src,
                                     uint64_t bytes) {
  if (bytes != 0) std::memcpy(device_dst, host_src, bytes);
  return absl::OkStatus();
}

absl::Status CpuStream::CopyFromDevice(void* host_dst, const void* device_src,
                                       uint64_t bytes) {
  if (bytes != 0) std::memcpy(host_dst, device_src, bytes);
  return absl::OkStatus();
}

absl::Status CpuStream::Memset(void* dst, int value, uint64_t bytes) {
  if (bytes != 0) std::memset(dst, value & 0xff, bytes);
  return absl::OkStatus();
}

absl::Status CpuStream::CopyOnDevice(void* dst, const void* src,
                                     uint64_t bytes) {
  // memmove: a copy within one buffer may overlap.
  if (bytes != 0) std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuStream::Launch(const kernels::Plan& plan, void* workspace,
                               uint64_t workspace_size) {
  return kernels::RunPlan(plan, workspace, workspace_size, compute_,
                          &cancelled_);
}

}  // namespace opserver
