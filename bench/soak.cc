// Soak and faults: a bounded program that runs the real `opserver` binary as
// a child process on loopback and leans on it the way many careless, hostile
// and unlucky clients would, then checks that it is none the worse for it.
//
//   bazel run -c opt //bench:soak -- --clients=64 --duration=10m
//
// Phases (each bounded; a watchdog ends the program if one hangs):
//  1. Start `opserver --listen=127.0.0.1:0` (port read from its "listening
//     on" line) and sample its RSS, threads and fds while idle.
//  2. For --duration, --clients threads each loop over randomly chosen
//     scenarios that together call every RPC of Runtime, Operators and
//     grpc.health.v1: valid work whose results are checked against a host
//     reference (all five operators, every dtype, strided/broadcast/packed/
//     in-place layouts, workspaces, repeatable executors, ExecuteStream,
//     streams, transfers of up to 16 MiB), invalid requests made on purpose
//     (bad and foreign handles, bad shapes and dtypes, oversized requests,
//     bad ranges and uploads, ...), and calls abandoned mid-upload,
//     mid-download and mid-ExecuteStream (TryCancel, deadlines, CloseSession
//     under a running pipeline, cancelled Attach calls). Meanwhile a killer
//     thread starts child client processes (this binary in --fault_child
//     mode) every --kill_interval and SIGKILLs each in the middle of an
//     upload, a download or a pipeline, so the server sees real connection
//     resets. A quarter of the clients go through the C++ client library
//     instead, as its users do (pipelined sessions, the data path for
//     transfers of 4 MiB and more, transfers split over connections), and
//     an eighth are hostile (below). Every call's outcome is classified:
//     OK, an expected error (the category of invalid request or fault that
//     provoked it) or unexpected.
//  3. Clients end (closing, dropping their Attach call, or abandoning their
//     session to the idle reaper), then GetServerStats must reach zero
//     sessions, buffers and bytes, and the server's fds their idle count.
//  4. A fresh batch of load starts (--sigterm_clients threads of valid work,
//     two of them 64 MiB transfers paced to outlast the grace, plus an
//     Attach call and a health Watch held open), the server gets SIGTERM in
//     the middle of it, and must exit with status 0 within its shutdown
//     grace (5 s) + 3 s; the Attach must see "server shutting down" and the
//     Watch NOT_SERVING.
//
// Two modes (--mode):
//  - plain: no TLS and no tokens. The server's data path is on, so half the
//    library clients move large transfers over it (the other half split
//    them), and the hostile clients flood the data port with connections
//    that send wrong tickets, part of one or nothing.
//  - secure: TLS (a CA and a server certificate made for the run with
//    openssl in a temporary directory, removed at the end) and bearer
//    tokens for three tenants: alice and bob do the work, mallory is
//    hostile (wrong tokens, no token, other tenants' session names; see
//    soak_hostile.h). TLS turns the data path off, so the data-port flood
//    belongs to the plain mode; here large transfers are split.
//
// The parts: soak_scenarios (raw-RPC clients, fault children, connections),
// soak_library_scenarios (clients on //client), soak_hostile, soak_reference
// (checks against the kernels' own formulas), soak_processes (the server,
// the killer, /proc, certificates), soak_phases (the phases once the
// server is up) and soak_report (classification, stats and the Markdown
// report). This file has the flags, the setup and the phases' order.
//
// The report (Markdown, on stdout and in --report) has calls by RPC, results
// by gRPC code and aclnn status with what provoked each, server RSS at
// start/middle/end, transfers by path, leaks and the exit status. The exit
// status is 1 when anything was unexpected: an error no request provoked on
// purpose, a wrong result, a leak, RSS growth in the second half of the load
// (the last third's median more than 10% + 32 MiB above the middle third's, or
// its peak more than 25% + 64 MiB above; enforced for runs of 3 minutes or
// more), a server crash, a slow or non-zero exit after SIGTERM, a server
// log line of a kind it should not write, or transfers on the wrong path (no
// data-path transfer in the plain mode, any with TLS).

#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/soak_phases.h"
#include "bench/soak_processes.h"
#include "bench/soak_report.h"
#include "bench/soak_scenarios.h"

ABSL_FLAG(std::string, opserver, "",
          "Path of the opserver binary to run (bazel run passes it).");
ABSL_FLAG(int, clients, 64, "Concurrent client threads.");
ABSL_FLAG(absl::Duration, duration, absl::Minutes(10),
          "How long the clients run (e.g. 10m, 10s).");
ABSL_FLAG(uint64_t, seed, 0, "Random seed (0 = from the clock; printed).");
ABSL_FLAG(absl::Duration, kill_interval, absl::Milliseconds(500),
          "Pause between child client processes killed with SIGKILL in the "
          "middle of a transfer (0 = no child processes).");
ABSL_FLAG(int, idle_timeout_s, 20,
          "The server's --idle_timeout_s: sessions of killed unattached "
          "children are reaped after it, so the leak check waits that long.");
ABSL_FLAG(uint64_t, memory_cache_bytes, 256ull << 20,
          "The server's --memory_cache_bytes (freed device memory it keeps "
          "for reuse; bounded so that RSS reaches its plateau early).");
ABSL_FLAG(std::vector<std::string>, server_flags, {},
          "More flags for the server, comma-separated.");
ABSL_FLAG(int, sigterm_clients, 16,
          "Client threads running while the server gets SIGTERM.");
ABSL_FLAG(std::string, rss_check, "auto",
          "on, off, or auto (on when --duration is at least 3 minutes): "
          "fail when RSS grows in the second half of the run.");
ABSL_FLAG(std::string, report, "", "Also write the report to this file.");
ABSL_FLAG(std::string, log_dir, "",
          "Where the server's stderr goes (default: "
          "$TEST_UNDECLARED_OUTPUTS_DIR, else a new directory under /tmp).");
// Internal: the child client processes that get killed.
ABSL_FLAG(std::string, fault_child, "",
          "Internal: upload, download or pipeline.");
ABSL_FLAG(std::string, server, "", "Internal: the server a fault child dials.");
ABSL_FLAG(bool, attach, false,
          "Internal: the fault child attaches its session.");
ABSL_FLAG(int, parent_pid, 0, "Internal: the soak process.");
ABSL_FLAG(std::string, token, "", "Internal: the fault child's bearer token.");
ABSL_FLAG(std::string, tls_ca_file, "",
          "Internal: the CA a fault child trusts (secure mode).");
ABSL_FLAG(std::string, mode, "plain",
          "plain: no TLS and no tokens; the clients' large transfers use the "
          "server's data path, and a hostile client floods its port. secure: "
          "TLS (certificates made for the run with openssl in a temporary "
          "directory) and bearer tokens for three tenants, alice, bob and "
          "mallory; mallory also calls with wrong tokens and none and names "
          "the others' sessions. TLS turns the data path off, so the "
          "data-port flood runs in the plain mode only.");

namespace opserver::soak {
namespace {

// A PEM file's text ("" when it cannot be read).
std::string ReadPem(const std::string& path) {
  std::ifstream in(path);
  std::stringstream pem;
  pem << in.rdbuf();
  return pem.str();
}

// --fault_child: this process is a client the killer SIGKILLs; it never
// returns.
[[noreturn]] void RunFaultChildFromFlags() {
  if (!absl::GetFlag(FLAGS_tls_ca_file).empty()) {
    SetTlsRoots(ReadPem(absl::GetFlag(FLAGS_tls_ca_file)));
  }
  RunFaultChild(absl::GetFlag(FLAGS_fault_child), absl::GetFlag(FLAGS_server),
                absl::GetFlag(FLAGS_attach), absl::GetFlag(FLAGS_parent_pid),
                absl::GetFlag(FLAGS_token));
}

// --log_dir, else the test's outputs, else a new directory under /tmp;
// "" when none can be made.
std::string LogDir() {
  std::string log_dir = absl::GetFlag(FLAGS_log_dir);
  if (!log_dir.empty()) return log_dir;
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  if (outputs != nullptr) return outputs;
  char dir[] = "/tmp/opserver-soak.XXXXXX";
  if (mkdtemp(dir) == nullptr) return "";
  return dir;
}

// The flags' run (all but the server's address and pid); false, said on
// stderr, when a flag is wrong.
bool RunFromFlags(SoakRun* run) {
  const std::string opserver = absl::GetFlag(FLAGS_opserver);
  if (opserver.empty() || access(opserver.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "soak: --opserver=%s is not an executable\n",
                 opserver.c_str());
    return false;
  }
  char self[4096];
  const ssize_t self_len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (self_len <= 0) return false;
  run->self.assign(self, self_len);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "plain" && mode != "secure") {
    std::fprintf(stderr, "soak: --mode=%s is neither plain nor secure\n",
                 mode.c_str());
    return false;
  }
  run->secure = mode == "secure";
  run->clients = absl::GetFlag(FLAGS_clients);
  run->duration = absl::GetFlag(FLAGS_duration);
  run->kill_interval = absl::GetFlag(FLAGS_kill_interval);
  run->seed = absl::GetFlag(FLAGS_seed);
  if (run->seed == 0) run->seed = absl::ToUnixNanos(absl::Now());
  run->idle_timeout_s = absl::GetFlag(FLAGS_idle_timeout_s);
  run->sigterm_clients = absl::GetFlag(FLAGS_sigterm_clients);
  return true;
}

std::vector<std::string> ServerArgv(const SoakRun& run) {
  std::vector<std::string> argv = {
      absl::GetFlag(FLAGS_opserver), "--listen=127.0.0.1:0",
      absl::StrCat("--idle_timeout_s=", run.idle_timeout_s),
      // Every client, child and reaped session fits: running into this
      // limit would itself show a leak.
      "--max_sessions=1024",
      absl::StrCat("--memory_cache_bytes=",
                   absl::GetFlag(FLAGS_memory_cache_bytes))};
  for (const std::string& f : absl::GetFlag(FLAGS_server_flags)) {
    if (!f.empty()) argv.push_back(f);
  }
  return argv;
}

// The secure mode's certificates and tenants (alice and bob do the work,
// mallory is hostile; tokens are fresh for every run), and the server's
// flags for them. False, said on stderr, when they cannot be made.
bool SecureSetup(SoakRun* run, std::vector<std::string>* server_argv) {
  std::string error;
  if (!MakeSecureSetup(&run->tenants, &run->cert_dir, &error)) {
    std::fprintf(stderr, "soak: secure mode: %s\n", error.c_str());
    return false;
  }
  server_argv->push_back(
      absl::StrCat("--tls_cert_file=", run->cert_dir, "/server.pem"));
  server_argv->push_back(
      absl::StrCat("--tls_key_file=", run->cert_dir, "/server.key"));
  server_argv->push_back(
      absl::StrCat("--auth_token_file=", run->cert_dir, "/tokens"));
  SetTlsRoots(ReadPem(run->cert_dir + "/ca.pem"));
  return true;
}

// Phase 1: the server started and connected to (false when it cannot be),
// and sampled idle.
bool StartServerAndSample(SoakRun* run, RunSummary* r,
                          std::shared_ptr<Conn>* monitor) {
  SetPhase("server start", absl::Seconds(90));
  run->pid = StartServer(r->server_argv, r->log, &run->address);
  server_pid = run->pid;
  std::fprintf(stderr, "soak: server pid %d on %s, log %s, seed %llu\n",
               run->pid, run->address.c_str(), r->log.c_str(),
               static_cast<unsigned long long>(run->seed));
  *monitor = Connect(run->address, true, run->tenants.alice);
  run->monitor = monitor->get();
  if (!(*monitor)->channel->WaitForConnected(
          absl::ToChronoTime(absl::Now() + absl::Seconds(30)))) {
    std::fprintf(stderr, "soak: cannot connect to %s\n", run->address.c_str());
    kill(run->pid, SIGKILL);
    return false;
  }
  r->load_before = LoadAverage();
  r->start = ReadProc(run->pid);
  r->start.thread_names = ThreadNames(run->pid);
  bool ok;
  SetCounts(QueryServerStats(run->monitor, &ok), &r->start);
  return true;
}

// The report's account of how the run was made.
void DescribeRun(int argc, char** argv, const SoakRun& run, RunSummary* r) {
  for (int i = 0; i < argc; ++i) {
    absl::StrAppend(&r->command, i ? " " : "", argv[i]);
  }
  r->seed = run.seed;
  r->clients = run.clients;
  r->duration = run.duration;
  r->kill_interval = run.kill_interval;
  r->secure = run.secure;
  r->idle_timeout_s = run.idle_timeout_s;
  r->sigterm_clients = run.sigterm_clients;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_fault_child).empty()) RunFaultChildFromFlags();
  signal(SIGPIPE, SIG_IGN);
  SoakRun run;
  if (!RunFromFlags(&run)) return 2;
  const std::string log_dir = LogDir();
  if (log_dir.empty()) return 2;
  RunSummary r;
  r.log = log_dir + "/opserver.stderr";
  r.server_argv = ServerArgv(run);
  // The keys and tokens go whichever way the program ends (but for the
  // watchdog's _exit: they are the run's own, in a temporary directory).
  absl::Cleanup remove_cert_dir = [&] {
    if (!run.cert_dir.empty()) RemoveSecureSetup(run.cert_dir);
  };
  if (run.secure && !SecureSetup(&run, &r.server_argv)) return 2;

  std::thread(Watchdog).detach();
  std::shared_ptr<Conn> monitor;
  if (!StartServerAndSample(&run, &r, &monitor)) return 2;
  Stats stats, shutdown_stats;
  r.stats = &stats;
  r.shutdown_stats = &shutdown_stats;
  const LoadOutcome load = RunLoad(run, &stats, &r);
  CheckLeaks(run, load, &r);
  SigtermUnderLoad(run, &shutdown_stats, &r);
  SetPhase("report", absl::Minutes(2));
  Judge(run, absl::GetFlag(FLAGS_rss_check), load, &r);

  DescribeRun(argc, argv, run, &r);
  const std::string report = FormatReport(r);
  std::fwrite(report.data(), 1, report.size(), stdout);
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_report).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_report)) << report;
  }
  return r.failures.empty() ? 0 : 1;
}

}  // namespace
}  // namespace opserver::soak

int main(int argc, char** argv) { return opserver::soak::Main(argc, argv); }
