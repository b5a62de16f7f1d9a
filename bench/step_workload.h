// step_bench's workload (see the top of step_bench.cc): the 250 dependent
// backward operators of one step, their inputs, the same chain computed on
// the host for the bit-for-bit check, and the C API calls that launch a
// step, measure the round trip and the launch rate.
#ifndef OPSERVER_BENCH_STEP_WORKLOAD_H_
#define OPSERVER_BENCH_STEP_WORKLOAD_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"

namespace opserver::step_bench {

inline constexpr int kOps = 250;
inline constexpr int64_t kElements = 4096;
// DropoutBackward's bit mask: align(numel, 128) / 8 bytes (spec).
inline constexpr int64_t kMaskBytes = (kElements + 127) / 128 * 128 / 8;
inline constexpr int kWarmupSteps = 3;
inline constexpr int kSteps = 20;
inline constexpr int kRoundTripWarmup = 50;
inline constexpr int kRoundTrips = 1000;
inline constexpr absl::Duration kOneWayDelay = absl::Microseconds(250);

// Operator parameters, chosen so that after 250 operators a good share of
// the elements is still non-zero and of normal magnitude: a check of an
// all-zero result would prove little. Each is exact in fp32.
inline constexpr float kThreshold =
    -3.875f;                              // Zeroes self <= t: 1/64 of [-4, 4].
inline constexpr float kLambd = 0.0625f;  // Zeroes |self| <= l: 1/64 of them.
inline constexpr float kSlope = 0.75f;
inline constexpr int kDropEvery = 128;  // About 1 in 128 mask bits is 0.
// 1 / (1 - p) for p = 1/128; the kernel computes in float(scale).
inline constexpr double kScale = 128.0 / 127.0;

using Clock = std::chrono::steady_clock;

inline double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// Says what failed on stderr and exits 1.
[[noreturn]] void Die(const std::string& what);
// Dies naming `call` when `status` is not ACL_SUCCESS.
void CheckAcl(int status, const char* call);
#define CHECK_ACL(call) ::opserver::step_bench::CheckAcl((call), #call)

template <typename T>
T Must(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) Die(absl::StrCat(what, ": ", value.status().ToString()));
  return *std::move(value);
}
void Must(const absl::Status& status, const char* what);

enum class Op { kThreshold, kSoftshrink, kHardswish, kLeakyRelu, kDropout };
inline constexpr const char* kOpNames[] = {
    "ThresholdBackward", "SoftshrinkBackward", "HardswishBackward",
    "LeakyReluBackward", "DropoutBackward"};

// --chain's per-operator steps: every operator of the step is this one
// (-1: the five in turn).
extern int g_only_op;

inline Op OpAt(int i) {
  return static_cast<Op>(g_only_op >= 0 ? g_only_op : i % 5);
}

// What the backward pass reads besides the gradient: each operator's saved
// forward input (or dropout mask), different per operator as in a network.
struct Inputs {
  std::vector<float> grad;     // kElements
  std::vector<float> selfs;    // kOps x kElements
  std::vector<uint8_t> masks;  // kOps x kMaskBytes (dropout only)
};

Inputs MakeInputs();

// The chain on the host, with the fp32 formulas of the spec
// (docs/operators.md) written as the kernels compute them, so that
// the comparison can be exact.
std::vector<float> HostChain(const Inputs& inputs);

void* DeviceAlloc(size_t bytes);
void Upload(void* device, const void* host, size_t bytes);

// Opaque device pointers allow arithmetic inside an allocation.
inline void* Offset(void* base, size_t bytes) {
  return static_cast<char*>(base) + bytes;
}

struct Device {
  void* grad = nullptr;     // The step's incoming gradient.
  void* ping_pong[2] = {};  // Operator i writes ping_pong[i % 2].
  void* selfs = nullptr;
  void* masks = nullptr;
  void* workspace = nullptr;  // Grown on demand; the operators want none.
  uint64_t workspace_bytes = 0;
};

aclTensor* Tensor(void* data, int64_t elements, aclDataType dtype);

// Operators per block when a step is split over two streams.
inline constexpr int kBlock = 10;

// Launches the 250 operators on `stream`; returns without waiting for
// them. With `second` (and two `events`), blocks of kBlock operators
// alternate between the two streams, each block waiting for the one before
// through an event recorded at its end (aclrtRecordEvent +
// aclrtStreamWaitEvent: ordering on the server, no host wait); returns the
// stream the last block ran on, which the caller synchronizes.
aclrtStream LaunchStep(Device& device, aclrtStream stream,
                       aclrtStream second = nullptr,
                       aclrtEvent* events = nullptr);

// Copies the step's result back and compares it bit for bit with the host.
void CheckResult(const Device& device, const std::vector<float>& expected);

// A ThresholdBackward on the 16 fp32 elements at `data`, in place
// (gradOutput, self and out all of them), planned: the operator of the
// launch-rate, callback and first-launch rows. A repeatable executor is
// destroyed with the rest by DestroyThreshold; a single-use one is gone
// with its launch.
struct ThresholdCall {
  aclTensor* tensor = nullptr;
  aclScalar* threshold = nullptr;
  aclOpExecutor* executor = nullptr;
  bool repeatable = false;
};
ThresholdCall PlanThreshold(void* data, bool repeatable);
void DestroyThreshold(const ThresholdCall& call);

// Launches of one repeatable executor (16 fp32 elements, in place) on
// `stream` as fast as the C API takes them, then one synchronize: the
// rate one connection sustains when the device is not the bottleneck.
double LaunchRate(void* data, aclrtStream stream, int launches);

// The round trip, in microseconds: the mean idle aclrtSynchronizeStream of
// `stream` (one request and its answer, with nothing to wait for on the
// server) after kRoundTripWarmup unmeasured ones.
double RoundTripUs(aclrtStream stream);

double Median(std::vector<double> values);

}  // namespace opserver::step_bench

#endif  // OPSERVER_BENCH_STEP_WORKLOAD_H_
