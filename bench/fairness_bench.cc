// Tenant fairness: a victim tenant's small-step latency, alone and beside
// each kind of hostile tenant, in one run against one server.
//
//   bazel run -c opt //bench:fairness_bench [-- --phase_s=8]
//
// An in-process opserver (CPU device, token authentication, data port on)
// on a free loopback port. The victim, tenant "victim" on a connection of
// its own, runs steps of four unary calls back to back: WriteValues of 4
// floats, GetWorkspaceSize and Execute of a 4096-element ThresholdBackward,
// ReadValues of 4 floats. Each phase runs the victim for --phase_s seconds
// beside one attacker (tenant "attacker", its own connections):
//
//   alone          nothing else
//   giant_batches  2 Pipeline channels sending batches of 65,536 frees at
//                  the server's command cap, plus one 60 MiB batch each
//                  second (refused by size)
//   malloc_churn   4 threads, each Malloc 256 MiB + Free, over 2 sessions
//   big_evaluates  8 threads of Evaluate on 2^20-element tensors
//   data_port      2 threads opening and closing connections to the data
//                  port as fast as they can, sending nothing
//   unauth_flood   4 threads of GetDeviceInfo with a wrong token
//   compute_hog    4 sessions x 2 streams of 2^25-element launches
//   memset_flood   on the other logical device (the server runs
//                  --devices=2; the victim is on device 0): 16 streams,
//                  each keeping up to 8 Memsets of 64 MiB queued
//   copy_flood     the same with 32 MiB CopyDeviceToDevice within each
//                  stream's 64 MiB buffer
//   attach_flood   2 threads opening Attach calls on one session and
//                  holding them, up to 40,000 each
//   abandoned_syncs  a record held behind an Upload that never finishes;
//                  4 threads of SynchronizeEvent on it, each given up
//                  after 20 ms, up to 100,000 each
//   held_batches   4 sessions x 8 Pipeline channels, each sending one batch
//                  of 9 read fences of 1 MiB and a plan with a 3.9M-dim
//                  packed shape, never reading
//   alone          again, to see the machine did not drift
//
// Per phase also the server's resident memory (VmRSS; the server runs in
// this process, beside the victim's small client) before the attacker
// starts, when the phase ends, and a second after the attacker is gone.
//
// Per phase: victim steps, failures, p50 and p99 in ms, and the ratio to
// the first "alone" phase, with the targets (p99 <= 5x alone beside every
// attacker but the compute hog and the other device's memset and copy
// floods; p50 <= 3x alone beside those; no failures).
// Every loop is bounded by the phase's time and stops by itself; all
// traffic stays on 127.0.0.1. The attackers are in fairness_attackers.
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/fairness_attackers.h"
#include "client/client.h"
#include "server/server.h"

ABSL_FLAG(int, phase_s, 8, "Seconds each phase runs.");
ABSL_FLAG(std::string, phases, "",
          "Comma-separated attacker phases to run (default: all); the "
          "victim alone always runs first and last.");
ABSL_FLAG(int, attacker_nice, 0,
          "Nice value of the attacker processes. On this one host the "
          "attackers' clients share the server's two cores; at 19 their own "
          "work (building and sending requests) yields to the server and the "
          "victim, as if they ran on machines of their own.");
// Internal: the bench runs each attacker as a child process of itself.
ABSL_FLAG(std::string, attack, "", "(internal) run this attacker and exit");
ABSL_FLAG(std::string, address, "", "(internal) the server's address");
ABSL_FLAG(int, data_port, 0, "(internal) the server's data port");
ABSL_FLAG(int, attack_s, 0, "(internal) seconds the attacker runs");
ABSL_FLAG(bool, oversized_batches, true,
          "giant_batches also sends one 60 MiB batch per channel a second.");

extern char** environ;

namespace opserver::fairness {
namespace {

using kernels::DType;
using remote::Session;
using remote::TensorDesc;

constexpr int64_t kStepElements = 4096;

struct PhaseResult {
  std::string name;
  int steps = 0;
  int failures = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  std::string first_error;
};

PhaseResult RunVictim(const std::string& name, Session& session,
                      const remote::DeviceBuffer& a,
                      const remote::DeviceBuffer& b, absl::Duration length) {
  PhaseResult result;
  result.name = name;
  std::vector<double> ms;
  const TensorDesc ta =
      TensorDesc::Contiguous(a.handle(), DType::kFloat, {kStepElements});
  const TensorDesc tb =
      TensorDesc::Contiguous(b.handle(), DType::kFloat, {kStepElements});
  const absl::Time end = absl::Now() + length;
  while (absl::Now() < end) {
    const absl::Time start = absl::Now();
    absl::Status status =
        session.WriteValues(a.handle(), 0, DType::kFloat, {1.0, 2.0, 3.0, 4.0});
    if (status.ok()) {
      auto executor = session.ThresholdBackward(ta, ta, 0.5, tb);
      status = executor.ok() ? executor->Execute() : executor.status();
    }
    if (status.ok()) {
      auto values = session.ReadValues(b.handle(), 0, DType::kFloat, 4);
      status = values.status();
      if (status.ok() && (*values)[3] != 4.0) {
        status = absl::InternalError("wrong result");
      }
    }
    if (!status.ok()) {
      if (result.failures++ == 0) result.first_error = status.ToString();
      continue;
    }
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  result.steps = static_cast<int>(ms.size());
  if (!ms.empty()) {
    std::sort(ms.begin(), ms.end());
    result.p50_ms = ms[ms.size() / 2];
    result.p99_ms = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  }
  return result;
}

// VmRSS of this process (the server's, with the victim's client), in MiB.
double ResidentMiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
    }
  }
  return 0;
}

// The in-process server with the victim's and the attacker's tokens (read
// from a file removed right after) and a second device for the memset and
// copy floods; null, said on stderr, when it cannot start.
std::unique_ptr<Server> StartServer() {
  char dir_template[] = "/tmp/fairness_bench.XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return nullptr;
  const std::string tokens = absl::StrCat(dir, "/tokens");
  {
    std::ofstream out(tokens);
    out << "victim " << kVictimToken << "\nattacker " << kAttackerToken << "\n";
  }
  chmod(tokens.c_str(), 0600);
  Options options;
  options.listen = "127.0.0.1:0";
  options.auth_token_file = tokens;
  options.device_memory_bytes = 4ull << 30;
  // Device 1 is the memset and copy floods' (the victim's is 0).
  options.devices = 2;
  auto server = Server::Start(options);
  unlink(tokens.c_str());
  rmdir(dir);
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
    return nullptr;
  }
  return *std::move(server);
}

// The attacker `name` as a process of its own, as a tenant's client would
// be: its threads (gRPC's included) are not the server's. 0 when it
// cannot start.
pid_t SpawnAttacker(const char* name, const std::string& address,
                    const std::string& data_port) {
  std::vector<std::string> args = {
      "/proc/self/exe",
      absl::StrCat("--attack=", name),
      absl::StrCat("--address=", address),
      absl::StrCat("--data_port=", data_port),
      absl::StrCat("--attack_s=", absl::GetFlag(FLAGS_phase_s) + 5),
      absl::StrCat("--attacker_nice=", absl::GetFlag(FLAGS_attacker_nice))};
  std::vector<char*> argv_child;
  for (std::string& arg : args) argv_child.push_back(arg.data());
  argv_child.push_back(nullptr);
  pid_t attacker = 0;
  if (posix_spawn(&attacker, "/proc/self/exe", nullptr, nullptr,
                  argv_child.data(), environ) != 0) {
    return 0;
  }
  return attacker;
}

struct Phase {
  const char* name;
  bool compute;  // The p50 target instead of the p99 one.
};

// What every phase shares: the server, the victim's session and buffers.
struct Bench {
  std::string address;
  std::string data_port;
  Session* session;
  const remote::DeviceBuffer* a;
  const remote::DeviceBuffer* b;
  absl::Duration phase;
  PhaseResult alone;  // The first "alone" phase's.
  bool all_met = true;
};

// One phase: its attacker started (but for "alone"), the victim's steps
// for the phase's time, the attacker killed; prints its row. False when
// the attacker cannot start.
bool RunPhase(const Phase& p, Bench& bench) {
  pid_t attacker = 0;
  const double rss_before = ResidentMiB();
  if (std::string(p.name) != "alone") {
    attacker = SpawnAttacker(p.name, bench.address, bench.data_port);
    if (attacker == 0) {
      std::fprintf(stderr, "cannot start the %s attacker\n", p.name);
      return false;
    }
    // Let the attack reach its steady state first.
    absl::SleepFor(absl::Seconds(1));
  }
  PhaseResult r =
      RunVictim(p.name, *bench.session, *bench.a, *bench.b, bench.phase);
  const double rss_end = ResidentMiB();
  if (attacker != 0) {
    kill(attacker, SIGKILL);
    waitpid(attacker, nullptr, 0);
    // The server notices the connections are gone.
    absl::SleepFor(absl::Seconds(1));
  }
  const double rss_after = ResidentMiB();
  PhaseResult& alone = bench.alone;
  if (alone.steps == 0) alone = r;
  const double p50x = alone.p50_ms > 0 ? r.p50_ms / alone.p50_ms : 0;
  const double p99x = alone.p99_ms > 0 ? r.p99_ms / alone.p99_ms : 0;
  std::string target;
  if (std::string(p.name) != "alone") {
    const bool met = r.failures == 0 && (p.compute ? p50x <= 3.0 : p99x <= 5.0);
    bench.all_met = bench.all_met && met;
    target = absl::StrCat(p.compute ? "p50<=3x" : "p99<=5x",
                          ", no failure: ", met ? "met" : "MISSED");
  }
  std::printf(
      "%-15s %7d %6d %9.2f %9.2f %8.2f %8.2f  %-28s %.0f / %.0f / %.0f\n",
      p.name, r.steps, r.failures, r.p50_ms, r.p99_ms, p50x, p99x,
      target.c_str(), rss_before, rss_end, rss_after);
  if (r.failures > 0) {
    std::printf("  first failure: %s\n", r.first_error.c_str());
  }
  std::fflush(stdout);
  return true;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_attack).empty()) {
    return RunAttacker(
        {absl::GetFlag(FLAGS_attack), absl::GetFlag(FLAGS_address),
         absl::GetFlag(FLAGS_data_port), absl::GetFlag(FLAGS_attack_s),
         absl::GetFlag(FLAGS_attacker_nice),
         absl::GetFlag(FLAGS_oversized_batches)});
  }
  std::unique_ptr<Server> server = StartServer();
  if (server == nullptr) return 1;
  Bench bench;
  bench.address = server->address();
  bench.data_port = absl::StrCat(server->data_port());
  bench.phase = absl::Seconds(absl::GetFlag(FLAGS_phase_s));

  std::unique_ptr<remote::Client> victim =
      Connect(bench.address, kVictimToken, false);
  std::unique_ptr<Session> session = Open(*victim, "victim");
  auto a = session->Malloc(kStepElements * 4);
  auto b = session->Malloc(kStepElements * 4);
  if (!a.ok() || !b.ok()) return 1;
  RunVictim("warmup", *session, *a, *b, absl::Seconds(1));
  bench.session = session.get();
  bench.a = &*a;
  bench.b = &*b;

  const std::vector<Phase> phases = {
      {"alone", false},           {"giant_batches", false},
      {"malloc_churn", false},    {"big_evaluates", false},
      {"data_port", false},       {"unauth_flood", false},
      {"compute_hog", true},      {"memset_flood", true},
      {"copy_flood", true},       {"attach_flood", false},
      {"abandoned_syncs", false}, {"held_batches", false},
      {"alone", false},
  };
  std::printf(
      "fairness_bench: victim step = WriteValues + GetWorkspaceSize "
      "+ Execute + ReadValues (4096 fp32), %d s per phase, attacker "
      "processes at nice %d\n",
      absl::GetFlag(FLAGS_phase_s), absl::GetFlag(FLAGS_attacker_nice));
  std::printf("%-15s %7s %6s %9s %9s %8s %8s  %-28s %s\n", "phase", "steps",
              "fail", "p50 ms", "p99 ms", "p50 x", "p99 x", "target",
              "server RSS MiB: before / end / after");
  const std::vector<std::string> wanted =
      absl::StrSplit(absl::GetFlag(FLAGS_phases), ',', absl::SkipEmpty());
  for (const Phase& p : phases) {
    if (std::string(p.name) != "alone" && !wanted.empty() &&
        std::find(wanted.begin(), wanted.end(), p.name) == wanted.end()) {
      continue;
    }
    if (!RunPhase(p, bench)) return 1;
  }
  std::printf("fairness_bench: %s\n",
              bench.all_met ? "every target met" : "a target was missed");
  a->Free().IgnoreError();
  b->Free().IgnoreError();
  session.reset();
  victim.reset();
  server.reset();
  return 0;
}

}  // namespace
}  // namespace opserver::fairness

int main(int argc, char** argv) { return opserver::fairness::Main(argc, argv); }
