// step_bench --discovery=OPSERVER (see the top of step_bench.cc): aclInit
// to the first launch with etcd discovery of eight registered opservers,
// against a fixed address list.
#ifndef OPSERVER_BENCH_STEP_DISCOVERY_H_
#define OPSERVER_BENCH_STEP_DISCOVERY_H_

#include <string>

namespace opserver::step_bench {

int DiscoveryMain(const std::string& opserver_binary, int rounds);

}  // namespace opserver::step_bench

#endif  // OPSERVER_BENCH_STEP_DISCOVERY_H_
