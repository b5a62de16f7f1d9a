// The 250-operator backward step of step_bench, through the C++ client
// (remote::Session's typed calls) against a running server: the C++ side
// of bench/python_step_bench.py, which runs both against one server.
//
//   client_step --address=127.0.0.1:PORT [--steps=20]
//
// Prints one line: "cpp us_per_op=U rtt_us=R" (median step / 250, mean
// idle Synchronize).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/client.h"

ABSL_FLAG(std::string, address, "", "HOST:PORT of the server");
ABSL_FLAG(int, steps, 20, "Measured steps (after 3 warm-up steps)");

namespace opserver {
namespace {

constexpr int kOps = 250;
constexpr int64_t kElements = 4096;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

using remote::TensorDesc;

// Operator i of the step (the five in turn) from g into o.
absl::StatusOr<remote::Executor> PlanOp(remote::Session& s, int i,
                                        const TensorDesc& g,
                                        const TensorDesc& xd,
                                        const TensorDesc& md,
                                        const TensorDesc& o) {
  switch (i % 5) {
    case 0:
      return s.ThresholdBackward(g, xd, -3.875, o);
    case 1:
      return s.SoftshrinkBackward(g, xd, 0.0625, o);
    case 2:
      return s.HardswishBackward(g, xd, o);
    case 3:
      return s.LeakyReluBackward(g, xd, {kernels::DType::kFloat, 0.5}, false,
                                 o);
    default:
      return s.DropoutBackward(g, md, 1.0, o);
  }
}

// One step: kOps operators ping-ponging between bufs, one synchronize.
bool Step(remote::Session& s, const TensorDesc& xd, const TensorDesc& md,
          const TensorDesc (&bufs)[2]) {
  for (int i = 0; i < kOps; ++i) {
    absl::StatusOr<remote::Executor> e =
        PlanOp(s, i, bufs[i % 2], xd, md, bufs[(i + 1) % 2]);
    if (!e.ok() || !e->Execute().ok()) return false;
  }
  return s.Synchronize().ok();
}

int Run() {
  auto client = Client::Connect(absl::GetFlag(FLAGS_address));
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  auto session = (*client)->CreateSession("client_step");
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
    return 1;
  }
  remote::Session& s = **session;
  const uint64_t bytes = kElements * sizeof(float);
  auto x = s.Malloc(bytes);
  auto mask = s.Malloc(kElements / 8);
  auto a = s.Malloc(bytes);
  auto b = s.Malloc(bytes);
  if (!x.ok() || !mask.ok() || !a.ok() || !b.ok()) return 1;
  std::vector<float> self(kElements), ones(kElements, 1.0f);
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-4, 4);
  for (float& v : self) v = dist(rng);
  std::vector<uint8_t> keep(kElements / 8, 0xff);
  if (!s.Upload(x->handle(), 0, self.data(), bytes).ok() ||
      !s.Upload(mask->handle(), 0, keep.data(), keep.size()).ok() ||
      !s.Upload(a->handle(), 0, ones.data(), bytes).ok()) {
    return 1;
  }
  const TensorDesc xd =
      TensorDesc::Contiguous(x->handle(), kernels::DType::kFloat, {kElements});
  const TensorDesc md = TensorDesc::Contiguous(
      mask->handle(), kernels::DType::kUint8, {kElements / 8});
  const TensorDesc bufs[2] = {
      TensorDesc::Contiguous(a->handle(), kernels::DType::kFloat, {kElements}),
      TensorDesc::Contiguous(b->handle(), kernels::DType::kFloat, {kElements})};
  auto step = [&] { return Step(s, xd, md, bufs); };
  for (int i = 0; i < 3; ++i) {
    if (!step()) return 1;
  }
  std::vector<double> times;
  for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) {
    auto start = std::chrono::steady_clock::now();
    if (!step()) return 1;
    times.push_back(Seconds(std::chrono::steady_clock::now() - start));
  }
  std::sort(times.begin(), times.end());
  double rtt = 0;
  constexpr int kRoundTrips = 200;
  for (int i = 0; i < kRoundTrips; ++i) {
    auto start = std::chrono::steady_clock::now();
    if (!s.Synchronize().ok()) return 1;
    rtt += Seconds(std::chrono::steady_clock::now() - start);
  }
  std::printf("cpp us_per_op=%.3f rtt_us=%.2f\n",
              times[times.size() / 2] / kOps * 1e6, rtt / kRoundTrips * 1e6);
  return 0;
}

}  // namespace
}  // namespace opserver

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return opserver::Run();
}
