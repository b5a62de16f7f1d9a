// Shared by the fuzz targets: a device whose memory ASan watches byte by
// byte, and an invariant check that libFuzzer reports as a crash.
#ifndef OPSERVER_FUZZ_FUZZ_SUPPORT_H_
#define OPSERVER_FUZZ_FUZZ_SUPPORT_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "devices/cpu/plan.h"
#include "devices/cpu/thread_pool.h"
#include "devices/device.h"
#include "google/protobuf/stubs/logging.h"

// An invariant the server promises; a violation aborts, which libFuzzer
// (and the standalone driver's caller) reports as a finding.
#define FUZZ_CHECK(cond, ...)                                            \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__,    \
                   __LINE__, #cond);                                     \
      std::fprintf(stderr, "  %s\n", absl::StrCat(__VA_ARGS__).c_str()); \
      std::abort();                                                      \
    }                                                                    \
  } while (0)

namespace opserver::fuzz {

// OPSERVER_FUZZ_VERBOSE=1 makes the targets print each input's outcome
// (to see what a corpus entry exercises).
inline bool Verbose() {
  static const bool verbose = std::getenv("OPSERVER_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

// Protobuf logs every string field with invalid UTF-8 it parses (an
// ordinary fuzz input); silenced, as the server's clients cannot see them
// either. Call once per input before parsing (cheap after the first).
inline void QuietProtobuf() {
  static const bool quiet = (google::protobuf::SetLogHandler(
                                 [](google::protobuf::LogLevel, const char*,
                                    int, const std::string&) {}),
                             true);
  (void)quiet;
}

inline void Report(absl::string_view what, const absl::Status& status) {
  if (Verbose()) {
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(what.size()),
                 what.data(), status.ToString().c_str());
  }
}

// A Device for the fuzzers: every allocation is its own heap block of
// exactly the bytes asked for (the CPU device's page-granular pool would let
// an overrun go unseen), zeroed as the Device contract says, within
// `capacity_bytes` in all. Launches run the plan like the CPU device, on a
// small thread pool (large launches split across it).
class HeapDevice : public Device {
 public:
  explicit HeapDevice(uint64_t capacity_bytes, bool host_addressable = true)
      : capacity_(capacity_bytes), host_addressable_(host_addressable) {}

  DeviceDescription Describe() const override {
    DeviceDescription d;
    d.kind = "fuzz-heap";
    d.memory_bytes = capacity_;
    d.threads = static_cast<uint32_t>(Pool()->num_threads());
    return d;
  }
  absl::StatusOr<void*> Allocate(uint64_t bytes, uint64_t /*owner*/) override {
    if (bytes > capacity_ - used_.load()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("fuzz device: ", bytes, " bytes over capacity"));
    }
    used_ += bytes;
    // new char[0] is a distinct, non-null block ASan still guards.
    char* block = new char[bytes];
    std::memset(block, 0, bytes);
    return static_cast<void*>(block);
  }
  void Deallocate(void* block, uint64_t bytes) override {
    used_ -= bytes;
    delete[] static_cast<char*>(block);
  }
  uint64_t FreeBytes() const override { return capacity_ - used_.load(); }
  absl::StatusOr<std::unique_ptr<DevicePlan>> Prepare(
      kernels::ValidCall valid) const override {
    return cpu::HostPlan::Prepare(this, std::move(valid));
  }
  // Memcpy copies and plans run on the pool, complete when they return,
  // like the CPU device's stream.
  class HeapStream : public DeviceStream {
   public:
    explicit HeapStream(const Device* device) : device_(device) {}
    absl::Status CopyToDevice(void* dst, const void* src,
                              uint64_t bytes) override {
      if (bytes != 0) std::memcpy(dst, src, bytes);
      return absl::OkStatus();
    }
    absl::Status CopyFromDevice(void* dst, const void* src,
                                uint64_t bytes) override {
      if (bytes != 0) std::memcpy(dst, src, bytes);
      return absl::OkStatus();
    }
    absl::Status Memset(void* dst, int value, uint64_t bytes) override {
      if (bytes != 0) std::memset(dst, value & 0xff, bytes);
      return absl::OkStatus();
    }
    absl::Status CopyOnDevice(void* dst, const void* src,
                              uint64_t bytes) override {
      if (bytes != 0) std::memmove(dst, src, bytes);
      return absl::OkStatus();
    }
    absl::Status Launch(const DevicePlan& plan, void* workspace,
                        uint64_t workspace_size) override {
      absl::StatusOr<const cpu::Plan*> host = cpu::HostPlan::Of(plan, device_);
      if (!host.ok()) return host.status();
      return cpu::RunPlan(**host, workspace, workspace_size, Pool());
    }
    absl::Status Synchronize() override { return absl::OkStatus(); }

   private:
    const Device* const device_;
  };
  absl::StatusOr<std::unique_ptr<DeviceStream>> CreateStream() override {
    return std::make_unique<HeapStream>(this);
  }
  void* HostAddress(void* device_ptr) override {
    return host_addressable_ ? device_ptr : nullptr;
  }
  // The CPU's: launches run here as the CPU device's would.
  int64_t inline_launch_elements() const override {
    return cpu::kInlineLaunchElements;
  }

  uint64_t used() const { return used_.load(); }

  // Two threads: enough for RunPlan to split a large launch into ranges.
  static cpu::ThreadPool* Pool() {
    static cpu::ThreadPool* const pool = new cpu::ThreadPool(2);
    return pool;
  }

 private:
  const uint64_t capacity_;
  const bool host_addressable_;
  // Atomic: buffers queued work still holds are released on stream
  // threads (pipeline_fuzzer).
  std::atomic<uint64_t> used_{0};
};

// Fills `n` bytes at `dst` with `pattern` repeated (zeros when it is
// empty): device contents the fuzzer controls, deterministically.
inline void FillCyclic(void* dst, uint64_t n, const uint8_t* pattern,
                       size_t pattern_size) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  if (pattern_size == 0) {
    std::memset(out, 0, n);
    return;
  }
  for (uint64_t i = 0; i < n;) {
    const uint64_t chunk = std::min<uint64_t>(pattern_size, n - i);
    std::memcpy(out + i, pattern, chunk);
    i += chunk;
  }
}

}  // namespace opserver::fuzz

#endif  // OPSERVER_FUZZ_FUZZ_SUPPORT_H_
