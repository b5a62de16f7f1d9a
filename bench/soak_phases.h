// The soak's phases once its server is up (soak.cc has the flags, the
// setup and their order): the load, the leak check, SIGTERM under load,
// and the verdicts on what they saw. Each fills its part of the
// RunSummary and appends what went wrong to its failures, in the order
// the report lists them.
#ifndef OPSERVER_BENCH_SOAK_PHASES_H_
#define OPSERVER_BENCH_SOAK_PHASES_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/soak_processes.h"
#include "bench/soak_report.h"
#include "bench/soak_scenarios.h"

namespace opserver::soak {

// What every phase needs, fixed before the load starts.
struct SoakRun {
  std::string self;     // This binary, for the fault children.
  std::string address;  // The server's gRPC address.
  pid_t pid = 0;        // The server's.
  bool secure = false;
  int clients = 0;
  absl::Duration duration;
  absl::Duration kill_interval;  // Zero: no fault children.
  uint64_t seed = 0;
  int idle_timeout_s = 0;
  int sigterm_clients = 0;
  Tenants tenants;          // Secure mode's tokens.
  std::string cert_dir;     // Secure mode's CA lives here.
  Conn* monitor = nullptr;  // GetServerStats goes through it.
};

// What the load leaves for the verdicts besides the summary.
struct LoadOutcome {
  absl::Time start;                 // Of the load; samples count from it.
  std::vector<ProcSample> samples;  // Through the load, end_of_load last.
  uint64_t killer_failures = 0;     // Fault children that did not die.
};

// The server's counters read into `sample` (sessions, buffers, bytes).
void SetCounts(const v1::ServerStats& stats, ProcSample* sample);

// Phase 2: --clients threads of scenarios for the duration, the killer's
// children and the sampler beside them, until every thread has ended.
LoadOutcome RunLoad(const SoakRun& run, Stats* stats, RunSummary* r);
// Phase 3: every session, buffer and byte gone, and the fds back to
// their idle count (not run when the server died).
void CheckLeaks(const SoakRun& run, const LoadOutcome& load, RunSummary* r);
// Phase 4: SIGTERM in the middle of fresh load, with an Attach call and
// a health Watch held across it; the server must exit 0 in time.
void SigtermUnderLoad(const SoakRun& run, Stats* shutdown_stats, RunSummary* r);
// The verdicts on the server's log, its RSS, the calls' outcomes and the
// transfers' paths.
void Judge(const SoakRun& run, const std::string& rss_check,
           const LoadOutcome& load, RunSummary* r);

}  // namespace opserver::soak

#endif  // OPSERVER_BENCH_SOAK_PHASES_H_
