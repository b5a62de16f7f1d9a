#include "bench/soak_phases.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/soak_hostile.h"
#include "bench/soak_library_scenarios.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "proto/opserver.grpc.pb.h"

namespace opserver::soak {
namespace {

// The load's samples, written by the sampler while the load runs.
struct Samples {
  absl::Mutex mu;
  std::vector<ProcSample> v ABSL_GUARDED_BY(mu);
};

// Samples the server every `every` until `stop`, printing a line to
// stderr every 30 s of the load.
void Sample(const SoakRun& run, const Stats& stats, absl::Time load_start,
            absl::Duration every, const std::atomic<bool>& stop,
            Samples* samples) {
  int64_t printed = 0;
  while (!stop.load()) {
    ProcSample s = ReadProc(run.pid);
    bool ok;
    v1::ServerStats st = QueryServerStats(run.monitor, &ok);
    if (ok) SetCounts(st, &s);
    s.t = absl::ToDoubleSeconds(absl::Now() - load_start);
    {
      absl::MutexLock lock(&samples->mu);
      samples->v.push_back(s);
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
    for (absl::Time until = absl::Now() + every;
         absl::Now() < until && !stop.load();) {
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
}

// What one load client shares with the others.
struct LoadContext {
  const SoakRun* run;
  absl::Time end;
  Stats* stats;
  std::atomic<bool>* stop;
  const std::vector<std::shared_ptr<Conn>>* shared;
};

// Client i as a hostile one: the data-port flood (plain mode) or the
// tenant mallory (secure mode).
std::thread HostileClient(const LoadContext& c, int i) {
  return std::thread([c, i] {
    HostileOptions o;
    o.id = i;
    o.address = c.run->address;
    o.tenant = c.run->secure ? "mallory" : "anonymous";
    o.token = c.run->tenants.mallory;
    o.wrong_token = c.run->tenants.wrong;
    o.stats = c.stats;
    o.seed = c.run->seed + 1000 + i;
    if (c.run->secure) {
      RunHostileTenant(o, c.end, c.stop);
    } else {
      RunDataPortFlood(o, c.end, c.stop);
    }
  });
}

// Client i on the C++ client library: every other one may use the data
// path (plain mode), the rest split large transfers.
std::thread LibraryClient(const LoadContext& c, int i, std::string tenant,
                          std::string token) {
  return std::thread([c, i, tenant, token] {
    LibraryClientOptions o;
    o.id = i;
    o.address = c.run->address;
    o.tenant = tenant;
    if (c.run->secure) {
      o.connect.tls_ca_file = c.run->cert_dir + "/ca.pem";
      o.connect.token = token;
    }
    o.data_path = (i / 4) % 2 == 0;
    o.stats = c.stats;
    o.seed = c.run->seed + 1000 + i;
    RunLibraryClient(o, c.end, c.stop);
  });
}

// Client i on raw RPCs; i % 4 == 0 share four channels (one connection
// each), the rest have a connection of their own.
std::thread RpcClient(const LoadContext& c, int i, std::string tenant,
                      std::string token) {
  return std::thread([c, i, tenant, token] {
    ClientOptions o;
    o.id = i;
    o.address = c.run->address;
    o.tenant = tenant;
    o.token = token;
    if (i % 4 == 0) o.shared = (*c.shared)[(i / 4) % 4];
    o.stats = c.stats;
    o.seed = c.run->seed + 1000 + i;
    RunRpcClient(o, c.end, c.stop);
  });
}

// Which client does what (i counts from 0):
//  - i % 8 == 7: hostile;
//  - else i % 4 == 1: the C++ client library;
//  - else raw RPCs.
// Secure mode: the raw clients on shared channels and i % 4 == 2 are
// alice, the library clients and i % 4 == 3 bob.
std::vector<std::thread> StartClients(const LoadContext& c, RunSummary* r) {
  std::vector<std::thread> threads;
  const bool secure = c.run->secure;
  for (int i = 0; i < c.run->clients; ++i) {
    const bool bob = i % 4 == 1 || i % 4 == 3;
    const std::string tenant = !secure ? "anonymous" : bob ? "bob" : "alice";
    const std::string token = !secure ? ""
                              : bob   ? c.run->tenants.bob
                                      : c.run->tenants.alice;
    if (i % 8 == 7) {
      ++r->hostile_clients;
      threads.push_back(HostileClient(c, i));
    } else if (i % 4 == 1) {
      ++r->library_clients;
      threads.push_back(LibraryClient(c, i, tenant, token));
    } else {
      threads.push_back(RpcClient(c, i, tenant, token));
    }
  }
  return threads;
}

// The killer of fault children, when the run has them.
std::unique_ptr<Killer> MakeKiller(const SoakRun& run) {
  if (run.kill_interval <= absl::ZeroDuration()) return nullptr;
  std::vector<std::string> child_flags;
  if (run.secure) {
    child_flags = {absl::StrCat("--token=", run.tenants.bob),
                   absl::StrCat("--tls_ca_file=", run.cert_dir, "/ca.pem")};
  }
  return std::make_unique<Killer>(run.self, run.address, run.kill_interval,
                                  run.seed ^ 0x5eed, child_flags);
}

// Until the load's end, or until the server dies (a failure, and true).
bool WaitOutTheLoad(const SoakRun& run, absl::Time load_end, RunSummary* r) {
  int server_wstatus = 0;
  while (absl::Now() < load_end) {
    absl::SleepFor(std::min(absl::Milliseconds(200), load_end - absl::Now()));
    if (waitpid(run.pid, &server_wstatus, WNOHANG) == run.pid) {
      r->failures.push_back(absl::StrCat("the server died during the soak: ",
                                         DescribeWait(server_wstatus)));
      return true;
    }
  }
  return false;
}

// An Attach call and a health Watch held across the SIGTERM: the Attach
// must get the "server shutting down" event and the Watch NOT_SERVING,
// and both must end.
class HeldCalls {
 public:
  explicit HeldCalls(const SoakRun& run)
      : held_(Connect(run.address, true, run.tenants.alice)) {
    SetDeadline(&create_context_, absl::Seconds(30));
    SetDeadline(&attach_context_, absl::Minutes(2));
    SetDeadline(&watch_context_, absl::Minutes(2));
    v1::CreateSessionRequest create;
    create.set_client_name("soak: held across SIGTERM");
    v1::CreateSessionResponse created;
    held_->rt->CreateSession(&create_context_, create, &created);
    v1::AttachRequest attach_request;
    attach_request.set_session(created.session());
    attach_ = held_->rt->Attach(&attach_context_, attach_request);
    watch_ = held_->health->Watch(&watch_context_,
                                  grpc::health::v1::HealthCheckRequest());
    attach_reader_ = std::thread([this] {
      v1::AttachEvent event;
      while (attach_->Read(&event)) {
        absl::StrAppend(&attach_events_, event.event(), "; ");
      }
      attach_status_ = attach_->Finish();
    });
    watch_reader_ = std::thread([this] {
      grpc::health::v1::HealthCheckResponse response;
      while (watch_->Read(&response)) {
        absl::StrAppend(
            &watch_statuses_,
            grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                response.status()),
            "; ");
      }
      watch_status_ = watch_->Finish();
    });
  }

  // After both calls ended: what they saw, for the report; a failure when
  // not what they must see.
  void Join(RunSummary* r) {
    attach_reader_.join();
    watch_reader_.join();
    r->held_text = absl::StrCat(
        "An Attach call held across the signal saw `", attach_events_,
        "` and ended ", CodeName(attach_status_.error_code()),
        "; a health Watch saw `", watch_statuses_, "` and ended ",
        CodeName(watch_status_.error_code()), ".");
    if (!absl::StrContains(attach_events_, "server shutting down") ||
        !absl::StrContains(watch_statuses_, "NOT_SERVING")) {
      r->failures.push_back(absl::StrCat("around SIGTERM: ", r->held_text));
    }
  }

 private:
  std::shared_ptr<Conn> held_;
  grpc::ClientContext create_context_, attach_context_, watch_context_;
  std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> attach_;
  std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>>
      watch_;
  std::string attach_events_, watch_statuses_;
  grpc::Status attach_status_, watch_status_;
  std::thread attach_reader_, watch_reader_;
};

// SIGTERM to the server and its exit awaited: status 0 within its
// --shutdown_grace_ms (5000 by default) + 3 s, else a failure.
void TerminateAndWait(pid_t pid, RunSummary* r) {
  const absl::Time t0 = absl::Now();
  kill(pid, SIGTERM);
  int wstatus = 0;
  bool exited = false;
  // Wait up to 15 s more than the grace (more than 3 s more fails below).
  while (absl::Now() < t0 + absl::Seconds(20)) {
    if (waitpid(pid, &wstatus, WNOHANG) == pid) {
      exited = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  r->exit_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &wstatus, 0);
    r->exit_text = "still running 20 s after SIGTERM (killed)";
    r->failures.push_back(r->exit_text);
    return;
  }
  r->exit_text = DescribeWait(wstatus);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    r->failures.push_back(absl::StrCat("after SIGTERM: ", r->exit_text));
  }
  // The grace, then cancelling what still runs and releasing sessions.
  if (r->exit_ms > 5000 + 3000) {
    r->failures.push_back(absl::StrFormat(
        "the server took %.0f ms to exit after SIGTERM, more than its "
        "--shutdown_grace_ms (5000) + 3000",
        r->exit_ms));
  }
}

// The fds of the server once the clients' connections have closed (given
// ten seconds to be noticed); a failure when more than a few above `idle`.
void CheckFds(const SoakRun& run, int64_t idle, absl::Time load_start,
              RunSummary* r) {
  ProcSample& after = r->after_clients;
  for (int i = 0; i < 40; ++i) {
    after = ReadProc(run.pid);
    if (after.fds <= idle) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  after.thread_names = ThreadNames(run.pid);
  after.t = absl::ToDoubleSeconds(absl::Now() - load_start);
  SetCounts(r->last_stats, &after);
  if (after.fds > idle + 4) {
    r->failures.push_back(absl::StrCat("the server holds ", after.fds,
                                       " fds after the clients ended, ", idle,
                                       " before they started"));
  }
}

}  // namespace

void SetCounts(const v1::ServerStats& stats, ProcSample* sample) {
  sample->sessions = stats.sessions();
  sample->buffers = stats.buffers();
  sample->buffer_bytes = stats.buffer_bytes();
}

LoadOutcome RunLoad(const SoakRun& run, Stats* stats, RunSummary* r) {
  std::atomic<bool> stop{false};
  const absl::Time load_start = absl::Now();
  const absl::Time load_end = load_start + run.duration;
  SetPhase("soak", run.duration + absl::Minutes(5));
  Samples samples;
  const absl::Duration sample_every =
      std::clamp(run.duration / 120, absl::Milliseconds(250), absl::Seconds(5));
  std::thread sampler(
      [&] { Sample(run, *stats, load_start, sample_every, stop, &samples); });
  std::unique_ptr<Killer> killer = MakeKiller(run);
  std::thread killer_thread;
  if (killer != nullptr) {
    killer_thread = std::thread([&] { killer->Run(&stop); });
  }
  std::vector<std::shared_ptr<Conn>> shared;
  for (int i = 0; i < 4; ++i) {
    shared.push_back(Connect(run.address, true, run.tenants.alice));
  }
  std::vector<std::thread> threads =
      StartClients({&run, load_end, stats, &stop, &shared}, r);
  r->server_died = WaitOutTheLoad(run, load_end, r);
  r->end_of_load = ReadProc(run.pid);
  r->end_of_load.t = absl::ToDoubleSeconds(absl::Now() - load_start);
  bool ok;
  r->load_stats = QueryServerStats(run.monitor, &ok);
  SetCounts(r->load_stats, &r->end_of_load);
  r->load_during = LoadAverage();
  SetPhase("clients ending", absl::Minutes(5));
  if (r->server_died) stop = true;
  for (std::thread& t : threads) t.join();
  shared.clear();
  stop = true;
  if (killer_thread.joinable()) killer_thread.join();
  sampler.join();
  r->ran = absl::Now() - load_start;

  LoadOutcome outcome;
  outcome.start = load_start;
  {
    absl::MutexLock lock(&samples.mu);
    outcome.samples = samples.v;
  }
  outcome.samples.push_back(r->end_of_load);
  if (killer != nullptr) {
    r->killer_report = killer->Report();
    outcome.killer_failures = killer->failures();
  }
  return outcome;
}

void CheckLeaks(const SoakRun& run, const LoadOutcome& load, RunSummary* r) {
  SetPhase("leak check", absl::Seconds(run.idle_timeout_s + 60));
  if (r->server_died) return;
  const absl::Time t0 = absl::Now();
  bool stats_ok = false;
  r->first_stats = QueryServerStats(run.monitor, &stats_ok);
  r->last_stats = r->first_stats;
  const absl::Time deadline = t0 + absl::Seconds(run.idle_timeout_s + 15);
  while (stats_ok && absl::Now() < deadline) {
    r->last_stats = QueryServerStats(run.monitor, &stats_ok);
    if (r->last_stats.sessions() == 0 && r->last_stats.buffers() == 0 &&
        r->last_stats.buffer_bytes() == 0) {
      r->zero_after_s = absl::ToDoubleSeconds(absl::Now() - t0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  if (r->zero_after_s < 0) {
    r->failures.push_back(absl::StrCat(
        "leak: ", r->last_stats.sessions(), " sessions, ",
        r->last_stats.buffers(), " buffers, ", r->last_stats.buffer_bytes(),
        " bytes ", run.idle_timeout_s + 15, " s after every client ended"));
  }
  // Connections of the clients and children close; give the server a
  // moment to notice before counting its fds.
  CheckFds(run, r->start.fds, load.start, r);
}

void SigtermUnderLoad(const SoakRun& run, Stats* shutdown_stats,
                      RunSummary* r) {
  r->exit_text = "not run (the server died earlier)";
  if (r->server_died) {
    server_pid = 0;
    return;
  }
  SetPhase("SIGTERM under load", absl::Minutes(3));
  std::atomic<bool> stop_load{false};
  std::vector<std::thread> load;
  const int n = run.sigterm_clients;
  for (int i = 0; i < n; ++i) {
    load.emplace_back([&, i] {
      ClientOptions o;
      o.id = 10000 + i;
      o.address = run.address;
      o.stats = shutdown_stats;
      o.seed = run.seed + 50000 + i;
      o.mode = Mode::kShutdown;
      o.token = run.tenants.alice;
      RunRpcClient(o, absl::InfiniteFuture(), &stop_load, i < 2 ? 1 + i : 0);
    });
  }
  const absl::Time busy_by = absl::Now() + absl::Seconds(10);
  absl::SleepFor(absl::Seconds(2));
  while (shutdown_stats->total_calls() < 50 * static_cast<uint64_t>(n) &&
         absl::Now() < busy_by) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  r->calls_before_term = shutdown_stats->total_calls();
  HeldCalls held(run);
  absl::SleepFor(absl::Milliseconds(200));
  TerminateAndWait(run.pid, r);
  server_pid = 0;
  stop_load = true;
  for (std::thread& t : load) t.join();
  held.Join(r);
}

void Judge(const SoakRun& run, const std::string& rss_check,
           const LoadOutcome& load, RunSummary* r) {
  r->server_log = ReadServerLog(r->log, /*tokens=*/run.secure);
  if (!r->server_log.odd_lines.empty()) {
    r->failures.push_back(absl::StrCat(r->server_log.kinds.at("other"),
                                       " server log lines of an unknown kind"));
  }
  if (!r->server_died && !r->server_log.stopped) {
    r->failures.push_back("no 'stopped' line in the server log");
  }
  const bool check_rss =
      rss_check == "on" ||
      (rss_check == "auto" && run.duration >= absl::Minutes(3));
  r->rss =
      AnalyzeRss(load.samples, absl::ToDoubleSeconds(run.duration), check_rss);
  if (check_rss && r->rss.enough && !r->rss.flat) {
    r->failures.push_back(absl::StrCat("RSS not flat: ", r->rss.verdict));
  }
  if (r->stats->unexpected() > 0) {
    r->failures.push_back(absl::StrCat(r->stats->unexpected(),
                                       " unexpected outcomes during the soak"));
  }
  if (r->shutdown_stats->unexpected() > 0) {
    r->failures.push_back(absl::StrCat(r->shutdown_stats->unexpected(),
                                       " unexpected outcomes around SIGTERM"));
  }
  // Large transfers went where the mode sends them: over the data path
  // for the library clients that may use it (plain mode), never with TLS.
  const bool data_path_clients = !run.secure && run.clients >= 2;
  if (!r->server_died) {
    if (data_path_clients && r->load_stats.data_path_transfers() == 0) {
      r->failures.push_back(
          "no transfer used the data path, though library clients had it");
    }
    if (run.secure && r->load_stats.data_path_transfers() != 0) {
      r->failures.push_back("transfers used the data path with TLS on");
    }
  }
  if (load.killer_failures > 0) {
    r->failures.push_back(absl::StrCat(
        load.killer_failures, " fault children did not die as planned"));
  }
}

}  // namespace opserver::soak
