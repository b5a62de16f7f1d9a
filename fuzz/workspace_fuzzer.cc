// GetWorkspaceSize, then Execute: the input is a serialized
// GetWorkspaceSizeRequest. Its operator, parameters and tensor descriptors
// go through PlanGetWorkspaceSize (what the gRPC handler calls) against a
// session holding buffers 1..7 of fixed sizes, each its own exact heap
// block; a plan that passes is launched, so ASan sees any element the
// checks let through outside its buffer.
//
// Invariants besides memory safety: a refusal is never INTERNAL (a dtype
// combination that passes the checks has a kernel), and an accepted launch
// computes at most as many elements as its output buffer has bytes (an
// output never overlaps itself).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "devices/cpu/plan.h"
#include "fuzz/fuzz_support.h"
#include "kernels/aclnn_status.h"
#include "proto/opserver.pb.h"
#include "runtime/executor.h"

namespace opserver::fuzz {
namespace {

// Buffer handle i + 1 has kBufferBytes[i] bytes. The last is large enough
// for a launch that RunPlan splits over threads (64 Ki elements).
constexpr uint64_t kBufferBytes[] = {0, 1, 16, 64, 256, 4096, 65536 + 64};
constexpr int kBuffers = sizeof(kBufferBytes) / sizeof(kBufferBytes[0]);
constexpr uint64_t kLargestBuffer = kBufferBytes[kBuffers - 1];

// The server's default --max_launch_elements.
constexpr uint64_t kMaxLaunchElements = uint64_t{1} << 31;

char* Buffer(int i) {
  static char* const* const buffers = [] {
    auto* b = new char*[kBuffers];
    for (int k = 0; k < kBuffers; ++k) b[k] = new char[kBufferBytes[k]];
    return b;
  }();
  return buffers[i];
}

}  // namespace
}  // namespace opserver::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace opserver;
  using namespace opserver::fuzz;
  opserver::fuzz::QuietProtobuf();
  v1::GetWorkspaceSizeRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  bool touched[kBuffers] = {};
  auto lookup = [&](uint64_t handle) -> absl::StatusOr<DeviceBytes> {
    if (handle == 0 || handle > kBuffers) {
      return absl::NotFoundError("no buffer with that handle");
    }
    const int i = static_cast<int>(handle - 1);
    if (!touched[i]) {
      // The buffer's contents are the input's bytes: the launch computes
      // on values the fuzzer chose (NaN, infinities, huge integers).
      // fuzz::Buffer: runtime/executor.h brings opserver::Buffer along.
      FillCyclic(fuzz::Buffer(i), kBufferBytes[i], data, size);
      touched[i] = true;
    }
    return DeviceBytes{fuzz::Buffer(i), kBufferBytes[i]};
  };
  static HeapDevice* const device = new HeapDevice(kLargestBuffer);
  absl::StatusOr<std::unique_ptr<DevicePlan>> plan =
      PlanGetWorkspaceSize(request, lookup, kMaxLaunchElements, *device);
  Report("GetWorkspaceSize", plan.status());
  if (!plan.ok()) {
    FUZZ_CHECK(plan.status().code() != absl::StatusCode::kInternal,
               plan.status().ToString());
    FUZZ_CHECK(kernels::GetAclnnStatus(plan.status()) != kernels::kAclnnSuccess,
               plan.status().ToString());
    return 0;
  }
  const DevicePlan& prepared = **plan;
  FUZZ_CHECK(static_cast<uint64_t>(prepared.numel()) <= kLargestBuffer,
             "a launch of ", prepared.numel(), " elements was accepted");
  FUZZ_CHECK(prepared.workspace_size() <= kLargestBuffer, "a workspace of ",
             prepared.workspace_size(), " bytes");
  // Execute on the device's stream: the workspace is its own exact heap
  // block too.
  std::unique_ptr<char[]> workspace(new char[prepared.workspace_size()]);
  absl::StatusOr<std::unique_ptr<DeviceStream>> stream = device->CreateStream();
  FUZZ_CHECK(stream.ok(), stream.status().ToString());
  absl::Status launched =
      (*stream)->Launch(prepared, workspace.get(), prepared.workspace_size());
  Report(absl::StrCat("launch of ", prepared.numel(), " elements"), launched);
  FUZZ_CHECK(launched.ok(), launched.ToString());
  return 0;
}
