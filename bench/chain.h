// The Ascend device's verification chain as benchmark processes: a backend
// opserver on the CPU device and a front opserver on --device=ascend whose
// "CANN" is libaclnn_remote.so (forwarding to the backend through
// OPSERVER_ADDRESS), both on loopback, on free ports (port 0, addresses read
// from their "listening on" lines), as tests/ascend_chain_test.cc starts
// them. step_bench and remote_bench take --chain=OPSERVER,LIBACLNN_REMOTE
// and measure the front against the backend directly in the same run.
#ifndef OPSERVER_BENCH_CHAIN_H_
#define OPSERVER_BENCH_CHAIN_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "testing/opserver_process.h"

namespace opserver::bench {

class Chain {
 public:
  // `spec` is "OPSERVER,LIBACLNN_REMOTE[,FLAG...]" (paths; relative ones
  // are taken from the current directory; FLAGs are the front's own, e.g.
  // --staging_chunk_bytes=N). Starts the backend, then the front.
  static absl::StatusOr<std::unique_ptr<Chain>> Start(const std::string& spec);
  // SIGTERM to both, then waits for them.
  ~Chain();

  // HOST:PORT of each server's gRPC and /metrics.
  const std::string& backend() const { return backend_.address; }
  const std::string& front() const { return front_.address; }
  const std::string& backend_metrics() const { return backend_.metrics; }
  const std::string& front_metrics() const { return front_.metrics; }
  // The front's CANN library, as named in `spec` (libaclnn_remote.so, or
  // another CANN such as the fake one).
  const std::string& cann_library() const { return cann_library_; }

 private:
  static absl::StatusOr<process::OpserverProcess> Spawn(
      const std::string& binary, const std::string& name,
      const std::vector<std::string>& flags,
      const std::string& opserver_address);
  process::OpserverProcess backend_;
  process::OpserverProcess front_;
  std::string cann_library_;
};

// What a backend did, from its /metrics: the calls a front (or any client)
// can wait on.
struct BackendCounts {
  double fences = 0;        // Pipeline fence commands (each a wait).
  double unary_calls = 0;   // gRPC calls other than Pipeline.
  double synchronizes = 0;  // Of which SynchronizeStream.
  double launches = 0;      // Pipeline launch commands.
  double batches = 0;       // Pipeline messages applied.
  double Waits() const { return fences + unary_calls; }
};
BackendCounts ScrapeCounts(const std::string& metrics_address);
BackendCounts operator-(const BackendCounts& a, const BackendCounts& b);

}  // namespace opserver::bench

#endif  // OPSERVER_BENCH_CHAIN_H_
