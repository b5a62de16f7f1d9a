#include "bench/step_workload.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "aclnnop/aclnn_dropout_backward.h"
#include "aclnnop/aclnn_hardswish_backward.h"
#include "aclnnop/aclnn_leaky_relu_backward.h"
#include "aclnnop/aclnn_softshrink_backward.h"
#include "aclnnop/aclnn_threshold_backward.h"

namespace opserver::step_bench {

int g_only_op = -1;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "step_bench: %s\n", what.c_str());
  std::exit(1);
}

void CheckAcl(int status, const char* call) {
  if (status != 0) {
    Die(absl::StrCat(call, " returned ", status, ": ", aclGetRecentErrMsg()));
  }
}

void Must(const absl::Status& status, const char* what) {
  if (!status.ok()) Die(absl::StrCat(what, ": ", status.ToString()));
}

Inputs MakeInputs() {
  std::mt19937 random(20240901);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_real_distribution<float> wide(-4.0f, 4.0f);
  // Hardswish's derivative is 0 below -3 and at most 1.5: a positive self
  // keeps the gradient alive and its product over 50 operators in range.
  std::uniform_real_distribution<float> positive(0.0f, 4.0f);
  std::uniform_int_distribution<int> bit(0, kDropEvery - 1);
  Inputs inputs;
  inputs.grad.resize(kElements);
  for (float& g : inputs.grad) g = unit(random);
  inputs.selfs.resize(kOps * kElements);
  inputs.masks.assign(kOps * kMaskBytes, 0);
  for (int op = 0; op < kOps; ++op) {
    float* self = &inputs.selfs[op * kElements];
    for (int64_t i = 0; i < kElements; ++i) {
      self[i] = OpAt(op) == Op::kHardswish ? positive(random) : wide(random);
    }
    if (OpAt(op) == Op::kDropout) {
      uint8_t* mask = &inputs.masks[op * kMaskBytes];
      for (int64_t i = 0; i < kElements; ++i) {
        if (bit(random) != 0) mask[i / 8] |= 1 << (i % 8);
      }
    }
  }
  return inputs;
}

std::vector<float> HostChain(const Inputs& inputs) {
  std::vector<float> grad = inputs.grad;
  const float scale = static_cast<float>(kScale);
  for (int op = 0; op < kOps; ++op) {
    const float* self = &inputs.selfs[op * kElements];
    const uint8_t* mask = &inputs.masks[op * kMaskBytes];
    for (int64_t i = 0; i < kElements; ++i) {
      const float g = grad[i];
      const float x = self[i];
      switch (OpAt(op)) {
        case Op::kThreshold:
          grad[i] = x <= kThreshold ? 0.0f : g;
          break;
        case Op::kSoftshrink:
          grad[i] = std::fabs(x) <= kLambd ? 0.0f : g;
          break;
        case Op::kHardswish: {
          const float deriv =
              x < -3.0f ? 0.0f : (x <= 3.0f ? x / 3.0f + 0.5f : 1.0f);
          grad[i] = g * deriv;
          break;
        }
        case Op::kLeakyRelu:
          grad[i] = x > 0 ? g : g * kSlope;
          break;
        case Op::kDropout:
          grad[i] = ((mask[i / 8] >> (i % 8)) & 1) ? g * scale : 0.0f;
          break;
      }
    }
  }
  return grad;
}

void* DeviceAlloc(size_t bytes) {
  void* pointer = nullptr;
  CHECK_ACL(aclrtMalloc(&pointer, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
  return pointer;
}

void Upload(void* device, const void* host, size_t bytes) {
  CHECK_ACL(aclrtMemcpy(device, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
}

aclTensor* Tensor(void* data, int64_t elements, aclDataType dtype) {
  const int64_t shape[] = {elements};
  aclTensor* tensor = aclCreateTensor(shape, 1, dtype, nullptr, 0,
                                      ACL_FORMAT_ND, shape, 1, data);
  if (tensor == nullptr)
    Die(absl::StrCat("aclCreateTensor: ", aclGetRecentErrMsg()));
  return tensor;
}

namespace {

using LaunchFn = aclnnStatus (*)(void*, uint64_t, aclOpExecutor*, aclrtStream);

// Plans operator `op` of the step on its three tensors (its scalar, when
// it has one, made into *scalar); the aclnn call that launches it.
LaunchFn PlanOp(int op, aclTensor* grad, aclTensor* other, aclTensor* result,
                aclScalar** scalar, uint64_t* workspace_bytes,
                aclOpExecutor** executor) {
  switch (OpAt(op)) {
    case Op::kThreshold: {
      float value = kThreshold;
      *scalar = aclCreateScalar(&value, ACL_FLOAT);
      CHECK_ACL(aclnnThresholdBackwardGetWorkspaceSize(
          grad, other, *scalar, result, workspace_bytes, executor));
      return aclnnThresholdBackward;
    }
    case Op::kSoftshrink: {
      float value = kLambd;
      *scalar = aclCreateScalar(&value, ACL_FLOAT);
      CHECK_ACL(aclnnSoftshrinkBackwardGetWorkspaceSize(
          grad, other, *scalar, result, workspace_bytes, executor));
      return aclnnSoftshrinkBackward;
    }
    case Op::kHardswish:
      CHECK_ACL(aclnnHardswishBackwardGetWorkspaceSize(
          grad, other, result, workspace_bytes, executor));
      return aclnnHardswishBackward;
    case Op::kLeakyRelu: {
      float value = kSlope;
      *scalar = aclCreateScalar(&value, ACL_FLOAT);
      CHECK_ACL(aclnnLeakyReluBackwardGetWorkspaceSize(
          grad, other, *scalar, /*selfIsResult=*/false, result, workspace_bytes,
          executor));
      return aclnnLeakyReluBackward;
    }
    case Op::kDropout:
      CHECK_ACL(aclnnDropoutBackwardGetWorkspaceSize(
          grad, other, kScale, result, workspace_bytes, executor));
      return aclnnDropoutBackward;
  }
  Die("no such operator");
}

}  // namespace

aclrtStream LaunchStep(Device& device, aclrtStream stream, aclrtStream second,
                       aclrtEvent* events) {
  aclrtStream last = stream;
  for (int op = 0; op < kOps; ++op) {
    const int block = op / kBlock;
    aclrtStream on = second != nullptr && block % 2 == 1 ? second : stream;
    if (second != nullptr && op % kBlock == 0 && block > 0) {
      CHECK_ACL(aclrtStreamWaitEvent(on, events[(block - 1) % 2]));
    }
    last = on;
    void* in = op == 0 ? device.grad : device.ping_pong[(op + 1) % 2];
    void* out = device.ping_pong[op % 2];
    aclTensor* grad = Tensor(in, kElements, ACL_FLOAT);
    aclTensor* result = Tensor(out, kElements, ACL_FLOAT);
    aclTensor* other =
        OpAt(op) == Op::kDropout
            ? Tensor(Offset(device.masks, op * kMaskBytes), kMaskBytes,
                     ACL_UINT8)
            : Tensor(Offset(device.selfs, op * kElements * sizeof(float)),
                     kElements, ACL_FLOAT);
    aclScalar* scalar = nullptr;
    uint64_t workspace_bytes = 0;
    aclOpExecutor* executor = nullptr;
    const LaunchFn launch =
        PlanOp(op, grad, other, result, &scalar, &workspace_bytes, &executor);
    if (workspace_bytes > device.workspace_bytes) {
      if (device.workspace != nullptr) CHECK_ACL(aclrtFree(device.workspace));
      device.workspace = DeviceAlloc(workspace_bytes);
      device.workspace_bytes = workspace_bytes;
    }
    const aclnnStatus launched =
        launch(workspace_bytes > 0 ? device.workspace : nullptr,
               workspace_bytes, executor, on);
    if (launched != ACLNN_SUCCESS) {
      Die(absl::StrCat("aclnn", kOpNames[static_cast<int>(OpAt(op))],
                       " (operator ", op, ") returned ", launched, ": ",
                       aclGetRecentErrMsg()));
    }
    // The executor was consumed by its launch (not repeatable); the
    // descriptors are the program's to free, as after any aclnn call.
    if (scalar != nullptr) CHECK_ACL(aclDestroyScalar(scalar));
    CHECK_ACL(aclDestroyTensor(grad));
    CHECK_ACL(aclDestroyTensor(other));
    CHECK_ACL(aclDestroyTensor(result));
    if (second != nullptr && (op % kBlock == kBlock - 1 || op == kOps - 1)) {
      CHECK_ACL(aclrtRecordEvent(events[block % 2], on));
    }
  }
  return last;
}

void CheckResult(const Device& device, const std::vector<float>& expected) {
  std::vector<float> actual(kElements);
  CHECK_ACL(aclrtMemcpy(actual.data(), kElements * sizeof(float),
                        device.ping_pong[(kOps - 1) % 2],
                        kElements * sizeof(float), ACL_MEMCPY_DEVICE_TO_HOST));
  for (int64_t i = 0; i < kElements; ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(float)) != 0) {
      Die(absl::StrCat("result differs from the host chain at element ", i,
                       ": device ", actual[i], ", host ", expected[i]));
    }
  }
}

ThresholdCall PlanThreshold(void* data, bool repeatable) {
  ThresholdCall call;
  call.repeatable = repeatable;
  call.tensor = Tensor(data, 16, ACL_FLOAT);
  float value = kThreshold;
  call.threshold = aclCreateScalar(&value, ACL_FLOAT);
  uint64_t workspace_bytes = 0;
  CHECK_ACL(aclnnThresholdBackwardGetWorkspaceSize(
      call.tensor, call.tensor, call.threshold, call.tensor, &workspace_bytes,
      &call.executor));
  if (repeatable) CHECK_ACL(aclSetAclOpExecutorRepeatable(call.executor));
  return call;
}

void DestroyThreshold(const ThresholdCall& call) {
  if (call.repeatable) CHECK_ACL(aclDestroyAclOpExecutor(call.executor));
  aclDestroyScalar(call.threshold);
  aclDestroyTensor(call.tensor);
}

double LaunchRate(void* data, aclrtStream stream, int launches) {
  const ThresholdCall call = PlanThreshold(data, /*repeatable=*/true);
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < launches; ++i) {
    CHECK_ACL(aclnnThresholdBackward(nullptr, 0, call.executor, stream));
  }
  CHECK_ACL(aclrtSynchronizeStream(stream));
  const double seconds = Micros(Clock::now() - start) / 1e6;
  DestroyThreshold(call);
  return launches / seconds;
}

double RoundTripUs(aclrtStream stream) {
  for (int i = 0; i < kRoundTripWarmup; ++i) {
    CHECK_ACL(aclrtSynchronizeStream(stream));
  }
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < kRoundTrips; ++i) {
    CHECK_ACL(aclrtSynchronizeStream(stream));
  }
  return Micros(Clock::now() - start) / kRoundTrips;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace opserver::step_bench
