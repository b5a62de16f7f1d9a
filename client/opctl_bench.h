// opctl bench: transfer throughput against a raw TCP reference, each
// operator's latency, and a backward step pipelined and with unary calls.
#ifndef OPSERVER_CLIENT_OPCTL_BENCH_H_
#define OPSERVER_CLIENT_OPCTL_BENCH_H_

#include <string>
#include <vector>

#include "client/opctl_command.h"

namespace opserver::remote::opctl {

// Prints bench's usage (no server needed) and returns 0.
int BenchHelp();

// `opctl bench [--bytes=N] [--iterations=N] [--elements=N] [--device=N]`
// (`raw`: what follows "bench").
int Bench(const Connector& connect, const std::vector<std::string>& raw);

}  // namespace opserver::remote::opctl

#endif  // OPSERVER_CLIENT_OPCTL_BENCH_H_
