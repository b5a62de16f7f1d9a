// Evaluate: the input is a serialized EvaluateRequest, run through
// RunEvaluate (what the gRPC handler calls after admission) on a device
// whose every scratch allocation is an exact heap block.
//
// Invariants besides memory safety: a refusal is never INTERNAL; a result
// has the output's dtype and shape and one value per element; the call
// gives back all the device memory it took.
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "fuzz/fuzz_support.h"
#include "proto/opserver.pb.h"
#include "runtime/executor.h"

namespace {

// Each tensor of one call carries at most this many values. The server's
// default --max_values is 2^20; the fuzzer uses 2^16 so that the largest
// accepted request stays fast (the check is the same, only its bound
// differs).
constexpr uint32_t kMaxValues = 1u << 16;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace opserver;
  opserver::fuzz::QuietProtobuf();
  v1::EvaluateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  // Three tensors of kMaxValues 8-byte values, a mask and a workspace fit.
  fuzz::HeapDevice device(64ull << 20);
  absl::StatusOr<v1::ValueTensor> out = RunEvaluate(request, &device, kMaxValues);
  fuzz::Report("Evaluate", out.status());
  FUZZ_CHECK(device.used() == 0, device.used(), " bytes not given back");
  if (!out.ok()) {
    FUZZ_CHECK(out.status().code() != absl::StatusCode::kInternal,
               out.status().ToString());
    return 0;
  }
  int64_t numel = 1;
  for (int64_t d : request.output().shape()) numel *= d;
  FUZZ_CHECK(out->values_size() == numel, out->values_size(), " values for ",
             numel, " elements");
  FUZZ_CHECK(out->dtype() == request.output().dtype(), "dtype changed");
  FUZZ_CHECK(out->shape_size() == request.output().shape_size(),
             "shape changed");
  return 0;
}
