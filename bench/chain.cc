#include "bench/chain.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "testing/metrics_scrape.h"
#include "testing/opserver_process.h"

namespace opserver::bench {

absl::StatusOr<process::OpserverProcess> Chain::Spawn(
    const std::string& binary, const std::string& name,
    const std::vector<std::string>& flags,
    const std::string& opserver_address) {
  const char* tmp = getenv("TMPDIR");
  std::string dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  std::string out_template = dir + "/chain_" + name + "_XXXXXX";
  int out_fd = mkstemp(out_template.data());
  if (out_fd < 0) return absl::InternalError("mkstemp failed");
  close(out_fd);
  process::OpserverLaunch launch;
  launch.binary = binary;
  launch.flags = {"--idle_timeout_s=3600"};
  launch.flags.insert(launch.flags.end(), flags.begin(), flags.end());
  launch.opserver_address = opserver_address;
  launch.out_path = out_template;
  absl::StatusOr<process::OpserverProcess> started =
      process::StartOpserver(launch);
  unlink(out_template.c_str());
  if (!started.ok()) {
    return absl::Status(
        started.status().code(),
        absl::StrCat(name, " opserver: ", started.status().message()));
  }
  return started;
}

absl::StatusOr<std::unique_ptr<Chain>> Chain::Start(const std::string& spec) {
  std::vector<std::string> paths = absl::StrSplit(spec, ',');
  if (paths.size() < 2) {
    return absl::InvalidArgumentError(
        "--chain wants OPSERVER,LIBACLNN_REMOTE[,FRONT_FLAG...]");
  }
  std::vector<std::string> front_flags = {
      "--device=ascend", "--cann_libraries=" + process::Absolute(paths[1])};
  front_flags.insert(front_flags.end(), paths.begin() + 2, paths.end());
  const std::string opserver = process::Absolute(paths[0]);
  std::unique_ptr<Chain> chain(new Chain);
  chain->cann_library_ = paths[1];
  absl::StatusOr<process::OpserverProcess> backend =
      Spawn(opserver, "backend", {"--device=cpu"}, "");
  if (!backend.ok()) return backend.status();
  chain->backend_ = *backend;
  absl::StatusOr<process::OpserverProcess> front =
      Spawn(opserver, "front", front_flags, chain->backend_.address);
  if (!front.ok()) return front.status();
  chain->front_ = *front;
  return chain;
}

Chain::~Chain() {
  for (pid_t pid : {front_.pid, backend_.pid}) {
    if (pid <= 0) continue;
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
  }
}

BackendCounts ScrapeCounts(const std::string& metrics_address) {
  const std::string page = scrape::Metrics(metrics_address);
  BackendCounts counts;
  counts.fences = scrape::Sum(page, "opserver_pipeline_commands_total",
                              "command=\"fence\"");
  counts.launches = scrape::Sum(page, "opserver_pipeline_commands_total",
                                "command=\"launch\"");
  counts.batches = scrape::Sum(page, "opserver_pipeline_batches_total");
  counts.unary_calls =
      scrape::Sum(page, "grpc_server_call_started_total") -
      scrape::Sum(page, "grpc_server_call_started_total", "/Pipeline");
  counts.synchronizes =
      scrape::Sum(page, "grpc_server_call_started_total", "/SynchronizeStream");
  return counts;
}

BackendCounts operator-(const BackendCounts& a, const BackendCounts& b) {
  BackendCounts d;
  d.fences = a.fences - b.fences;
  d.unary_calls = a.unary_calls - b.unary_calls;
  d.synchronizes = a.synchronizes - b.synchronizes;
  d.launches = a.launches - b.launches;
  d.batches = a.batches - b.batches;
  return d;
}

}  // namespace opserver::bench
