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
//
// The parts: step_workload (the step, its inputs and the host's check),
// step_configurations (one configuration through the C API, copies,
// --addresses and --chain), step_replay (the graph rows), step_callbacks
// and step_discovery.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/delay_proxy.h"
#include "bench/step_callbacks.h"
#include "bench/step_configurations.h"
#include "bench/step_discovery.h"
#include "bench/step_replay.h"
#include "bench/step_workload.h"
#include "server/server.h"

namespace opserver::step_bench {
namespace {

// The run's opening lines: the step, the server, the proxy, and how much
// of the host chain's result is non-zero (a check of zeros proves little).
void PrintHeader(const std::string& direct,
                 const std::vector<float>& expected) {
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
}

// What counting metrics costs: the same pipelined loopback step against
// a second server (of `options` without metrics) that counts nothing,
// alternating, three rounds each.
void MetricsAB(const Options& options, const std::string& direct,
               const Inputs& inputs, const std::vector<float>& expected) {
  Options uncounted_options = options;
  uncounted_options.metrics = false;
  std::unique_ptr<Server> uncounted =
      Must(Server::Start(uncounted_options), "Server::Start");
  std::vector<double> counted_us, uncounted_us, counted_rate, uncounted_rate;
  for (int round = 0; round < 3; ++round) {
    Result on = RunConfiguration("loopback", direct, "1", inputs, expected);
    Result off = RunConfiguration("loopback", uncounted->address(), "1", inputs,
                                  expected);
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
}

void PrintAsyncCopies(const std::string& direct, const std::string& delayed) {
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
}

// The table of the configurations, each through the proxy against the
// target the loopback row before it sets.
void PrintResults(const std::vector<Result>& results) {
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
}

int Main() {
  Options options;
  options.listen = "127.0.0.1:0";
  options.detect_mutex_deadlocks = false;  // As the opserver binary runs.
  std::unique_ptr<Server> server =
      Must(Server::Start(options), "Server::Start");
  const std::string direct = server->address();
  auto proxy = bench::DelayProxy::Start(direct, kOneWayDelay);
  if (!proxy.ok())
    Die(absl::StrCat("DelayProxy::Start: ", proxy.status().ToString()));
  const std::string delayed = absl::StrCat("127.0.0.1:", (*proxy)->port());

  const Inputs inputs = MakeInputs();
  const std::vector<float> expected = HostChain(inputs);
  PrintHeader(direct, expected);
  MetricsAB(options, direct, inputs, expected);
  PrintAsyncCopies(direct, delayed);

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
  PrintResults(results);
  std::printf("\n");
  ReportReplay(direct, "loopback", 0, inputs, expected);
  ReportReplay(delayed, "proxy", 0, inputs, expected);
  return 0;
}

}  // namespace
}  // namespace opserver::step_bench

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
    return opserver::step_bench::ChainReplayMain(chain, rounds);
  }
  if (!chain.empty()) return opserver::step_bench::ChainMain(chain, rounds);
  if (!addresses.empty())
    return opserver::step_bench::AddressesMain(addresses, rounds);
  if (replay) return opserver::step_bench::ReplayMain(replay_server);
  if (callbacks) return opserver::step_bench::CallbacksMain();
  if (!discovery.empty())
    return opserver::step_bench::DiscoveryMain(discovery, rounds);
  return opserver::step_bench::Main();
}
