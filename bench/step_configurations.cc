#include "bench/step_configurations.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace opserver::step_bench {
namespace {

// The step's buffers on the current device, the inputs uploaded.
Device UploadInputs(const Inputs& inputs) {
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
  return device;
}

void FreeDevice(Device& device) {
  CHECK_ACL(aclrtFree(device.grad));
  CHECK_ACL(aclrtFree(device.ping_pong[0]));
  CHECK_ACL(aclrtFree(device.ping_pong[1]));
  CHECK_ACL(aclrtFree(device.selfs));
  CHECK_ACL(aclrtFree(device.masks));
  if (device.workspace != nullptr) CHECK_ACL(aclrtFree(device.workspace));
}

// The streams a step runs on: one, or two and their events.
struct StepStreams {
  aclrtStream stream = nullptr;
  aclrtStream second = nullptr;  // Two streams only.
  aclrtEvent events[2] = {};
};

// kWarmupSteps then kSteps timed steps, each checked against `expected`
// (outside the timed part); the step times and, with `backend_metrics`,
// what the backend was asked, into `result`.
void TimeSteps(Device& device, StepStreams& streams,
               const std::vector<float>& expected,
               const std::string& backend_metrics, Result* result) {
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
        LaunchStep(device, streams.stream, streams.second, streams.events)));
    const double elapsed = Micros(Clock::now() - start);
    if (timed && !backend_metrics.empty()) {
      const bench::BackendCounts d =
          bench::ScrapeCounts(backend_metrics) - before;
      result->backend.fences += d.fences;
      result->backend.unary_calls += d.unary_calls;
      result->backend.synchronizes += d.synchronizes;
      result->backend.launches += d.launches;
      result->backend.batches += d.batches;
      result->launches += kOps;
    }
    CheckResult(device, expected);  // Outside the timed part.
    if (timed) steps.push_back(elapsed);
  }
  result->step_median_us = Median(steps);
  result->step_min_us = *std::min_element(steps.begin(), steps.end());
  result->step_max_us = *std::max_element(steps.begin(), steps.end());
}

// One operator of --chain (or all five in turn, `only` -1): `rounds`
// rounds on the backend and the front, a row each.
struct ChainSummary {
  std::string op;
  std::vector<double> cpu_us, front_us, rtt_us, added_rt, waits;
};

ChainSummary ChainOperator(bench::Chain& chain, int only, int rounds) {
  g_only_op = only;
  const Inputs inputs = MakeInputs();
  const std::vector<float> expected = HostChain(inputs);
  ChainSummary summary{only < 0 ? "all five in turn" : kOpNames[only]};
  for (int round = 0; round < rounds; ++round) {
    Result cpu = RunConfiguration("backend", chain.backend(), "1", inputs,
                                  expected, false, "", 20000);
    Result front =
        RunConfiguration("front", chain.front(), "1", inputs, expected, false,
                         chain.backend_metrics(), 20000);
    const double cpu_per_op = cpu.step_median_us / kOps;
    const double front_per_op = front.step_median_us / kOps;
    const double n = std::max(1, front.launches);
    for (const Result* r : {&cpu, &front}) {
      const bool is_front = r == &front;
      std::printf(
          "%-20s %-6d %-8s %9.1f %9.2f %9.1f %10s %10s %10s %10.0f\n",
          summary.op.c_str(), round + 1, is_front ? "ascend" : "cpu",
          r->round_trip_us, r->step_median_us / 1000, r->step_median_us / kOps,
          is_front ? absl::StrFormat("%.3f", r->backend.fences / n).c_str()
                   : "-",
          is_front ? absl::StrFormat("%.3f", r->backend.unary_calls / n).c_str()
                   : "-",
          is_front ? absl::StrFormat("%.3f", r->backend.batches / n).c_str()
                   : "-",
          r->launches_per_s);
    }
    std::fflush(stdout);
    summary.cpu_us.push_back(cpu_per_op);
    summary.front_us.push_back(front_per_op);
    summary.rtt_us.push_back(cpu.round_trip_us);
    summary.added_rt.push_back((front_per_op - cpu_per_op) / cpu.round_trip_us);
    summary.waits.push_back(front.backend.Waits() / n);
  }
  return summary;
}

// "A" when all of `v` are A, else "MIN-MAX", each in `format`.
std::string Range(std::vector<double> v, const char* format) {
  std::sort(v.begin(), v.end());
  return v.front() == v.back()
             ? absl::StrFormat(format, v.front())
             : absl::StrCat(absl::StrFormat(format, v.front()), "-",
                            absl::StrFormat(format, v.back()));
}

void PrintChainSummaries(const std::vector<ChainSummary>& summaries) {
  std::printf("\n%-20s %14s %14s %14s %16s %20s %s\n", "operator", "CPU us/op",
              "Ascend us/op", "backend RTT us", "added us/op",
              "added backend RT/op", "backend waits/launch (target <= 1)");
  for (const ChainSummary& s : summaries) {
    std::vector<double> added;
    for (size_t i = 0; i < s.cpu_us.size(); ++i) {
      added.push_back(s.front_us[i] - s.cpu_us[i]);
    }
    std::printf(
        "%-20s %14s %14s %14s %16s %20s %s\n", s.op.c_str(),
        Range(s.cpu_us, "%.1f").c_str(), Range(s.front_us, "%.1f").c_str(),
        Range(s.rtt_us, "%.0f").c_str(), Range(added, "%.1f").c_str(),
        Range(s.added_rt, "%.2f").c_str(), Range(s.waits, "%.3f").c_str());
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
}

}  // namespace

Result RunConfiguration(const std::string& path, const std::string& address,
                        const std::string& pipeline, const Inputs& inputs,
                        const std::vector<float>& expected, bool two_streams,
                        const std::string& backend_metrics, int rate_launches) {
  setenv("OPSERVER_ADDRESS", address.c_str(), 1);
  setenv("OPSERVER_PIPELINE", pipeline.c_str(), 1);
  CHECK_ACL(aclInit(nullptr));
  CHECK_ACL(aclrtSetDevice(0));
  StepStreams streams;
  CHECK_ACL(aclrtCreateStream(&streams.stream));
  if (two_streams) {
    CHECK_ACL(aclrtCreateStream(&streams.second));
    CHECK_ACL(aclrtCreateEvent(&streams.events[0]));
    CHECK_ACL(aclrtCreateEvent(&streams.events[1]));
  }
  Device device = UploadInputs(inputs);

  Result result{two_streams ? path + " events" : path, pipeline};
  result.round_trip_us = RoundTripUs(streams.stream);
  TimeSteps(device, streams, expected, backend_metrics, &result);
  result.launches_per_s = LaunchRate(
      device.ping_pong[0], streams.stream,
      rate_launches > 0
          ? rate_launches
          : (pipeline == "1" ? 200000 : (path == "loopback" ? 5000 : 1000)));

  FreeDevice(device);
  if (two_streams) {
    CHECK_ACL(aclrtDestroyEvent(streams.events[0]));
    CHECK_ACL(aclrtDestroyEvent(streams.events[1]));
    CHECK_ACL(aclrtDestroyStream(streams.second));
  }
  CHECK_ACL(aclrtDestroyStream(streams.stream));
  CHECK_ACL(aclrtResetDevice(0));
  CHECK_ACL(aclFinalize());
  return result;
}

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
  std::vector<ChainSummary> summaries;
  for (int only = -1; only < 5; ++only) {
    summaries.push_back(ChainOperator(**chain, only, rounds));
  }
  PrintChainSummaries(summaries);
  return 0;
}

}  // namespace opserver::step_bench
