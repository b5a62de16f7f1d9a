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
// the killer, /proc, certificates) and soak_report (classification, stats
// and the Markdown report). This file has the flags and the phases.
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
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/soak_hostile.h"
#include "bench/soak_library_scenarios.h"
#include "bench/soak_processes.h"
#include "bench/soak_report.h"
#include "bench/soak_scenarios.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "proto/opserver.grpc.pb.h"

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

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_fault_child).empty()) {
    if (!absl::GetFlag(FLAGS_tls_ca_file).empty()) {
      std::ifstream ca(absl::GetFlag(FLAGS_tls_ca_file));
      std::stringstream pem;
      pem << ca.rdbuf();
      SetTlsRoots(pem.str());
    }
    RunFaultChild(absl::GetFlag(FLAGS_fault_child), absl::GetFlag(FLAGS_server),
                  absl::GetFlag(FLAGS_attach), absl::GetFlag(FLAGS_parent_pid),
                  absl::GetFlag(FLAGS_token));
  }
  signal(SIGPIPE, SIG_IGN);
  const std::string opserver = absl::GetFlag(FLAGS_opserver);
  if (opserver.empty() || access(opserver.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "soak: --opserver=%s is not an executable\n",
                 opserver.c_str());
    return 2;
  }
  char self[4096];
  const ssize_t self_len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (self_len <= 0) return 2;
  self[self_len] = '\0';
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "plain" && mode != "secure") {
    std::fprintf(stderr, "soak: --mode=%s is neither plain nor secure\n",
                 mode.c_str());
    return 2;
  }
  const bool secure = mode == "secure";
  const int clients = absl::GetFlag(FLAGS_clients);
  const absl::Duration duration = absl::GetFlag(FLAGS_duration);
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) seed = absl::ToUnixNanos(absl::Now());
  std::string log_dir = absl::GetFlag(FLAGS_log_dir);
  if (log_dir.empty()) {
    const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
    if (outputs != nullptr) {
      log_dir = outputs;
    } else {
      char dir[] = "/tmp/opserver-soak.XXXXXX";
      if (mkdtemp(dir) == nullptr) return 2;
      log_dir = dir;
    }
  }
  const std::string log = log_dir + "/opserver.stderr";
  const int idle_timeout_s = absl::GetFlag(FLAGS_idle_timeout_s);
  std::vector<std::string> server_argv = {
      opserver, "--listen=127.0.0.1:0",
      absl::StrCat("--idle_timeout_s=", idle_timeout_s),
      // Every client, child and reaped session fits: running into this
      // limit would itself show a leak.
      "--max_sessions=1024",
      absl::StrCat("--memory_cache_bytes=",
                   absl::GetFlag(FLAGS_memory_cache_bytes))};
  for (const std::string& f : absl::GetFlag(FLAGS_server_flags)) {
    if (!f.empty()) server_argv.push_back(f);
  }
  // The secure mode's tenants: alice and bob do the work, mallory is
  // hostile. Tokens are fresh for every run.
  Tenants tenants;
  std::string cert_dir;
  if (secure) {
    std::string error;
    if (!MakeSecureSetup(&tenants, &cert_dir, &error)) {
      std::fprintf(stderr, "soak: secure mode: %s\n", error.c_str());
      if (!cert_dir.empty()) RemoveSecureSetup(cert_dir);
      return 2;
    }
    server_argv.push_back(
        absl::StrCat("--tls_cert_file=", cert_dir, "/server.pem"));
    server_argv.push_back(
        absl::StrCat("--tls_key_file=", cert_dir, "/server.key"));
    server_argv.push_back(
        absl::StrCat("--auth_token_file=", cert_dir, "/tokens"));
    std::ifstream ca(cert_dir + "/ca.pem");
    std::stringstream pem;
    pem << ca.rdbuf();
    SetTlsRoots(pem.str());
  }
  // The keys and tokens go whichever way the program ends (but for the
  // watchdog's _exit: they are the run's own, in a temporary directory).
  absl::Cleanup remove_cert_dir = [&] {
    if (!cert_dir.empty()) RemoveSecureSetup(cert_dir);
  };
  std::vector<std::string> failures;

  std::thread(Watchdog).detach();
  SetPhase("server start", absl::Seconds(90));
  std::string address;
  const pid_t pid = StartServer(server_argv, log, &address);
  server_pid = pid;
  std::fprintf(stderr, "soak: server pid %d on %s, log %s, seed %llu\n", pid,
               address.c_str(), log.c_str(),
               static_cast<unsigned long long>(seed));
  auto monitor = Connect(address, true, tenants.alice);
  if (!monitor->channel->WaitForConnected(
          absl::ToChronoTime(absl::Now() + absl::Seconds(30)))) {
    std::fprintf(stderr, "soak: cannot connect to %s\n", address.c_str());
    kill(pid, SIGKILL);
    return 2;
  }
  const std::string load_before = LoadAverage();
  ProcSample start = ReadProc(pid);
  start.thread_names = ThreadNames(pid);
  {
    bool ok;
    v1::ServerStats s = QueryServerStats(monitor.get(), &ok);
    start.sessions = s.sessions();
    start.buffers = s.buffers();
    start.buffer_bytes = s.buffer_bytes();
  }

  // ---- the soak
  Stats stats;
  std::atomic<bool> stop{false};
  std::atomic<bool> server_died{false};
  int server_wstatus = 0;
  const absl::Time load_start = absl::Now();
  const absl::Time load_end = load_start + duration;
  SetPhase("soak", duration + absl::Minutes(5));
  std::vector<ProcSample> samples;
  absl::Mutex samples_mu;
  const absl::Duration sample_every =
      std::clamp(duration / 120, absl::Milliseconds(250), absl::Seconds(5));
  std::thread sampler([&] {
    int64_t printed = 0;
    while (!stop.load()) {
      ProcSample s = ReadProc(pid);
      bool ok;
      v1::ServerStats st = QueryServerStats(monitor.get(), &ok);
      if (ok) {
        s.sessions = st.sessions();
        s.buffers = st.buffers();
        s.buffer_bytes = st.buffer_bytes();
      }
      s.t = absl::ToDoubleSeconds(absl::Now() - load_start);
      {
        absl::MutexLock lock(&samples_mu);
        samples.push_back(s);
      }
      if (s.t >= printed * 30.0) {
        ++printed;
        std::fprintf(stderr,
                     "soak: t=%.0fs calls=%llu expected-errors=%llu "
                     "unexpected=%llu rss=%sMiB threads=%lld fds=%lld "
                     "sessions=%lld buffers=%lld load=%s\n",
                     s.t, static_cast<unsigned long long>(stats.total_calls()),
                     static_cast<unsigned long long>(stats.expected_errors()),
                     static_cast<unsigned long long>(stats.unexpected()),
                     Mib(s.rss_kb).c_str(), static_cast<long long>(s.threads),
                     static_cast<long long>(s.fds),
                     static_cast<long long>(s.sessions),
                     static_cast<long long>(s.buffers), LoadAverage().c_str());
      }
      for (absl::Time until = absl::Now() + sample_every;
           absl::Now() < until && !stop.load();) {
        absl::SleepFor(absl::Milliseconds(50));
      }
    }
  });
  const absl::Duration kill_interval = absl::GetFlag(FLAGS_kill_interval);
  std::unique_ptr<Killer> killer;
  std::thread killer_thread;
  if (kill_interval > absl::ZeroDuration()) {
    std::vector<std::string> child_flags;
    if (secure) {
      child_flags = {absl::StrCat("--token=", tenants.bob),
                     absl::StrCat("--tls_ca_file=", cert_dir, "/ca.pem")};
    }
    killer = std::make_unique<Killer>(self, address, kill_interval,
                                      seed ^ 0x5eed, child_flags);
    killer_thread = std::thread([&] { killer->Run(&stop); });
  }
  // Which client does what (i counts from 0):
  //  - i % 8 == 7: hostile: the data-port flood (plain mode) or the tenant
  //    mallory (secure mode);
  //  - else i % 4 == 1: the C++ client library (plain mode: every other
  //    one may use the data path, the rest split large transfers);
  //  - else raw RPCs; i % 4 == 0 of them share four channels (one
  //    connection each), the rest have a connection of their own.
  // Secure mode: the raw clients on shared channels and i % 4 == 2 are
  // alice, the library clients and i % 4 == 3 bob.
  std::vector<std::shared_ptr<Conn>> shared;
  for (int i = 0; i < 4; ++i) {
    shared.push_back(Connect(address, true, tenants.alice));
  }
  std::vector<std::thread> threads;
  int library_clients = 0, hostile_clients = 0;
  for (int i = 0; i < clients; ++i) {
    const bool bob = i % 4 == 1 || i % 4 == 3;
    const std::string tenant = !secure ? "anonymous" : bob ? "bob" : "alice";
    const std::string token = !secure ? "" : bob ? tenants.bob : tenants.alice;
    if (i % 8 == 7) {
      ++hostile_clients;
      threads.emplace_back([&, i] {
        HostileOptions o;
        o.id = i;
        o.address = address;
        o.tenant = secure ? "mallory" : "anonymous";
        o.token = tenants.mallory;
        o.wrong_token = tenants.wrong;
        o.stats = &stats;
        o.seed = seed + 1000 + i;
        if (secure) {
          RunHostileTenant(o, load_end, &stop);
        } else {
          RunDataPortFlood(o, load_end, &stop);
        }
      });
    } else if (i % 4 == 1) {
      ++library_clients;
      threads.emplace_back([&, i, tenant, token] {
        LibraryClientOptions o;
        o.id = i;
        o.address = address;
        o.tenant = tenant;
        if (secure) {
          o.connect.tls_ca_file = cert_dir + "/ca.pem";
          o.connect.token = token;
        }
        o.data_path = (i / 4) % 2 == 0;
        o.stats = &stats;
        o.seed = seed + 1000 + i;
        RunLibraryClient(o, load_end, &stop);
      });
    } else {
      threads.emplace_back([&, i, tenant, token] {
        ClientOptions o;
        o.id = i;
        o.address = address;
        o.tenant = tenant;
        o.token = token;
        if (i % 4 == 0) o.shared = shared[(i / 4) % 4];
        o.stats = &stats;
        o.seed = seed + 1000 + i;
        RunRpcClient(o, load_end, &stop);
      });
    }
  }
  while (absl::Now() < load_end) {
    absl::SleepFor(std::min(absl::Milliseconds(200), load_end - absl::Now()));
    if (waitpid(pid, &server_wstatus, WNOHANG) == pid) {
      server_died = true;
      failures.push_back(absl::StrCat("the server died during the soak: ",
                                      DescribeWait(server_wstatus)));
      break;
    }
  }
  ProcSample end_of_load = ReadProc(pid);
  v1::ServerStats load_stats;
  end_of_load.t = absl::ToDoubleSeconds(absl::Now() - load_start);
  {
    bool ok;
    v1::ServerStats s = QueryServerStats(monitor.get(), &ok);
    load_stats = s;
    end_of_load.sessions = s.sessions();
    end_of_load.buffers = s.buffers();
    end_of_load.buffer_bytes = s.buffer_bytes();
  }
  const std::string load_during = LoadAverage();
  SetPhase("clients ending", absl::Minutes(5));
  if (server_died) stop = true;
  for (std::thread& t : threads) t.join();
  shared.clear();
  stop = true;
  if (killer_thread.joinable()) killer_thread.join();
  sampler.join();
  const absl::Duration ran = absl::Now() - load_start;

  // ---- leaks
  SetPhase("leak check", absl::Seconds(idle_timeout_s + 60));
  ProcSample after_clients;
  double zero_after_s = -1;
  v1::ServerStats first_stats, last_stats;
  bool stats_ok = false;
  if (!server_died) {
    const absl::Time t0 = absl::Now();
    first_stats = QueryServerStats(monitor.get(), &stats_ok);
    last_stats = first_stats;
    const absl::Time deadline = t0 + absl::Seconds(idle_timeout_s + 15);
    while (stats_ok && absl::Now() < deadline) {
      last_stats = QueryServerStats(monitor.get(), &stats_ok);
      if (last_stats.sessions() == 0 && last_stats.buffers() == 0 &&
          last_stats.buffer_bytes() == 0) {
        zero_after_s = absl::ToDoubleSeconds(absl::Now() - t0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(250));
    }
    if (zero_after_s < 0) {
      failures.push_back(absl::StrCat(
          "leak: ", last_stats.sessions(), " sessions, ", last_stats.buffers(),
          " buffers, ", last_stats.buffer_bytes(), " bytes ",
          idle_timeout_s + 15, " s after every client ended"));
    }
    // Connections of the clients and children close; give the server a
    // moment to notice before counting its fds.
    for (int i = 0; i < 40; ++i) {
      after_clients = ReadProc(pid);
      if (after_clients.fds <= start.fds) break;
      absl::SleepFor(absl::Milliseconds(250));
    }
    after_clients.thread_names = ThreadNames(pid);
    after_clients.t = absl::ToDoubleSeconds(absl::Now() - load_start);
    after_clients.sessions = last_stats.sessions();
    after_clients.buffers = last_stats.buffers();
    after_clients.buffer_bytes = last_stats.buffer_bytes();
    if (after_clients.fds > start.fds + 4) {
      failures.push_back(absl::StrCat("the server holds ", after_clients.fds,
                                      " fds after the clients ended, ",
                                      start.fds, " before they started"));
    }
  }

  // ---- SIGTERM under load
  Stats shutdown_stats;
  std::string exit_text = "not run (the server died earlier)";
  double exit_ms = -1;
  uint64_t calls_before_term = 0;
  std::string held_text;
  if (!server_died) {
    SetPhase("SIGTERM under load", absl::Minutes(3));
    std::atomic<bool> stop_load{false};
    std::vector<std::thread> load;
    const int n = absl::GetFlag(FLAGS_sigterm_clients);
    for (int i = 0; i < n; ++i) {
      load.emplace_back([&, i] {
        ClientOptions o;
        o.id = 10000 + i;
        o.address = address;
        o.stats = &shutdown_stats;
        o.seed = seed + 50000 + i;
        o.mode = Mode::kShutdown;
        o.token = tenants.alice;
        RunRpcClient(o, absl::InfiniteFuture(), &stop_load, i < 2 ? 1 + i : 0);
      });
    }
    const absl::Time busy_by = absl::Now() + absl::Seconds(10);
    absl::SleepFor(absl::Seconds(2));
    while (shutdown_stats.total_calls() < 50 * static_cast<uint64_t>(n) &&
           absl::Now() < busy_by) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    calls_before_term = shutdown_stats.total_calls();
    // Held across the signal: an Attach call must get the "server shutting
    // down" event and a health Watch NOT_SERVING, and both must end.
    auto held = Connect(address, true, tenants.alice);
    std::string attach_events, watch_statuses;
    grpc::Status attach_status, watch_status;
    grpc::ClientContext create_context, attach_context, watch_context;
    SetDeadline(&create_context, absl::Seconds(30));
    SetDeadline(&attach_context, absl::Minutes(2));
    SetDeadline(&watch_context, absl::Minutes(2));
    v1::CreateSessionRequest create;
    create.set_client_name("soak: held across SIGTERM");
    v1::CreateSessionResponse created;
    held->rt->CreateSession(&create_context, create, &created);
    v1::AttachRequest attach_request;
    attach_request.set_session(created.session());
    auto attach = held->rt->Attach(&attach_context, attach_request);
    auto watch = held->health->Watch(&watch_context,
                                     grpc::health::v1::HealthCheckRequest());
    std::thread attach_reader([&] {
      v1::AttachEvent event;
      while (attach->Read(&event))
        absl::StrAppend(&attach_events, event.event(), "; ");
      attach_status = attach->Finish();
    });
    std::thread watch_reader([&] {
      grpc::health::v1::HealthCheckResponse response;
      while (watch->Read(&response)) {
        absl::StrAppend(
            &watch_statuses,
            grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                response.status()),
            "; ");
      }
      watch_status = watch->Finish();
    });
    absl::SleepFor(absl::Milliseconds(200));
    const absl::Time t0 = absl::Now();
    kill(pid, SIGTERM);
    int wstatus = 0;
    bool exited = false;
    // The default --shutdown_grace_ms is 5000; wait up to 15 s more (more
    // than 3 s more is a failure, see below).
    while (absl::Now() < t0 + absl::Seconds(20)) {
      if (waitpid(pid, &wstatus, WNOHANG) == pid) {
        exited = true;
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    exit_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    if (!exited) {
      kill(pid, SIGKILL);
      waitpid(pid, &wstatus, 0);
      exit_text = "still running 20 s after SIGTERM (killed)";
      failures.push_back(exit_text);
    } else {
      exit_text = DescribeWait(wstatus);
      if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
        failures.push_back(absl::StrCat("after SIGTERM: ", exit_text));
      }
      // The grace, then cancelling what still runs and releasing sessions.
      if (exit_ms > 5000 + 3000) {
        failures.push_back(absl::StrFormat(
            "the server took %.0f ms to exit after SIGTERM, more than its "
            "--shutdown_grace_ms (5000) + 3000",
            exit_ms));
      }
    }
    server_pid = 0;
    stop_load = true;
    for (std::thread& t : load) t.join();
    attach_reader.join();
    watch_reader.join();
    held_text = absl::StrCat(
        "An Attach call held across the signal saw `", attach_events,
        "` and ended ", CodeName(attach_status.error_code()),
        "; a health Watch saw `", watch_statuses, "` and ended ",
        CodeName(watch_status.error_code()), ".");
    if (!absl::StrContains(attach_events, "server shutting down") ||
        !absl::StrContains(watch_statuses, "NOT_SERVING")) {
      failures.push_back(absl::StrCat("around SIGTERM: ", held_text));
    }
  } else {
    server_pid = 0;
  }
  SetPhase("report", absl::Minutes(2));

  // ---- the server's log
  const ServerLog server_log = ReadServerLog(log, /*tokens=*/secure);
  if (!server_log.odd_lines.empty()) {
    failures.push_back(absl::StrCat(server_log.kinds.at("other"),
                                    " server log lines of an unknown kind"));
  }
  if (!server_died && !server_log.stopped) {
    failures.push_back("no 'stopped' line in the server log");
  }

  // ---- RSS
  std::vector<ProcSample> load_samples;
  {
    absl::MutexLock lock(&samples_mu);
    load_samples = samples;
  }
  load_samples.push_back(end_of_load);
  const std::string rss_check = absl::GetFlag(FLAGS_rss_check);
  const bool check_rss = rss_check == "on" ||
                         (rss_check == "auto" && duration >= absl::Minutes(3));
  const RssAnalysis rss =
      AnalyzeRss(load_samples, absl::ToDoubleSeconds(duration), check_rss);
  if (check_rss && rss.enough && !rss.flat) {
    failures.push_back(absl::StrCat("RSS not flat: ", rss.verdict));
  }

  if (stats.unexpected() > 0) {
    failures.push_back(absl::StrCat(stats.unexpected(),
                                    " unexpected outcomes during the soak"));
  }
  if (shutdown_stats.unexpected() > 0) {
    failures.push_back(absl::StrCat(shutdown_stats.unexpected(),
                                    " unexpected outcomes around SIGTERM"));
  }
  // Large transfers went where the mode sends them: over the data path
  // for the library clients that may use it (plain mode), never with TLS.
  const bool data_path_clients = !secure && clients >= 2;
  if (!server_died) {
    if (data_path_clients && load_stats.data_path_transfers() == 0) {
      failures.push_back(
          "no transfer used the data path, though library clients had it");
    }
    if (secure && load_stats.data_path_transfers() != 0) {
      failures.push_back("transfers used the data path with TLS on");
    }
  }
  if (killer != nullptr && killer->failures() > 0) {
    failures.push_back(absl::StrCat(killer->failures(),
                                    " fault children did not die as planned"));
  }

  // ---- report
  RunSummary r;
  for (int i = 0; i < argc; ++i) {
    absl::StrAppend(&r.command, i ? " " : "", argv[i]);
  }
  r.server_argv = server_argv;
  r.seed = seed;
  r.clients = clients;
  r.duration = duration;
  r.ran = ran;
  r.kill_interval = kill_interval;
  r.load_before = load_before;
  r.load_during = load_during;
  r.secure = secure;
  r.library_clients = library_clients;
  r.hostile_clients = hostile_clients;
  r.log = log;
  r.stats = &stats;
  r.shutdown_stats = &shutdown_stats;
  if (killer != nullptr) r.killer_report = killer->Report();
  r.load_stats = load_stats;
  r.start = start;
  r.end_of_load = end_of_load;
  r.after_clients = after_clients;
  r.rss = rss;
  r.server_died = server_died;
  r.first_stats = first_stats;
  r.last_stats = last_stats;
  r.zero_after_s = zero_after_s;
  r.idle_timeout_s = idle_timeout_s;
  r.sigterm_clients = absl::GetFlag(FLAGS_sigterm_clients);
  r.calls_before_term = calls_before_term;
  r.exit_text = exit_text;
  r.exit_ms = exit_ms;
  r.held_text = held_text;
  r.server_log = server_log;
  r.failures = failures;
  const std::string report = FormatReport(r);
  std::fwrite(report.data(), 1, report.size(), stdout);
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_report).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_report)) << report;
  }
  return failures.empty() ? 0 : 1;
}

}  // namespace
}  // namespace opserver::soak

int main(int argc, char** argv) { return opserver::soak::Main(argc, argv); }
