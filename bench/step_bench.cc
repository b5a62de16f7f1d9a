// A backward step through the aclnn C API, as a training program issues it:
// 250 dependent operators on 4096-element fp32 tensors, one stream, one
// synchronize at the end. Small tensors make the step latency-bound, so this
// measures how many network round trips each operator costs.
//
//   bazel run -c opt //bench:step_bench
//   bazel run -c opt //bench:step_bench -- --replay   # the graph rows only
//   bazel build -c opt //bench:step_bench //server:opserver &&
//     bazel-bin/bench/step_bench --replay=bazel-bin/server/opserver
//     # the graph rows with the server a child process: its CPU apart
//   step_bench --chain=OPSERVER,LIBACLNN_REMOTE --replay  # through the chain
//
// An in-process opserver (CPU device) on a free loopback port serves four
// configurations: {loopback, through a DelayProxy adding 250 us each way}
// x {OPSERVER_PIPELINE=0, OPSERVER_PIPELINE=1}. Each one is a fresh
// aclInit .. aclFinalize, since the C API reads its environment at aclInit.
// Per configuration: the round trip (mean idle aclrtSynchronizeStream), the
// median step time over kSteps steps after kWarmupSteps, us per operator and
// round trips per operator, and, through the proxy, the target
// step <= 3 RTT + 250 x (loopback us per operator). Every step's result is
// copied back and compared bit for bit with the same chain on the host.
// Last, the same step through the C++ client, eager against a graph
// defined once and replayed, in the same run (--replay: only that, three
// rounds on loopback and through the proxy).
//
//   bazel build -c opt //bench:step_bench //server:opserver &&
//     bazel-bin/bench/step_bench --discovery=bazel-bin/server/opserver
//
// measures discovery instead (docs/pool.md): eight opserver processes (one
// device each) registered in an etcd the bench starts on loopback, and the
// time from aclInit to the first launch's synchronize with
// OPSERVER_ADDRESS=etcd://... (without and with OPSERVER_CLAIM=1) against
// OPSERVER_ADDRESS= the eight addresses, alternating, --rounds=N each
// (default 2 -> at least 20), medians.
//
//   bazel run -c opt //bench:step_bench -- --callbacks
//
// measures host callbacks on loopback instead: 1,000
// aclrtLaunchCallback(ACL_CALLBACK_NO_BLOCK) interleaved with 1,000
// launches on one stream and one synchronize, against the same 1,000
// launches alone, in round trips per callback (the round trip measured in
// the same run); and aclrtStreamQuery of a stream the library knows idle,
// in round trips per query.

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_dropout_backward.h"
#include "aclnnop/aclnn_hardswish_backward.h"
#include "aclnnop/aclnn_leaky_relu_backward.h"
#include "aclnnop/aclnn_softshrink_backward.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "bench/chain.h"
#include "bench/delay_proxy.h"
#include "client/client.h"
#include "devices/device_factory.h"
#include "runtime/executor.h"
#include "runtime/session.h"
#include "server/server.h"
#include "testing/etcd_process.h"
#include "testing/opserver_process.h"

namespace opserver {
namespace {

constexpr int kOps = 250;
constexpr int64_t kElements = 4096;
// DropoutBackward's bit mask: align(numel, 128) / 8 bytes (spec).
constexpr int64_t kMaskBytes = (kElements + 127) / 128 * 128 / 8;
constexpr int kWarmupSteps = 3;
constexpr int kSteps = 20;
constexpr int kRoundTripWarmup = 50;
constexpr int kRoundTrips = 1000;
constexpr absl::Duration kOneWayDelay = absl::Microseconds(250);

// Operator parameters, chosen so that after 250 operators a good share of
// the elements is still non-zero and of normal magnitude: a check of an
// all-zero result would prove little. Each is exact in fp32.
constexpr float kThreshold = -3.875f;  // Zeroes self <= t: 1/64 of [-4, 4].
constexpr float kLambd = 0.0625f;      // Zeroes |self| <= l: 1/64 of them.
constexpr float kSlope = 0.75f;
constexpr int kDropEvery = 128;  // About 1 in 128 mask bits is 0.
// 1 / (1 - p) for p = 1/128; the kernel computes in float(scale).
constexpr double kScale = 128.0 / 127.0;

using Clock = std::chrono::steady_clock;

double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "step_bench: %s\n", what.c_str());
  std::exit(1);
}

void CheckAcl(int status, const char* call) {
  if (status != 0) {
    Die(absl::StrCat(call, " returned ", status, ": ", aclGetRecentErrMsg()));
  }
}
#define CHECK_ACL(call) CheckAcl((call), #call)

enum class Op { kThreshold, kSoftshrink, kHardswish, kLeakyRelu, kDropout };
constexpr const char* kOpNames[] = {"ThresholdBackward", "SoftshrinkBackward",
                                    "HardswishBackward", "LeakyReluBackward",
                                    "DropoutBackward"};

// --chain's per-operator steps: every operator of the step is this one
// (-1: the five in turn).
int g_only_op = -1;

Op OpAt(int i) { return static_cast<Op>(g_only_op >= 0 ? g_only_op : i % 5); }

// What the backward pass reads besides the gradient: each operator's saved
// forward input (or dropout mask), different per operator as in a network.
struct Inputs {
  std::vector<float> grad;     // kElements
  std::vector<float> selfs;    // kOps x kElements
  std::vector<uint8_t> masks;  // kOps x kMaskBytes (dropout only)
};

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

// The chain on the host, with the fp32 formulas of the spec
// (docs/operators.md) written as the kernels compute them, so that
// the comparison can be exact.
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

// Opaque device pointers allow arithmetic inside an allocation.
void* Offset(void* base, size_t bytes) {
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

aclTensor* Tensor(void* data, int64_t elements, aclDataType dtype) {
  const int64_t shape[] = {elements};
  aclTensor* tensor = aclCreateTensor(shape, 1, dtype, nullptr, 0,
                                      ACL_FORMAT_ND, shape, 1, data);
  if (tensor == nullptr)
    Die(absl::StrCat("aclCreateTensor: ", aclGetRecentErrMsg()));
  return tensor;
}

// Operators per block when a step is split over two streams.
constexpr int kBlock = 10;

// Launches the 250 operators on `stream`; returns without waiting for
// them. With `second` (and two `events`), blocks of kBlock operators
// alternate between the two streams, each block waiting for the one before
// through an event recorded at its end (aclrtRecordEvent +
// aclrtStreamWaitEvent: ordering on the server, no host wait); returns the
// stream the last block ran on, which the caller synchronizes.
aclrtStream LaunchStep(Device& device, aclrtStream stream,
                       aclrtStream second = nullptr,
                       aclrtEvent* events = nullptr) {
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
    aclnnStatus (*launch)(void*, uint64_t, aclOpExecutor*, aclrtStream) =
        nullptr;
    switch (OpAt(op)) {
      case Op::kThreshold: {
        float value = kThreshold;
        scalar = aclCreateScalar(&value, ACL_FLOAT);
        CHECK_ACL(aclnnThresholdBackwardGetWorkspaceSize(
            grad, other, scalar, result, &workspace_bytes, &executor));
        launch = aclnnThresholdBackward;
        break;
      }
      case Op::kSoftshrink: {
        float value = kLambd;
        scalar = aclCreateScalar(&value, ACL_FLOAT);
        CHECK_ACL(aclnnSoftshrinkBackwardGetWorkspaceSize(
            grad, other, scalar, result, &workspace_bytes, &executor));
        launch = aclnnSoftshrinkBackward;
        break;
      }
      case Op::kHardswish:
        CHECK_ACL(aclnnHardswishBackwardGetWorkspaceSize(
            grad, other, result, &workspace_bytes, &executor));
        launch = aclnnHardswishBackward;
        break;
      case Op::kLeakyRelu: {
        float value = kSlope;
        scalar = aclCreateScalar(&value, ACL_FLOAT);
        CHECK_ACL(aclnnLeakyReluBackwardGetWorkspaceSize(
            grad, other, scalar, /*selfIsResult=*/false, result,
            &workspace_bytes, &executor));
        launch = aclnnLeakyReluBackward;
        break;
      }
      case Op::kDropout:
        CHECK_ACL(aclnnDropoutBackwardGetWorkspaceSize(
            grad, other, kScale, result, &workspace_bytes, &executor));
        launch = aclnnDropoutBackward;
        break;
    }
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

// Copies the step's result back and compares it bit for bit with the host.
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

struct Result {
  std::string path;
  std::string pipeline;
  double round_trip_us = 0;
  double step_median_us = 0;
  double step_min_us = 0;
  double step_max_us = 0;
  double launches_per_s = 0;
  // With a backend's metrics address: what the backend was asked per
  // launch during the timed steps (see bench::BackendCounts).
  bench::BackendCounts backend;
  int launches = 0;
};

// Launches of one repeatable executor (16 fp32 elements, in place) on
// `stream` as fast as the C API takes them, then one synchronize: the
// rate one connection sustains when the device is not the bottleneck.
double LaunchRate(void* data, aclrtStream stream, int launches) {
  aclTensor* t = Tensor(data, 16, ACL_FLOAT);
  float value = kThreshold;
  aclScalar* scalar = aclCreateScalar(&value, ACL_FLOAT);
  uint64_t workspace_bytes = 0;
  aclOpExecutor* executor = nullptr;
  CHECK_ACL(aclnnThresholdBackwardGetWorkspaceSize(
      t, t, scalar, t, &workspace_bytes, &executor));
  CHECK_ACL(aclSetAclOpExecutorRepeatable(executor));
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < launches; ++i) {
    CHECK_ACL(aclnnThresholdBackward(nullptr, 0, executor, stream));
  }
  CHECK_ACL(aclrtSynchronizeStream(stream));
  const double seconds = Micros(Clock::now() - start) / 1e6;
  CHECK_ACL(aclDestroyAclOpExecutor(executor));
  aclDestroyScalar(scalar);
  aclDestroyTensor(t);
  return launches / seconds;
}

// The round trip, in microseconds: the mean idle aclrtSynchronizeStream of
// `stream` (one request and its answer, with nothing to wait for on the
// server) after kRoundTripWarmup unmeasured ones.
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

// 1,000 aclrtMemcpyAsync of 4 KiB host to device and one synchronize,
// through the C API on `address`, pipelined: the median of 5 such batches
// per copy, and the idle round trip of the same stream.
struct CopyResult {
  double round_trip_us = 0;
  double per_copy_us = 0;
};
CopyResult AsyncCopies(const std::string& address) {
  constexpr int kCopies = 1000;
  constexpr size_t kBytes = 4096;
  setenv("OPSERVER_ADDRESS", address.c_str(), 1);
  setenv("OPSERVER_PIPELINE", "1", 1);
  CHECK_ACL(aclInit(nullptr));
  CHECK_ACL(aclrtSetDevice(0));
  aclrtStream stream = nullptr;
  CHECK_ACL(aclrtCreateStream(&stream));
  void* device = DeviceAlloc(kCopies * kBytes);
  std::vector<char> host(kCopies * kBytes, 1);
  CopyResult result;
  result.round_trip_us = RoundTripUs(stream);
  std::vector<double> batches;
  for (int batch = 0; batch < 6; ++batch) {
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < kCopies; ++i) {
      CHECK_ACL(aclrtMemcpyAsync(static_cast<char*>(device) + i * kBytes,
                                 kBytes, host.data() + i * kBytes, kBytes,
                                 ACL_MEMCPY_HOST_TO_DEVICE, stream));
    }
    CHECK_ACL(aclrtSynchronizeStream(stream));
    if (batch > 0) batches.push_back(Micros(Clock::now() - start) / kCopies);
  }
  result.per_copy_us = Median(batches);
  CHECK_ACL(aclrtFree(device));
  CHECK_ACL(aclrtDestroyStream(stream));
  CHECK_ACL(aclrtResetDevice(0));
  CHECK_ACL(aclFinalize());
  return result;
}

// `two_streams`: the step split over two streams with events (see
// LaunchStep).
// `backend_metrics` (optional): the /metrics of the server behind the one
// measured (--chain's backend), scraped around each timed step.
// `rate_launches`: launches for the launch rate (0: the default).
Result RunConfiguration(const std::string& path, const std::string& address,
                        const std::string& pipeline, const Inputs& inputs,
                        const std::vector<float>& expected,
                        bool two_streams = false,
                        const std::string& backend_metrics = "",
                        int rate_launches = 0) {
  setenv("OPSERVER_ADDRESS", address.c_str(), 1);
  setenv("OPSERVER_PIPELINE", pipeline.c_str(), 1);
  CHECK_ACL(aclInit(nullptr));
  CHECK_ACL(aclrtSetDevice(0));
  aclrtStream stream = nullptr;
  CHECK_ACL(aclrtCreateStream(&stream));
  aclrtStream second = nullptr;
  aclrtEvent events[2] = {};
  if (two_streams) {
    CHECK_ACL(aclrtCreateStream(&second));
    CHECK_ACL(aclrtCreateEvent(&events[0]));
    CHECK_ACL(aclrtCreateEvent(&events[1]));
  }

  Device device;
  device.grad = DeviceAlloc(kElements * sizeof(float));
  device.ping_pong[0] = DeviceAlloc(kElements * sizeof(float));
  device.ping_pong[1] = DeviceAlloc(kElements * sizeof(float));
  device.selfs = DeviceAlloc(inputs.selfs.size() * sizeof(float));
  device.masks = DeviceAlloc(inputs.masks.size());
  Upload(device.grad, inputs.grad.data(), inputs.grad.size() * sizeof(float));
  Upload(device.selfs, inputs.selfs.data(),
         inputs.selfs.size() * sizeof(float));
  Upload(device.masks, inputs.masks.data(), inputs.masks.size());

  Result result{two_streams ? path + " events" : path, pipeline};
  result.round_trip_us = RoundTripUs(stream);

  std::vector<double> steps;
  for (int step = 0; step < kWarmupSteps + kSteps; ++step) {
    // Each operator writes its output before the next reads it, so the
    // ping-pong buffers need no reset between steps.
    const bool timed = step >= kWarmupSteps;
    bench::BackendCounts before;
    if (timed && !backend_metrics.empty()) {
      before = bench::ScrapeCounts(backend_metrics);
    }
    const Clock::time_point start = Clock::now();
    CHECK_ACL(aclrtSynchronizeStream(
        LaunchStep(device, stream, two_streams ? second : nullptr, events)));
    const double elapsed = Micros(Clock::now() - start);
    if (timed && !backend_metrics.empty()) {
      const bench::BackendCounts d =
          bench::ScrapeCounts(backend_metrics) - before;
      result.backend.fences += d.fences;
      result.backend.unary_calls += d.unary_calls;
      result.backend.synchronizes += d.synchronizes;
      result.backend.launches += d.launches;
      result.backend.batches += d.batches;
      result.launches += kOps;
    }
    CheckResult(device, expected);  // Outside the timed part.
    if (timed) steps.push_back(elapsed);
  }
  result.step_median_us = Median(steps);
  result.step_min_us = *std::min_element(steps.begin(), steps.end());
  result.step_max_us = *std::max_element(steps.begin(), steps.end());
  result.launches_per_s = LaunchRate(
      device.ping_pong[0], stream,
      rate_launches > 0
          ? rate_launches
          : (pipeline == "1" ? 200000 : (path == "loopback" ? 5000 : 1000)));

  CHECK_ACL(aclrtFree(device.grad));
  CHECK_ACL(aclrtFree(device.ping_pong[0]));
  CHECK_ACL(aclrtFree(device.ping_pong[1]));
  CHECK_ACL(aclrtFree(device.selfs));
  CHECK_ACL(aclrtFree(device.masks));
  if (device.workspace != nullptr) CHECK_ACL(aclrtFree(device.workspace));
  if (two_streams) {
    CHECK_ACL(aclrtDestroyEvent(events[0]));
    CHECK_ACL(aclrtDestroyEvent(events[1]));
    CHECK_ACL(aclrtDestroyStream(second));
  }
  CHECK_ACL(aclrtDestroyStream(stream));
  CHECK_ACL(aclrtResetDevice(0));
  CHECK_ACL(aclFinalize());
  return result;
}

// A 256 MiB aclrtMemcpy each way through the C API on `address`: the
// median of 3 after one warm-up, in ms, the bytes checked after each.
struct CopyTimes {
  double upload_ms = 0;
  double download_ms = 0;
};
CopyTimes BigCopies(const std::string& address) {
  constexpr size_t kBytes = 256ull << 20;
  setenv("OPSERVER_ADDRESS", address.c_str(), 1);
  setenv("OPSERVER_PIPELINE", "1", 1);
  CHECK_ACL(aclInit(nullptr));
  CHECK_ACL(aclrtSetDevice(0));
  void* device = DeviceAlloc(kBytes);
  std::vector<char> host(kBytes);
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<char>(i * 131);
  std::vector<char> back(kBytes);
  std::vector<double> up, down;
  for (int i = 0; i < 4; ++i) {
    const Clock::time_point start = Clock::now();
    Upload(device, host.data(), kBytes);
    const Clock::time_point uploaded = Clock::now();
    CHECK_ACL(aclrtMemcpy(back.data(), kBytes, device, kBytes,
                          ACL_MEMCPY_DEVICE_TO_HOST));
    const Clock::time_point downloaded = Clock::now();
    if (back != host) Die("256 MiB copy: the bytes came back different");
    if (i > 0) {
      up.push_back(Micros(uploaded - start) / 1000);
      down.push_back(Micros(downloaded - uploaded) / 1000);
    }
  }
  CHECK_ACL(aclrtFree(device));
  CHECK_ACL(aclrtResetDevice(0));
  CHECK_ACL(aclFinalize());
  return {Median(up), Median(down)};
}

// --addresses=NAME=HOST:PORT,...: the pipelined step (all five operators in
// turn) and a 256 MiB copy each way against each named server, the
// addresses alternating, `rounds` rounds: e.g. an opserver directly and
// the same through a proxy (bench/haproxy_bench.sh). The environment
// (OPSERVER_DATA_PATH, ...) applies as to any C API program.
int AddressesMain(const std::string& spec, int rounds) {
  std::vector<std::pair<std::string, std::string>> targets;
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    std::pair<std::string, std::string> named = absl::StrSplit(item, '=');
    if (named.first.empty() || named.second.empty()) {
      Die(absl::StrCat("--addresses: \"", item, "\" is not NAME=HOST:PORT"));
    }
    targets.push_back(std::move(named));
  }
  const Inputs inputs = MakeInputs();
  const std::vector<float> expected = HostChain(inputs);
  const char* data_path = std::getenv("OPSERVER_DATA_PATH");
  std::printf(
      "step_bench --addresses: %d dependent operators on %lld-element fp32 "
      "tensors per step, pipelined, median of %d steps after %d warm-up; "
      "256 MiB aclrtMemcpy each way, median of 3 after 1 warm-up; "
      "OPSERVER_DATA_PATH=%s; %d rounds, addresses alternating.\n\n",
      kOps, static_cast<long long>(kElements), kSteps, kWarmupSteps,
      data_path == nullptr ? "(unset: on)" : data_path, rounds);
  std::printf("%-10s %-6s %9s %9s %9s %11s %11s %9s %9s\n", "address", "round",
              "RTT us", "step ms", "us/op", "upload ms", "download ms",
              "up MB/s", "down MB/s");
  for (int round = 0; round < rounds; ++round) {
    for (const auto& [name, address] : targets) {
      const Result step =
          RunConfiguration(name, address, "1", inputs, expected);
      const CopyTimes copies = BigCopies(address);
      const double mb = (256ull << 20) / 1e6;
      std::printf("%-10s %-6d %9.1f %9.2f %9.1f %11.1f %11.1f %9.0f %9.0f\n",
                  name.c_str(), round + 1, step.round_trip_us,
                  step.step_median_us / 1000, step.step_median_us / kOps,
                  copies.upload_ms, copies.download_ms,
                  mb / (copies.upload_ms / 1000),
                  mb / (copies.download_ms / 1000));
      std::fflush(stdout);
    }
  }
  return 0;
}

// --chain=OPSERVER,LIBACLNN_REMOTE: the step against the Ascend device over
// the chain (a front opserver on --device=ascend with libaclnn_remote.so as
// its CANN, backed by a CPU opserver) and against that backend directly,
// alternating, `rounds` rounds, for the five operators in turn and for each
// operator alone. Reported per operator: us per launch on each, the
// front's added cost in us and in backend round trips (the backend's idle
// aclrtSynchronizeStream measured in the same configuration), and the
// calls the backend was asked to answer per launch (fences and unary
// calls: the round trips the front may have waited on).
int ChainMain(const std::string& spec, int rounds) {
  absl::StatusOr<std::unique_ptr<bench::Chain>> chain =
      bench::Chain::Start(spec);
  if (!chain.ok()) Die(absl::StrCat("--chain: ", chain.status().ToString()));
  std::printf(
      "step_bench --chain: backend (CPU device) %s, front (Ascend device "
      "over libaclnn_remote.so) %s; %d dependent operators on %lld-element "
      "fp32 tensors per step, one aclrtSynchronizeStream per step, pipelined "
      "(OPSERVER_PIPELINE=1); median of %d steps after %d warm-up; %d "
      "rounds, backend and front alternating.\n\n",
      (*chain)->backend().c_str(), (*chain)->front().c_str(), kOps,
      static_cast<long long>(kElements), kSteps, kWarmupSteps, rounds);
  std::printf("%-20s %-6s %-8s %9s %9s %9s %10s %10s %10s %10s\n", "operator",
              "round", "device", "RTT us", "step ms", "us/op", "fences/op",
              "unary/op", "msgs/op", "launches/s");
  struct Summary {
    std::string op;
    std::vector<double> cpu_us, front_us, rtt_us, added_rt, waits;
  };
  std::vector<Summary> summaries;
  for (int only = -1; only < 5; ++only) {
    g_only_op = only;
    const Inputs inputs = MakeInputs();
    const std::vector<float> expected = HostChain(inputs);
    Summary summary{only < 0 ? "all five in turn" : kOpNames[only]};
    for (int round = 0; round < rounds; ++round) {
      Result cpu = RunConfiguration("backend", (*chain)->backend(), "1", inputs,
                                    expected, false, "", 20000);
      Result front =
          RunConfiguration("front", (*chain)->front(), "1", inputs, expected,
                           false, (*chain)->backend_metrics(), 20000);
      const double cpu_per_op = cpu.step_median_us / kOps;
      const double front_per_op = front.step_median_us / kOps;
      const double n = std::max(1, front.launches);
      for (const Result* r : {&cpu, &front}) {
        const bool is_front = r == &front;
        std::printf(
            "%-20s %-6d %-8s %9.1f %9.2f %9.1f %10s %10s %10s %10.0f\n",
            summary.op.c_str(), round + 1, is_front ? "ascend" : "cpu",
            r->round_trip_us, r->step_median_us / 1000,
            r->step_median_us / kOps,
            is_front ? absl::StrFormat("%.3f", r->backend.fences / n).c_str()
                     : "-",
            is_front
                ? absl::StrFormat("%.3f", r->backend.unary_calls / n).c_str()
                : "-",
            is_front ? absl::StrFormat("%.3f", r->backend.batches / n).c_str()
                     : "-",
            r->launches_per_s);
      }
      std::fflush(stdout);
      summary.cpu_us.push_back(cpu_per_op);
      summary.front_us.push_back(front_per_op);
      summary.rtt_us.push_back(cpu.round_trip_us);
      summary.added_rt.push_back((front_per_op - cpu_per_op) /
                                 cpu.round_trip_us);
      summary.waits.push_back(front.backend.Waits() / n);
    }
    summaries.push_back(std::move(summary));
  }
  auto range = [](std::vector<double> v, const char* format) {
    std::sort(v.begin(), v.end());
    return v.front() == v.back()
               ? absl::StrFormat(format, v.front())
               : absl::StrCat(absl::StrFormat(format, v.front()), "-",
                              absl::StrFormat(format, v.back()));
  };
  std::printf("\n%-20s %14s %14s %14s %16s %20s %s\n", "operator", "CPU us/op",
              "Ascend us/op", "backend RTT us", "added us/op",
              "added backend RT/op", "backend waits/launch (target <= 1)");
  for (const Summary& s : summaries) {
    std::vector<double> added;
    for (size_t i = 0; i < s.cpu_us.size(); ++i) {
      added.push_back(s.front_us[i] - s.cpu_us[i]);
    }
    std::printf(
        "%-20s %14s %14s %14s %16s %20s %s\n", s.op.c_str(),
        range(s.cpu_us, "%.1f").c_str(), range(s.front_us, "%.1f").c_str(),
        range(s.rtt_us, "%.0f").c_str(), range(added, "%.1f").c_str(),
        range(s.added_rt, "%.2f").c_str(), range(s.waits, "%.3f").c_str());
  }
  std::printf(
      "\nus/op = median step / %d; RTT = the backend's idle "
      "aclrtSynchronizeStream from this process (one unary round trip on "
      "loopback), measured in the same configuration; added RT/op = (Ascend "
      "us/op - CPU us/op) / RTT; backend waits/launch = (fence commands + "
      "unary calls the backend received during the timed steps) / launches: "
      "the backend round trips the front could have waited on; msgs/op = "
      "Pipeline messages the backend applied per launch.\n",
      kOps);
  return 0;
}

// ------------------------------------------------- graphs (issue 31)

// The same step through the C++ client (remote::Session), eagerly (250
// plans and launches, one synchronize) and as a graph defined once and
// replayed (one replay_graph command and one synchronize per step), in
// the same run, alternating rounds; each step's result checked against
// the host chain. Also the process's CPU time (client and server: the
// server is in-process) per replayed operator.
struct ReplayResult {
  double eager_us = 0;
  double replay_us = 0;
  double replay_cpu_us_per_op = 0;
  // The median synchronize of an idle stream: one round trip.
  double round_trip_us = 0;
  // The server process's CPU per replayed operator, when the server is a
  // child process (--replay=OPSERVER); -1 otherwise.
  double server_cpu_us_per_op = -1;
};

// Replayed steps whose server CPU is summed: /proc counts in clock ticks
// (10 ms), so the sum must be long for a sub-microsecond figure per
// operator.
constexpr int kServerCpuSteps = 2000;
constexpr int kIdleSynchronizes = 200;

double ProcessCpuUs() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec * 1e6 + usage.ru_utime.tv_usec +
         usage.ru_stime.tv_sec * 1e6 + usage.ru_stime.tv_usec;
}

// User and system CPU of process `pid` so far (all its threads, gone ones
// included), from /proc/PID/stat.
double ChildCpuUs(pid_t pid) {
  const std::string stat =
      process::ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  // Fields after the command name, which is in parentheses and may hold
  // spaces: state is field 3, utime 14, stime 15.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) Die("cannot read the server's CPU time");
  std::vector<std::string> fields =
      absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
  if (fields.size() < 13) Die("cannot read the server's CPU time");
  const double ticks = std::atof(fields[11].c_str()) +
                       std::atof(fields[12].c_str());
  return ticks * 1e6 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

template <typename T>
T Must(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) Die(absl::StrCat(what, ": ", value.status().ToString()));
  return *std::move(value);
}
void Must(const absl::Status& status, const char* what) {
  if (!status.ok()) Die(absl::StrCat(what, ": ", status.ToString()));
}

ReplayResult RunReplayComparison(const std::string& address,
                                 const Inputs& inputs,
                                 const std::vector<float>& expected,
                                 pid_t server_pid) {
  std::unique_ptr<Client> client = Must(Client::Connect(address), "Connect");
  std::unique_ptr<remote::Session> session =
      Must(client->CreateSession("step_bench replay"), "CreateSession");
  remote::Session& s = *session;
  const uint64_t bytes = kElements * sizeof(float);
  remote::DeviceBuffer grad = Must(s.Malloc(bytes), "Malloc");
  remote::DeviceBuffer ping_pong[2] = {Must(s.Malloc(bytes), "Malloc"),
                                       Must(s.Malloc(bytes), "Malloc")};
  remote::DeviceBuffer selfs =
      Must(s.Malloc(inputs.selfs.size() * sizeof(float)), "Malloc");
  remote::DeviceBuffer masks = Must(s.Malloc(inputs.masks.size()), "Malloc");
  Must(s.Upload(grad.handle(), 0, inputs.grad.data(), bytes), "Upload");
  Must(s.Upload(selfs.handle(), 0, inputs.selfs.data(),
                inputs.selfs.size() * sizeof(float)),
       "Upload");
  Must(s.Upload(masks.handle(), 0, inputs.masks.data(), inputs.masks.size()),
       "Upload");
  remote::Stream stream = Must(s.CreateStream(), "CreateStream");
  auto plan = [&](int op) {
    const uint64_t in =
        op == 0 ? grad.handle() : ping_pong[(op + 1) % 2].handle();
    remote::TensorDesc g =
        remote::TensorDesc::Contiguous(in, kernels::DType::kFloat, {kElements});
    remote::TensorDesc o = remote::TensorDesc::Contiguous(
        ping_pong[op % 2].handle(), kernels::DType::kFloat, {kElements});
    remote::TensorDesc x = remote::TensorDesc::Contiguous(
        selfs.handle(), kernels::DType::kFloat, {kElements});
    x.buffer_offset = op * kElements * sizeof(float);
    switch (OpAt(op)) {
      case Op::kThreshold:
        return s.ThresholdBackward(g, x, kThreshold, o);
      case Op::kSoftshrink:
        return s.SoftshrinkBackward(g, x, kLambd, o);
      case Op::kHardswish:
        return s.HardswishBackward(g, x, o);
      case Op::kLeakyRelu:
        return s.LeakyReluBackward(
            g, x, remote::ScalarValue{kernels::DType::kFloat, kSlope}, false,
            o);
      case Op::kDropout: {
        remote::TensorDesc mask = remote::TensorDesc::Contiguous(
            masks.handle(), kernels::DType::kUint8, {kMaskBytes});
        mask.buffer_offset = op * kMaskBytes;
        return s.DropoutBackward(g, mask, kScale, o);
      }
    }
    return absl::StatusOr<remote::Executor>(absl::InternalError("no op"));
  };
  auto check = [&](const char* what) {
    std::vector<float> actual(kElements);
    Must(s.Download(ping_pong[(kOps - 1) % 2].handle(), 0, actual.data(), bytes,
                    stream.handle()),
         "Download");
    if (std::memcmp(actual.data(), expected.data(), bytes) != 0) {
      Die(absl::StrCat(what, ": the result differs from the host chain"));
    }
  };
  auto eager_step = [&] {
    for (int op = 0; op < kOps; ++op) {
      Must(Must(plan(op), "plan").Execute(stream.handle()), "Execute");
    }
    Must(s.Synchronize(stream.handle()), "Synchronize");
  };
  std::vector<v1::PipelineCommand> tasks;
  for (int op = 0; op < kOps; ++op) {
    remote::Executor executor = Must(plan(op), "plan");
    tasks.push_back(
        Must(s.LaunchCommand(executor.handle(), stream.handle(), 0, 0, 0),
             "record"));
    executor.Release();
  }
  const uint64_t graph = Must(s.DefineGraph(std::move(tasks)), "DefineGraph");
  Must(s.Flush(), "DefineGraph (deferred)");
  auto replay_step = [&] {
    Must(s.ReplayGraph(graph, stream.handle()), "ReplayGraph");
    Must(s.Synchronize(stream.handle()), "Synchronize");
  };
  for (int i = 0; i < kWarmupSteps; ++i) {
    eager_step();
    replay_step();
  }
  std::vector<double> eager, replay;
  double replay_cpu = 0;
  for (int i = 0; i < kSteps; ++i) {
    Must(s.Memset(ping_pong[(kOps - 1) % 2].handle(), 0, bytes, 0,
                  stream.handle()),
         "Memset");
    Clock::time_point start = Clock::now();
    eager_step();
    eager.push_back(Micros(Clock::now() - start));
    check("eager step");
    Must(s.Memset(ping_pong[(kOps - 1) % 2].handle(), 0, bytes, 0,
                  stream.handle()),
         "Memset");
    Must(s.Synchronize(stream.handle()), "Synchronize");
    const double cpu = ProcessCpuUs();
    start = Clock::now();
    replay_step();
    replay.push_back(Micros(Clock::now() - start));
    replay_cpu += ProcessCpuUs() - cpu;
    check("replayed step");
  }
  ReplayResult result;
  std::vector<double> idle;
  for (int i = 0; i < kIdleSynchronizes; ++i) {
    const Clock::time_point start = Clock::now();
    Must(s.Synchronize(stream.handle()), "Synchronize");
    idle.push_back(Micros(Clock::now() - start));
  }
  result.round_trip_us = Median(idle);
  if (server_pid > 0) {
    const double before = ChildCpuUs(server_pid);
    for (int i = 0; i < kServerCpuSteps; ++i) replay_step();
    result.server_cpu_us_per_op =
        (ChildCpuUs(server_pid) - before) / kServerCpuSteps / kOps;
    check("replayed step");
  }
  Must(s.DestroyGraph(graph), "DestroyGraph");
  Must(s.Flush(), "Flush");
  result.eager_us = Median(eager);
  result.replay_us = Median(replay);
  result.replay_cpu_us_per_op = replay_cpu / kSteps / kOps;
  return result;
}

// The in-process launch cost of the same 250 operators: planned once on a
// Session of a CPU device made here (as the server plans them), then each
// step launched straight on a device stream, no RPC, no queue. The median
// step over kSteps, in microseconds per operator.
double InProcessUsPerOp(const Inputs& inputs) {
  DeviceOptions device_options;
  device_options.memory_cache_bytes = 0;
  std::unique_ptr<opserver::Device> device =
      Must(CreateDevice(device_options), "CreateDevice");
  SessionLimits limits;
  MemoryAccounting account;
  auto threads = std::make_shared<StreamThreads>();
  std::vector<double> steps;
  {
    opserver::Session session("in-process", 1, "step_bench", device.get(),
                              &limits, &account, threads);
    auto buffer = [&](const void* data, uint64_t bytes) {
      const uint64_t handle = Must(session.Malloc(bytes), "Malloc");
      if (data != nullptr) {
        std::memcpy((*session.GetBuffer(handle))->data(), data, bytes);
      }
      return handle;
    };
    const uint64_t bytes = kElements * sizeof(float);
    const uint64_t grad = buffer(inputs.grad.data(), bytes);
    const uint64_t ping_pong[2] = {buffer(nullptr, bytes),
                                   buffer(nullptr, bytes)};
    const uint64_t selfs = buffer(inputs.selfs.data(),
                                  inputs.selfs.size() * sizeof(float));
    const uint64_t masks = buffer(inputs.masks.data(), inputs.masks.size());
    auto desc = [](uint64_t handle, uint64_t offset, v1::DataType dtype,
                   int64_t n) {
      v1::TensorDesc d;
      d.set_buffer(handle);
      d.set_buffer_offset(offset);
      d.set_dtype(dtype);
      d.add_shape(n);
      return d;
    };
    std::vector<std::shared_ptr<Executor>> plans;
    for (int op = 0; op < kOps; ++op) {
      v1::GetWorkspaceSizeRequest request;
      request.set_op(kOpNames[static_cast<int>(OpAt(op))]);
      auto& tensors = *request.mutable_tensors();
      tensors["gradOutput"] = desc(op == 0 ? grad : ping_pong[(op + 1) % 2],
                                   0, v1::FLOAT, kElements);
      const std::string out =
          OpAt(op) == Op::kSoftshrink ? "gradInput" : "out";
      tensors[out] = desc(ping_pong[op % 2], 0, v1::FLOAT, kElements);
      v1::OpParams& params = *request.mutable_params();
      if (OpAt(op) == Op::kDropout) {
        tensors["mask"] = desc(masks, op * kMaskBytes, v1::UINT8, kMaskBytes);
        params.set_scale(kScale);
      } else {
        tensors["self"] = desc(selfs, op * bytes, v1::FLOAT, kElements);
      }
      params.set_threshold(kThreshold);
      params.set_lambd(kLambd);
      params.mutable_negative_slope()->set_dtype(v1::FLOAT);
      params.mutable_negative_slope()->set_value(kSlope);
      plans.push_back(Must(
          PlanExecutor(request, session, limits.max_launch_elements), "plan"));
    }
    std::unique_ptr<DeviceStream> stream =
        Must(device->CreateStream(), "CreateStream");
    for (int i = 0; i < kWarmupSteps + kSteps; ++i) {
      const Clock::time_point start = Clock::now();
      for (const std::shared_ptr<Executor>& plan : plans) {
        Must(stream->Launch(*plan->plan, nullptr, 0), "Launch");
      }
      Must(stream->Synchronize(), "Synchronize");
      if (i >= kWarmupSteps) steps.push_back(Micros(Clock::now() - start));
    }
  }
  threads->WaitForZero(absl::Minutes(1));
  return Median(steps) / kOps;
}

void ReportReplay(const std::string& address, const char* path,
                  pid_t server_pid, const Inputs& inputs,
                  const std::vector<float>& expected) {
  ReplayResult r = RunReplayComparison(address, inputs, expected, server_pid);
  const double in_process = InProcessUsPerOp(inputs);
  std::printf(
      "graph replay (C++ client, %s, median of %d steps after %d): eager "
      "step %.2f ms (%.2f us/op), replayed step %.2f ms (%.2f us/op): "
      "replay/eager %.3f (target <= 0.25: %s)\n",
      path, kSteps, kWarmupSteps, r.eager_us / 1000, r.eager_us / kOps,
      r.replay_us / 1000, r.replay_us / kOps, r.replay_us / r.eager_us,
      r.replay_us <= 0.25 * r.eager_us ? "met" : "MISSED");
  const double bound = 1.2 * r.round_trip_us + kOps * in_process;
  std::printf(
      "  round trip (idle synchronize) %.0f us; in-process launch %.2f "
      "us/op; replayed step / (1.2 round trips + %d in-process launches) "
      "%.2f (target <= 1: %s); process CPU per replayed operator %.2f us "
      "(this process: the client%s)\n",
      r.round_trip_us, in_process, kOps, r.replay_us / bound,
      r.replay_us <= bound ? "met" : "MISSED", r.replay_cpu_us_per_op,
      server_pid > 0 ? "" : " and the in-process server");
  if (r.server_cpu_us_per_op >= 0) {
    std::printf(
        "  server process CPU per replayed operator (%d steps) %.2f us, "
        "%.2fx the in-process launch (target <= 2x: %s)\n",
        kServerCpuSteps, r.server_cpu_us_per_op,
        r.server_cpu_us_per_op / in_process,
        r.server_cpu_us_per_op <= 2 * in_process ? "met" : "MISSED");
  }
  std::fflush(stdout);
}

// --replay[=OPSERVER]: the graph rows, three rounds, on loopback and
// through the delay proxy. With an opserver binary the server is a child
// process, so its CPU is measured apart from the client's; without one it
// runs in this process.
int ReplayMain(const std::string& opserver_binary) {
  std::unique_ptr<Server> in_process;
  process::OpserverProcess child;
  std::string direct;
  std::string child_out;
  if (opserver_binary.empty()) {
    Options options;
    options.listen = "127.0.0.1:0";
    options.detect_mutex_deadlocks = false;
    in_process = Must(Server::Start(options), "Server::Start");
    direct = in_process->address();
  } else {
    process::OpserverLaunch launch;
    launch.binary = process::Absolute(opserver_binary);
    // Read for its addresses.
    const char* tmp = std::getenv("TMPDIR");
    child_out = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                             "/step_bench_opserver.", getpid(), ".out");
    launch.out_path = child_out;
    child = Must(process::StartOpserver(launch), "starting opserver");
    direct = child.address;
  }
  auto proxy = Must(bench::DelayProxy::Start(direct, kOneWayDelay),
                    "DelayProxy::Start");
  const std::string delayed = absl::StrCat("127.0.0.1:", proxy->port());
  const Inputs inputs = MakeInputs();
  const std::vector<float> expected = HostChain(inputs);
  std::printf("server: %s; proxy: %s one way\n",
              opserver_binary.empty() ? "in this process" : "child process",
              absl::FormatDuration(kOneWayDelay).c_str());
  for (int round = 0; round < 3; ++round) {
    ReportReplay(direct, "loopback", child.pid, inputs, expected);
    ReportReplay(delayed, "proxy", 0, inputs, expected);
  }
  if (child.pid > 0) {
    kill(child.pid, SIGTERM);
    waitpid(child.pid, nullptr, 0);
    std::remove(child_out.c_str());
  }
  return 0;
}

// --chain=... --replay: the graph rows through the chain, `rounds` rounds:
// the step eager and replayed on the front (--device=ascend, whose device
// captures the graph with libaclnn_remote.so's aclmdlRI, so a replay is one
// replay_graph on the backend), and the same directly on the backend.
int ChainReplayMain(const std::string& spec, int rounds) {
  absl::StatusOr<std::unique_ptr<bench::Chain>> chain =
      bench::Chain::Start(spec);
  if (!chain.ok()) Die(absl::StrCat("--chain: ", chain.status().ToString()));
  const Inputs inputs = MakeInputs();
  const std::vector<float> expected = HostChain(inputs);
  std::printf(
      "step_bench --chain --replay: %d dependent operators on %lld-element "
      "fp32 tensors, C++ client, median of %d steps after %d; eager = %d "
      "launches + one synchronize, replayed = one replay_graph + one "
      "synchronize.\n",
      kOps, static_cast<long long>(kElements), kSteps, kWarmupSteps, kOps);
  for (int round = 0; round < rounds; ++round) {
    for (const bool front : {false, true}) {
      const std::string& address =
          front ? (*chain)->front() : (*chain)->backend();
      ReplayResult r = RunReplayComparison(address, inputs, expected, 0);
      std::printf(
          "round %d %-22s eager step %8.2f ms, replayed step %8.2f ms: "
          "replay/eager %.3f%s\n",
          round + 1, front ? "ascend (chain front)" : "cpu (backend)",
          r.eager_us / 1000, r.replay_us / 1000, r.replay_us / r.eager_us,
          front ? (r.replay_us <= 0.5 * r.eager_us ? " (target <= 0.5: met)"
                                                   : " (target <= 0.5: MISSED)")
                : "");
      std::fflush(stdout);
    }
  }
  return 0;
}

// --callbacks: see the top of this file. One batch: `launches` launches of
// a repeatable 16-element executor on `stream`, with a NO_BLOCK callback
// after each when `callbacks`, then one synchronize; microseconds.
double CallbackBatchUs(aclOpExecutor* executor, aclrtStream stream,
                       int launches, bool callbacks, std::atomic<int>* ran) {
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < launches; ++i) {
    CHECK_ACL(aclnnThresholdBackward(nullptr, 0, executor, stream));
    if (callbacks) {
      CHECK_ACL(aclrtLaunchCallback(
          +[](void* count) { ++*static_cast<std::atomic<int>*>(count); }, ran,
          ACL_CALLBACK_NO_BLOCK, stream));
    }
  }
  CHECK_ACL(aclrtSynchronizeStream(stream));
  return Micros(Clock::now() - start);
}

int CallbacksMain() {
  constexpr int kLaunches = 1000;
  constexpr int kBatches = 7;  // The first is a warm-up.
  constexpr int kQueries = 100000;
  Options options;
  options.listen = "127.0.0.1:0";
  options.detect_mutex_deadlocks = false;
  auto server = Server::Start(options);
  if (!server.ok())
    Die(absl::StrCat("Server::Start: ", server.status().ToString()));
  setenv("OPSERVER_ADDRESS", (*server)->address().c_str(), 1);
  setenv("OPSERVER_PIPELINE", "1", 1);
  CHECK_ACL(aclInit(nullptr));
  CHECK_ACL(aclrtSetDevice(0));
  aclrtStream stream = nullptr;
  CHECK_ACL(aclrtCreateStream(&stream));
  // MindSpore's callback thread: subscribed, pumping its reports.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> thread_id{0};
  std::thread pump([&] {
    thread_id = static_cast<uint64_t>(pthread_self());
    while (!stop) {
      const aclError ret = aclrtProcessReport(100);
      if (ret != ACL_SUCCESS && ret != ACL_ERROR_RT_REPORT_TIMEOUT &&
          ret != ACL_ERROR_RT_THREAD_SUBSCRIBE) {
        Die(absl::StrCat("aclrtProcessReport: ", ret));
      }
    }
  });
  while (thread_id == 0) std::this_thread::yield();
  CHECK_ACL(aclrtSubscribeReport(thread_id, stream));
  void* data = DeviceAlloc(16 * sizeof(float));
  aclTensor* t = Tensor(data, 16, ACL_FLOAT);
  float value = kThreshold;
  aclScalar* scalar = aclCreateScalar(&value, ACL_FLOAT);
  uint64_t workspace_bytes = 0;
  aclOpExecutor* executor = nullptr;
  CHECK_ACL(aclnnThresholdBackwardGetWorkspaceSize(
      t, t, scalar, t, &workspace_bytes, &executor));
  CHECK_ACL(aclSetAclOpExecutorRepeatable(executor));
  const double rtt = RoundTripUs(stream);
  std::atomic<int> ran{0};
  std::vector<double> alone, with;
  for (int batch = 0; batch < kBatches; ++batch) {
    const double a = CallbackBatchUs(executor, stream, kLaunches, false, &ran);
    const double w = CallbackBatchUs(executor, stream, kLaunches, true, &ran);
    if (batch > 0) {
      alone.push_back(a);
      with.push_back(w);
    }
  }
  // NO_BLOCK: the synchronize does not wait for the functions; they are
  // all counted before the thread stops.
  while (ran < kBatches * kLaunches) std::this_thread::yield();
  // The stream is idle now, and the library knows it (the synchronize
  // found it so).
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < kQueries; ++i) {
    aclrtStreamStatus status = ACL_STREAM_STATUS_NOT_READY;
    CHECK_ACL(aclrtStreamQuery(stream, &status));
    if (status != ACL_STREAM_STATUS_COMPLETE) Die("an idle stream not ready");
  }
  const double query_us = Micros(Clock::now() - start) / kQueries;
  const double extra_us = (Median(with) - Median(alone)) / kLaunches;
  std::printf(
      "loopback RTT (mean idle aclrtSynchronizeStream): %.1f us\n"
      "%d launches + %d NO_BLOCK callbacks + 1 synchronize: median %.2f ms; "
      "the launches alone: median %.2f ms (%d batches each)\n"
      "cost per callback: %.2f us = %.3f round trips (target <= 0.1)\n"
      "aclrtStreamQuery on a known-idle stream: %.3f us = %.4f round trips "
      "(%d queries; target: none)\n",
      rtt, kLaunches, kLaunches, Median(with) / 1000, Median(alone) / 1000,
      kBatches - 1, extra_us, extra_us / rtt, query_us, query_us / rtt,
      kQueries);
  CHECK_ACL(aclrtUnSubscribeReport(thread_id, stream));
  stop = true;
  pump.join();
  CHECK_ACL(aclDestroyAclOpExecutor(executor));
  aclDestroyScalar(scalar);
  aclDestroyTensor(t);
  CHECK_ACL(aclrtFree(data));
  CHECK_ACL(aclrtDestroyStream(stream));
  CHECK_ACL(aclrtResetDevice(0));
  CHECK_ACL(aclFinalize());
  return 0;
}

// --discovery: aclInit, aclrtSetDevice(0), two buffers, one
// ThresholdBackward planned and launched, synchronized, in microseconds
// (aclFinalize after, not counted).
double FirstLaunchUs() {
  const Clock::time_point start = Clock::now();
  CHECK_ACL(aclInit(nullptr));
  CHECK_ACL(aclrtSetDevice(0));
  aclrtStream stream = nullptr;
  CHECK_ACL(aclrtCreateStream(&stream));
  void* data = DeviceAlloc(16 * sizeof(float));
  aclTensor* t = Tensor(data, 16, ACL_FLOAT);
  float value = kThreshold;
  aclScalar* scalar = aclCreateScalar(&value, ACL_FLOAT);
  uint64_t workspace_bytes = 0;
  aclOpExecutor* executor = nullptr;
  CHECK_ACL(aclnnThresholdBackwardGetWorkspaceSize(
      t, t, scalar, t, &workspace_bytes, &executor));
  CHECK_ACL(aclnnThresholdBackward(nullptr, 0, executor, stream));
  CHECK_ACL(aclrtSynchronizeStream(stream));
  const double us = Micros(Clock::now() - start);
  aclDestroyScalar(scalar);
  aclDestroyTensor(t);
  CHECK_ACL(aclrtFree(data));
  CHECK_ACL(aclrtDestroyStream(stream));
  CHECK_ACL(aclrtResetDevice(0));
  CHECK_ACL(aclFinalize());
  return us;
}

int DiscoveryMain(const std::string& opserver_binary, int rounds) {
  constexpr int kServers = 8;
  char dir_template[] = "/tmp/step_bench_discovery.XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) Die("mkdtemp failed");
  absl::StatusOr<process::EtcdProcess> etcd = process::StartEtcd(dir);
  if (!etcd.ok()) Die(absl::StrCat("etcd: ", etcd.status().ToString()));
  const std::string pool = absl::StrCat("etcd://", etcd->endpoint, "/bench");
  std::vector<pid_t> servers;
  std::vector<std::string> addresses;
  for (int i = 0; i < kServers; ++i) {
    process::OpserverLaunch launch;
    launch.binary = opserver_binary;
    launch.flags = {"--threads=1", "--register=" + pool};
    launch.out_path = absl::StrCat(dir, "/server", i, ".out");
    launch.err_path = absl::StrCat(dir, "/server", i, ".err");
    absl::StatusOr<process::OpserverProcess> server =
        process::StartOpserver(launch);
    if (!server.ok())
      Die(absl::StrCat("opserver: ", server.status().ToString()));
    servers.push_back(server->pid);
    addresses.push_back(server->address);
  }
  // The fixed list in the pool's order, so ordinal 0 is the same server.
  std::sort(addresses.begin(), addresses.end());
  const std::string list = absl::StrJoin(addresses, ",");
  struct Row {
    const char* name;
    std::string address;
    const char* claim;
    std::vector<double> us;
  };
  Row rows[] = {{"fixed list of 8 addresses", list, "", {}},
                {"etcd:// (8 registered)", pool, "", {}},
                {"etcd:// + OPSERVER_CLAIM=1", pool, "1", {}}};
  const int samples = std::max(20, rounds * 10);
  setenv("OPSERVER_PIPELINE", "1", 1);
  for (int i = 0; i < samples + 1; ++i) {  // The first is a warm-up.
    for (Row& row : rows) {
      setenv("OPSERVER_ADDRESS", row.address.c_str(), 1);
      setenv("OPSERVER_CLAIM", row.claim, 1);
      const double us = FirstLaunchUs();
      if (i > 0) row.us.push_back(us);
    }
  }
  std::printf(
      "aclInit to the first launch's synchronize (aclInit, aclrtSetDevice(0), "
      "aclrtCreateStream, aclrtMalloc, ThresholdBackward planned + launched, "
      "aclrtSynchronizeStream), %d opservers of one device each on loopback, "
      "median (min) of %d, alternating:\n",
      kServers, samples);
  for (const Row& row : rows) {
    std::printf("  %-28s %8.2f ms (%.2f)\n", row.name, Median(row.us) / 1000,
                *std::min_element(row.us.begin(), row.us.end()) / 1000);
  }
  std::printf("  etcd discovery costs %.2f ms over the fixed list\n",
              (Median(rows[1].us) - Median(rows[0].us)) / 1000);
  for (pid_t pid : servers) {
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
  }
  process::StopEtcd(*etcd);
  // etcd's data and the servers' logs: nothing the figures need.
  std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  return 0;
}

int Main() {
  Options options;
  options.listen = "127.0.0.1:0";
  options.detect_mutex_deadlocks = false;  // As the opserver binary runs.
  auto server = Server::Start(options);
  if (!server.ok())
    Die(absl::StrCat("Server::Start: ", server.status().ToString()));
  const std::string direct = (*server)->address();
  auto proxy = bench::DelayProxy::Start(direct, kOneWayDelay);
  if (!proxy.ok())
    Die(absl::StrCat("DelayProxy::Start: ", proxy.status().ToString()));
  const std::string delayed = absl::StrCat("127.0.0.1:", (*proxy)->port());

  const Inputs inputs = MakeInputs();
  const std::vector<float> expected = HostChain(inputs);
  const int64_t nonzero = std::count_if(expected.begin(), expected.end(),
                                        [](float v) { return v != 0.0f; });
  float largest = 0;
  float smallest = INFINITY;
  for (float v : expected) {
    if (v != 0.0f) {
      largest = std::max(largest, std::fabs(v));
      smallest = std::min(smallest, std::fabs(v));
    }
  }

  std::printf(
      "step_bench: %d dependent operators (%s, %s, %s, %s, %s in turn) on "
      "%lld-element fp32 tensors, 3 aclCreateTensor + GetWorkspaceSize + "
      "launch each, one aclrtSynchronizeStream per step.\n"
      "Server: in-process opserver, CPU device, %s. Proxy: %s one way.\n"
      "Result checked bit for bit against the host chain after every step "
      "(%lld of %lld elements non-zero, |x| in [%g, %g]).\n\n",
      kOps, kOpNames[0], kOpNames[1], kOpNames[2], kOpNames[3], kOpNames[4],
      static_cast<long long>(kElements), direct.c_str(),
      absl::FormatDuration(kOneWayDelay).c_str(),
      static_cast<long long>(nonzero), static_cast<long long>(kElements),
      smallest, largest);
  std::fflush(stdout);

  // What counting metrics costs: the same pipelined loopback step against
  // a second server that counts nothing, alternating, three rounds each.
  Options uncounted_options = options;
  uncounted_options.metrics = false;
  auto uncounted = Server::Start(uncounted_options);
  if (!uncounted.ok()) {
    Die(absl::StrCat("Server::Start: ", uncounted.status().ToString()));
  }
  std::vector<double> counted_us, uncounted_us, counted_rate, uncounted_rate;
  for (int round = 0; round < 3; ++round) {
    Result on = RunConfiguration("loopback", direct, "1", inputs, expected);
    Result off = RunConfiguration("loopback", (*uncounted)->address(), "1",
                                  inputs, expected);
    counted_us.push_back(on.step_median_us);
    uncounted_us.push_back(off.step_median_us);
    counted_rate.push_back(on.launches_per_s);
    uncounted_rate.push_back(off.launches_per_s);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "metrics A/B (loopback, pipelined, median of 3 alternating rounds): "
      "step %.2f ms counted vs %.2f ms not (%.3fx); launches/s %.0f vs %.0f "
      "(%.3fx)\n\n",
      median(counted_us) / 1000, median(uncounted_us) / 1000,
      median(counted_us) / median(uncounted_us), median(counted_rate),
      median(uncounted_rate), median(counted_rate) / median(uncounted_rate));
  std::fflush(stdout);

  for (const auto& [path, address] :
       {std::pair<const char*, std::string>{"loopback", direct},
        {"proxy 250us", delayed}}) {
    const CopyResult copies = AsyncCopies(address);
    std::printf(
        "aclrtMemcpyAsync, 1000 x 4 KiB host to device + one synchronize "
        "(%s, median of 5): %.2f us per copy = %.3f round trips (RTT %.1f "
        "us)\n",
        path, copies.per_copy_us, copies.per_copy_us / copies.round_trip_us,
        copies.round_trip_us);
  }
  std::printf("\n");
  std::fflush(stdout);

  std::vector<Result> results;
  for (const char* pipeline : {"0", "1"}) {
    results.push_back(
        RunConfiguration("loopback", direct, pipeline, inputs, expected));
    results.push_back(
        RunConfiguration("proxy 250us", delayed, pipeline, inputs, expected));
  }
  // The same step over two streams, a record and a wait every kBlock
  // operators: events must cost no round trip.
  results.push_back(RunConfiguration("loopback", direct, "1", inputs, expected,
                                     /*two_streams=*/true));
  results.push_back(RunConfiguration("proxy 250us", delayed, "1", inputs,
                                     expected, /*two_streams=*/true));

  std::printf("%-19s %-8s %9s %11s %11s %11s %9s %8s %11s   %s\n", "path",
              "PIPELINE", "RTT us", "step ms", "min ms", "max ms", "us/op",
              "RT/op", "launches/s",
              "target: step <= 3 RTT + 250 x loopback us/op");
  double loopback_per_op = 0;
  for (const Result& r : results) {
    const double per_op = r.step_median_us / kOps;
    std::string target = "-";
    if (r.path == "loopback" || r.path == "loopback events") {
      loopback_per_op = per_op;
    } else {
      const double target_us = 3 * r.round_trip_us + kOps * loopback_per_op;
      target = absl::StrFormat("%.2f ms: %s (%.1fx)", target_us / 1000,
                               r.step_median_us <= target_us ? "met" : "MISSED",
                               r.step_median_us / target_us);
    }
    std::printf(
        "%-19s %-8s %9.1f %11.2f %11.2f %11.2f %9.1f %8.2f %11.0f   %s\n",
        r.path.c_str(), r.pipeline.c_str(), r.round_trip_us,
        r.step_median_us / 1000, r.step_min_us / 1000, r.step_max_us / 1000,
        per_op, per_op / r.round_trip_us, r.launches_per_s, target.c_str());
  }
  std::printf(
      "\nstep: median of %d steps after %d warm-up steps; us/op = step / %d "
      "(the final synchronize included); RTT = mean idle "
      "aclrtSynchronizeStream over %d calls; RT/op = us/op / RTT (same "
      "configuration); launches/s = launches of one repeatable 16-element "
      "executor followed by one synchronize; \"events\": the step over two "
      "streams, blocks of %d operators alternating, each block waiting for "
      "the one before through aclrtRecordEvent + aclrtStreamWaitEvent.\n"
      "OPSERVER_PIPELINE is set before "
      "each aclInit; a "
      "client without the pipelined channel ignores it, and then its two "
      "rows measure the same unary path.\n",
      kSteps, kWarmupSteps, kOps, kRoundTrips, kBlock);
  std::printf("\n");
  ReportReplay(direct, "loopback", 0, inputs, expected);
  ReportReplay(delayed, "proxy", 0, inputs, expected);
  return 0;
}

}  // namespace
}  // namespace opserver

int main(int argc, char** argv) {
  std::string chain;
  std::string addresses;
  int rounds = 2;
  bool replay = false;
  std::string replay_server;
  bool callbacks = false;
  std::string discovery;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--chain=", 0) == 0) {
      chain = arg.substr(strlen("--chain="));
    } else if (arg.rfind("--addresses=", 0) == 0) {
      addresses = arg.substr(strlen("--addresses="));
    } else if (arg == "--replay") {
      replay = true;
    } else if (arg.rfind("--replay=", 0) == 0) {
      replay = true;
      replay_server = arg.substr(strlen("--replay="));
    } else if (arg == "--callbacks") {
      callbacks = true;
    } else if (arg.rfind("--discovery=", 0) == 0) {
      discovery = arg.substr(strlen("--discovery="));
    } else if (arg.rfind("--rounds=", 0) == 0) {
      rounds = std::max(1, std::atoi(arg.c_str() + strlen("--rounds=")));
    } else {
      std::fprintf(stderr,
                   "usage: step_bench [--replay[=OPSERVER] | --callbacks | "
                   "--discovery=OPSERVER [--rounds=N] | "
                   "--chain=OPSERVER,LIBACLNN_REMOTE [--replay] [--rounds=N] | "
                   "--addresses=NAME=HOST:PORT,... [--rounds=N]]\n");
      return 2;
    }
  }
  if (!chain.empty() && replay) {
    return opserver::ChainReplayMain(chain, rounds);
  }
  if (!chain.empty()) return opserver::ChainMain(chain, rounds);
  if (!addresses.empty()) return opserver::AddressesMain(addresses, rounds);
  if (replay) return opserver::ReplayMain(replay_server);
  if (callbacks) return opserver::CallbacksMain();
  if (!discovery.empty()) return opserver::DiscoveryMain(discovery, rounds);
  return opserver::Main();
}
