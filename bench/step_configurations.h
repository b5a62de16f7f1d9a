// The step through the C API: one configuration (an address and
// OPSERVER_PIPELINE, a fresh aclInit .. aclFinalize) timed and checked,
// pipelined small and large copies, and the --addresses and --chain modes
// built on them (see the top of step_bench.cc).
#ifndef OPSERVER_BENCH_STEP_CONFIGURATIONS_H_
#define OPSERVER_BENCH_STEP_CONFIGURATIONS_H_

#include <string>
#include <vector>

#include "bench/chain.h"
#include "bench/step_workload.h"

namespace opserver::step_bench {

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
                        int rate_launches = 0);

// 1,000 aclrtMemcpyAsync of 4 KiB host to device and one synchronize,
// through the C API on `address`, pipelined: the median of 5 such batches
// per copy, and the idle round trip of the same stream.
struct CopyResult {
  double round_trip_us = 0;
  double per_copy_us = 0;
};
CopyResult AsyncCopies(const std::string& address);

// A 256 MiB aclrtMemcpy each way through the C API on `address`: the
// median of 3 after one warm-up, in ms, the bytes checked after each.
struct CopyTimes {
  double upload_ms = 0;
  double download_ms = 0;
};
CopyTimes BigCopies(const std::string& address);

// --addresses=NAME=HOST:PORT,...: the pipelined step (all five operators in
// turn) and a 256 MiB copy each way against each named server, the
// addresses alternating, `rounds` rounds: e.g. an opserver directly and
// the same through a proxy (bench/haproxy_bench.sh). The environment
// (OPSERVER_DATA_PATH, ...) applies as to any C API program.
int AddressesMain(const std::string& spec, int rounds);

// --chain=OPSERVER,LIBACLNN_REMOTE: the step against the Ascend device over
// the chain (a front opserver on --device=ascend with libaclnn_remote.so as
// its CANN, backed by a CPU opserver) and against that backend directly,
// alternating, `rounds` rounds, for the five operators in turn and for each
// operator alone. Reported per operator: us per launch on each, the
// front's added cost in us and in backend round trips (the backend's idle
// aclrtSynchronizeStream measured in the same configuration), and the
// calls the backend was asked to answer per launch (fences and unary
// calls: the round trips the front may have waited on).
int ChainMain(const std::string& spec, int rounds);

}  // namespace opserver::step_bench

#endif  // OPSERVER_BENCH_STEP_CONFIGURATIONS_H_
