#include "server/cpu_device.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

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

CpuDevice::CpuDevice(int threads) {
  int hw = static_cast<int>(std::thread::hardware_concurrency());
  description_.kind = "cpu";
  description_.name = CpuModelName();
  description_.threads =
      static_cast<uint32_t>(threads > 0 ? threads : (hw > 0 ? hw : 1));
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  description_.memory_bytes =
      pages > 0 && page_size > 0
          ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size)
          : 0;
}

DeviceDescription CpuDevice::Describe() const { return description_; }

}  // namespace opserver
