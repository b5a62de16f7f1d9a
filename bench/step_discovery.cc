#include "bench/step_discovery.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "bench/step_workload.h"
#include "testing/etcd_process.h"
#include "testing/opserver_process.h"

namespace opserver::step_bench {
namespace {

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
  const ThresholdCall call = PlanThreshold(data, /*repeatable=*/false);
  CHECK_ACL(aclnnThresholdBackward(nullptr, 0, call.executor, stream));
  CHECK_ACL(aclrtSynchronizeStream(stream));
  const double us = Micros(Clock::now() - start);
  DestroyThreshold(call);
  CHECK_ACL(aclrtFree(data));
  CHECK_ACL(aclrtDestroyStream(stream));
  CHECK_ACL(aclrtResetDevice(0));
  CHECK_ACL(aclFinalize());
  return us;
}

}  // namespace

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

}  // namespace opserver::step_bench
