// step_bench's graph rows: the step through the C++ client eagerly and as
// a graph defined once and replayed, in the same run, against the
// in-process launch cost of the same operators (see the top of
// step_bench.cc).
#ifndef OPSERVER_BENCH_STEP_REPLAY_H_
#define OPSERVER_BENCH_STEP_REPLAY_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "bench/step_workload.h"

namespace opserver::step_bench {

// One row: the replay against eager on `address` (`path` names it),
// printed; `server_pid` > 0: the server is that child process, whose CPU
// is measured too.
void ReportReplay(const std::string& address, const char* path,
                  pid_t server_pid, const Inputs& inputs,
                  const std::vector<float>& expected);

// --replay[=OPSERVER]: the graph rows, three rounds, on loopback and
// through the delay proxy. With an opserver binary the server is a child
// process, so its CPU is measured apart from the client's; without one it
// runs in this process.
int ReplayMain(const std::string& opserver_binary);

// --chain=... --replay: the graph rows through the chain, `rounds` rounds:
// the step eager and replayed on the front (--device=ascend, whose device
// captures the graph with libaclnn_remote.so's aclmdlRI, so a replay is one
// replay_graph on the backend), and the same directly on the backend.
int ChainReplayMain(const std::string& spec, int rounds);

}  // namespace opserver::step_bench

#endif  // OPSERVER_BENCH_STEP_REPLAY_H_
