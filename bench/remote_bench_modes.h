// remote_bench's modes run instead of the Google Benchmark suite (see the
// top of remote_bench.cc): the server's RSS over a 1 GiB transfer (before
// the suite), --window_curve, --paired and --chain.
#ifndef OPSERVER_BENCH_REMOTE_BENCH_MODES_H_
#define OPSERVER_BENCH_REMOTE_BENCH_MODES_H_

#include <sys/types.h>

#include <string>

namespace opserver::remote_bench {

// Peak RSS growth of the fresh opserver `pid` (on `port`) while a 1 GiB
// tensor is uploaded and downloaded through the client library; printed.
void MeasureServerRss(pid_t pid, int port);
// --window_curve: per window of curve_servers, the peak RSS growth of an
// upload of 1 GiB and library uploads next to raw TCP; a Markdown table.
void WindowCurve();
// --paired=N: N rounds of raw TCP next to each transfer (library and C
// API, both ways), each divided by the raw TCP just before it.
void PairedRatios(int rounds);
// --chain=OPSERVER,LIBACLNN_REMOTE: the Ascend device over its verification
// chain against its CPU backend directly, transfers and (`operators`)
// operators.
void ChainRatios(const std::string& spec, int rounds, bool operators);

}  // namespace opserver::remote_bench

#endif  // OPSERVER_BENCH_REMOTE_BENCH_MODES_H_
