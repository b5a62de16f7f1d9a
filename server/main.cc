// opserver: serves the backward operators of the aclnn API over gRPC.
// This file only parses flags and runs a Server built from them.

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/cli_flags.h"
#include "common/thread_start.h"
#include "devices/device_factory.h"
#include "grpc/grpc.h"
#include "runtime/log.h"
#include "runtime/preflight.h"
#include "server/etcd_registration.h"
#include "server/server.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "HOST:PORT or [IPV6]:PORT to listen on; port 0 picks a free port "
          "(the chosen one is printed as 'listening on HOST:PORT').");
ABSL_FLAG(int, threads, 0,
          "Compute threads of the device (0 = one per hardware thread).");
ABSL_FLAG(std::string, device, "cpu",
          "Device to serve: cpu, or ascend (NPU 0 through CANN's libraries, "
          "see --cann_libraries) or ascend:N,M,... (those NPUs, one "
          "opserver device each).");
ABSL_FLAG(int, devices, 1,
          "Devices to serve (1-64); a session picks one at CreateSession. "
          "The cpu device is split into this many logical devices, each "
          "with its own streams and a capacity of --device_memory_bytes / "
          "N rounded down to whole 4096-byte pages (of half of physical "
          "memory when that flag is 0) and a reuse cache of "
          "--memory_cache_bytes / N; all N compute on one pool of --threads "
          "threads. Not for ascend, whose --device names its NPUs.");
ABSL_FLAG(std::vector<std::string>, cann_libraries, {},
          "For --device=ascend: the CANN libraries to load, comma-separated, "
          "in order, into a link-map namespace of their own (empty = "
          "libascendcl.so,libnnopbase.so,libopapi.so from "
          "$ASCEND_HOME_PATH/lib64 or LD_LIBRARY_PATH, as CANN's set_env.sh "
          "sets them). A missing library or symbol stops the server (exit "
          "status 2).");
ABSL_FLAG(uint64_t, max_message_bytes, 64ull << 20,
          "Largest gRPC message accepted or sent, in bytes.");
ABSL_FLAG(uint64_t, chunk_bytes, 4ull << 20,
          "Download chunk size in bytes (must fit in a message).");
ABSL_FLAG(uint64_t, staging_chunk_bytes, 4ull << 20,
          "Staging chunk of data-path transfers on a device the host cannot "
          "address (--device=ascend), in bytes: one device copy per chunk; "
          "a transfer holds three chunks of page-locked memory (1 to 1 GiB).");
ABSL_FLAG(uint64_t, max_staging_bytes, 1ull << 30,
          "With --device=ascend, page-locked staging memory the running "
          "transfers of each NPU may hold at once, in bytes (each holds "
          "three chunks); one past it fails RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint64_t, session_memory_bytes, 16ull << 30,
          "Device memory one session may hold, in bytes.");
ABSL_FLAG(uint32_t, max_sessions, 64, "Sessions open at once.");
ABSL_FLAG(uint32_t, max_handles_per_session, 65536,
          "Buffers + streams + executors one session may hold.");
ABSL_FLAG(uint32_t, max_streams_per_session, 16,
          "Streams one session may create (each runs on its own thread).");
ABSL_FLAG(int, idle_timeout_s, 300,
          "A session no call has named for this long is closed (sessions "
          "bound to an Attach stream end with it instead).");
ABSL_FLAG(int, callback_block_timeout_ms, 60000,
          "How long a blocking host callback (ACL_CALLBACK_BLOCK, "
          "aclrtLaunchHostFunc) may hold its stream once its client was "
          "told; then the stream goes on and its next synchronize reports "
          "DEADLINE_EXCEEDED (aclnn 507012).");
ABSL_FLAG(uint32_t, max_values, 1u << 20,
          "Most typed values one WriteValues/ReadValues/Evaluate tensor may "
          "carry.");
ABSL_FLAG(uint64_t, memory_cache_bytes, 4ull << 30,
          "Freed device memory kept for reuse, in bytes (fresh memory is "
          "slow: the first touch of host pages, aclrtMalloc); with "
          "--devices=N each CPU device keeps a share, each NPU this much.");
ABSL_FLAG(uint64_t, device_memory_bytes, 0,
          "Device memory capacity in bytes: every session's buffers, "
          "workspaces, Evaluate scratch and the reuse cache together; Malloc "
          "beyond it is RESOURCE_EXHAUSTED (0 = half of physical memory for "
          "the CPU device).");
ABSL_FLAG(uint32_t, max_queued_per_stream, 16384,
          "Launches that may wait on one stream; more are "
          "RESOURCE_EXHAUSTED until it drains.");
ABSL_FLAG(uint64_t, max_launch_elements, 1ull << 31,
          "Most elements one launch may compute (bounds how long one launch "
          "holds a stream).");
ABSL_FLAG(uint32_t, max_pending_replies, 1024,
          "ExecuteStream replies that may wait for a client that does not "
          "read them; the server stops reading launches at this many.");
ABSL_FLAG(uint32_t, max_attach_per_session, 4,
          "Attach calls one session may have open; more are "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint32_t, max_pending_synchronizes_per_session, 256,
          "SynchronizeStream and SynchronizeEvent calls one session may have "
          "waiting; more are RESOURCE_EXHAUSTED. A cancelled call, or one "
          "past its deadline, stops counting at once.");
ABSL_FLAG(uint32_t, max_graphs_per_session, 64,
          "Graphs (captured steps, defined by the Pipeline's define_graph) "
          "one session may hold; more are RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint64_t, max_graph_tasks_per_session, 65536,
          "Tasks of all the graphs one session holds together; a definition "
          "past it is RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint32_t, max_concurrent_evaluates, 4,
          "Evaluate calls that may compute at once.");
ABSL_FLAG(uint32_t, max_pipelines_per_session, 8,
          "Operators/Pipeline channels one session may have open.");
ABSL_FLAG(uint64_t, max_pipeline_batch_bytes, 4ull << 20,
          "Largest Pipeline batch (one PipelineRequest message), in bytes; "
          "a larger one ends its channel with RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint32_t, max_pipeline_batch_commands, 65536,
          "Most commands one Pipeline batch may hold.");
ABSL_FLAG(int32_t, work_threads, 0,
          "Threads that parse and apply Pipeline batches, clear new buffers "
          "and run Evaluate calls, taking turns between sessions; 0 = one "
          "per hardware thread (at least 2).");
ABSL_FLAG(uint32_t, max_sessions_per_tenant, 0,
          "Sessions one client identity (token tenant or certificate) may "
          "hold at once; 0 = only --max_sessions.");
ABSL_FLAG(uint64_t, tenant_memory_bytes, 0,
          "Device memory one client identity may hold across its sessions, "
          "in bytes; 0 = only --session_memory_bytes per session.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain of the server; serves TLS (with "
          "--tls_key_file).");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of the server.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA certificates: clients must present a certificate signed "
          "by one (mTLS).");
ABSL_FLAG(int, tls_refresh_interval_s, 60,
          "How often the --tls_* files are re-read, so rotated certificates "
          "take effect without a restart.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File of 'TENANT TOKEN' lines ('#' comments); every call but "
          "grpc.health.v1 then needs 'authorization: Bearer TOKEN'. SIGHUP "
          "re-reads it.");
ABSL_FLAG(bool, reflection_without_auth, false,
          "Let server reflection answer calls without a token.");
ABSL_FLAG(uint32_t, max_health_watches, 100,
          "grpc.health.v1 Watch streams open at once, server-wide (they need "
          "no token); more are RESOURCE_EXHAUSTED. Check is not limited.");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus metrics on (/metrics, text format); "
          "port 0 picks a free port (printed as 'metrics on HOST:PORT'). "
          "Off when empty. A non-loopback address needs --allow_insecure: "
          "the page names tenants.");
ABSL_FLAG(bool, preflight, false,
          "Check the devices instead of serving: list the devices --device "
          "opens with their memory, run every operator once on a tiny "
          "tensor on each and compare it bit for bit with the CPU device; "
          "exit 0 when all match, 1 when one does not, 2 when the devices "
          "cannot be opened. Opens no port.");
ABSL_FLAG(std::string, health_listen, "",
          "HOST:PORT to serve grpc.health.v1 alone on, in plaintext and "
          "without a token (for probes that speak no TLS, such as "
          "Kubernetes'), beside a TLS --listen port; port 0 picks a free "
          "port (printed as 'health on HOST:PORT'). Off when empty.");
ABSL_FLAG(int, metrics_threads, 8,
          "Threads serving /metrics: so many connections are served at once, "
          "and one that sends half a request holds one until "
          "--metrics_request_timeout_ms ends it.");
ABSL_FLAG(int, metrics_request_timeout_ms, 5000,
          "A /metrics connection that has not sent its whole request (or "
          "not read the reply) in this long is closed.");
ABSL_FLAG(bool, allow_insecure, false,
          "Serve a non-loopback --listen address without TLS and "
          "authentication anyway.");
ABSL_FLAG(int, transfer_idle_timeout_s, 60,
          "An Upload or Download that moves no data for this long (its "
          "client stopped sending or reading) is ended with "
          "DEADLINE_EXCEEDED, releasing its stream and buffer.");
ABSL_FLAG(uint64_t, receive_window_bytes, 4ull << 20,
          "HTTP/2 receive window of each call: what a client may send ahead "
          "of what the server has read, so about what an upload holds in "
          "memory besides its buffer. 0 = gRPC's BDP probing (the window "
          "grows with the sender's speed, unbounded by this flag).");
ABSL_FLAG(int, data_port, 0,
          "TCP port of the data path, on the --listen host: large uploads "
          "and downloads move there as raw bytes instead of through gRPC "
          "(plain TCP, so off with TLS). 0 = any free port (clients learn "
          "it per transfer), -1 = off.");
ABSL_FLAG(std::string, data_advertise, "",
          "HOST:PORT clients should connect to for the data path instead of "
          "--data_port on the host they dialed: an address they can reach "
          "when that host is a proxy's (or behind NAT), forwarded to "
          "--data_port. IPv6 hosts in brackets. Empty = none; clients that "
          "cannot reach the data path move bytes through gRPC.");
ABSL_FLAG(bool, detect_mutex_deadlocks, false,
          "Keep Abseil's Mutex deadlock detection on (a debugging aid: it "
          "records every lock order and halves the pipelined launch rate).");
ABSL_FLAG(int, shutdown_grace_ms, 5000,
          "On SIGINT/SIGTERM, how long in-flight calls may finish before "
          "they are cancelled (after the drain, if any).");
ABSL_FLAG(int, drain_s, 0,
          "On SIGTERM, first drain for up to this many seconds: health "
          "turns NOT_SERVING, CreateSession is refused (UNAVAILABLE, "
          "\"server draining\") and open sessions go on until they close; "
          "the server exits as soon as none is left. A second SIGTERM (or "
          "SIGINT) ends the drain. 0 = no drain; SIGINT never drains.");

ABSL_FLAG(std::string, register, "",
          "etcd://HOST:PORT[,HOST:PORT...]/PREFIX: register every device "
          "under /PREFIX/devices/ in etcd, bound to a lease renewed every "
          "third of --register_ttl_s, for clients that take the same "
          "address (docs/pool.md). The keys go when the server drains or "
          "exits and expire when it dies. Off when empty.");
ABSL_FLAG(int, register_ttl_s, 10,
          "The etcd lease's time to live (at least 2): how long a server "
          "that died stays registered.");
ABSL_FLAG(std::string, register_address, "",
          "HOST:PORT clients dial to reach this server, as registered in "
          "etcd; empty = the --listen address (which then must not be a "
          "wildcard such as 0.0.0.0).");
ABSL_FLAG(std::string, etcd_ca_file, "",
          "PEM CA of etcd's TLS certificates: --register speaks TLS to "
          "etcd. Off when empty.");
ABSL_FLAG(std::string, etcd_cert_file, "",
          "PEM client certificate for etcd (with --etcd_key_file).");
ABSL_FLAG(std::string, etcd_key_file, "", "PEM key of --etcd_cert_file.");
ABSL_FLAG(std::string, etcd_user, "",
          "etcd user name (etcd's authentication); the password is read "
          "from --etcd_password_file.");
ABSL_FLAG(std::string, etcd_password_file, "",
          "File holding the --etcd_user's password (its first line).");

namespace {

// --preflight: the devices, and every operator once on each against the
// CPU device (runtime/preflight.h); 0 when all matched, 1 when one did not,
// 2 when the devices cannot be opened.
int Preflight(const opserver::Options& options) {
  absl::StatusOr<std::vector<std::unique_ptr<opserver::Device>>> devices =
      opserver::CreateDevices(opserver::DeviceOptionsFor(options));
  if (!devices.ok()) {
    opserver::LogLine(
        absl::StrCat("error: --device: ", devices.status().message()));
    return 2;
  }
  opserver::DeviceOptions cpu;
  cpu.threads = 1;
  cpu.memory_cache_bytes = 0;
  cpu.memory_bytes = 64 << 20;
  absl::StatusOr<std::unique_ptr<opserver::Device>> reference =
      opserver::CreateDevice(cpu);
  if (!reference.ok()) {
    opserver::LogLine(absl::StrCat("error: the CPU device: ",
                                   reference.status().message()));
    return 2;
  }
  std::vector<opserver::Device*> list;
  for (const auto& device : *devices) list.push_back(device.get());
  const bool passed = opserver::RunPreflight(list, **reference, std::cout);
  std::cout.flush();
  return passed ? 0 : 1;
}

// The Options sub-structs, each from its flags.
opserver::SessionLimits SessionLimitsFromFlags() {
  opserver::SessionLimits limits;
  limits.session_memory_bytes = absl::GetFlag(FLAGS_session_memory_bytes);
  limits.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  limits.max_handles_per_session =
      absl::GetFlag(FLAGS_max_handles_per_session);
  limits.max_streams_per_session =
      absl::GetFlag(FLAGS_max_streams_per_session);
  limits.max_queued_per_stream = absl::GetFlag(FLAGS_max_queued_per_stream);
  limits.max_launch_elements = absl::GetFlag(FLAGS_max_launch_elements);
  limits.max_pending_replies = absl::GetFlag(FLAGS_max_pending_replies);
  limits.max_concurrent_evaluates =
      absl::GetFlag(FLAGS_max_concurrent_evaluates);
  limits.max_pipelines_per_session =
      absl::GetFlag(FLAGS_max_pipelines_per_session);
  limits.max_pipeline_batch_bytes =
      absl::GetFlag(FLAGS_max_pipeline_batch_bytes);
  limits.max_pipeline_batch_commands =
      absl::GetFlag(FLAGS_max_pipeline_batch_commands);
  limits.max_attach_per_session = absl::GetFlag(FLAGS_max_attach_per_session);
  limits.max_pending_synchronizes_per_session =
      absl::GetFlag(FLAGS_max_pending_synchronizes_per_session);
  limits.max_graphs_per_session = absl::GetFlag(FLAGS_max_graphs_per_session);
  limits.max_graph_tasks_per_session =
      absl::GetFlag(FLAGS_max_graph_tasks_per_session);
  limits.idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_idle_timeout_s));
  limits.callback_block_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_callback_block_timeout_ms));
  limits.max_sessions_per_tenant =
      absl::GetFlag(FLAGS_max_sessions_per_tenant);
  limits.tenant_memory_bytes = absl::GetFlag(FLAGS_tenant_memory_bytes);
  return limits;
}

opserver::TransferLimits TransferLimitsFromFlags() {
  opserver::TransferLimits limits;
  limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  limits.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  limits.staging_chunk_bytes = absl::GetFlag(FLAGS_staging_chunk_bytes);
  limits.max_values = absl::GetFlag(FLAGS_max_values);
  limits.idle_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_transfer_idle_timeout_s));
  return limits;
}

opserver::MetricsServeOptions MetricsServeFromFlags() {
  opserver::MetricsServeOptions serve;
  serve.threads = absl::GetFlag(FLAGS_metrics_threads);
  serve.request_timeout = absl::Milliseconds(
      std::max(1, absl::GetFlag(FLAGS_metrics_request_timeout_ms)));
  return serve;
}

// The devices and the threads that compute on them.
void SetDeviceFlags(opserver::Options& options) {
  options.threads = absl::GetFlag(FLAGS_threads);
  options.work_threads = absl::GetFlag(FLAGS_work_threads);
  options.device = absl::GetFlag(FLAGS_device);
  options.devices = absl::GetFlag(FLAGS_devices);
  options.cann_libraries = absl::GetFlag(FLAGS_cann_libraries);
  options.memory_cache_bytes = absl::GetFlag(FLAGS_memory_cache_bytes);
  options.device_memory_bytes = absl::GetFlag(FLAGS_device_memory_bytes);
  options.max_staging_bytes = absl::GetFlag(FLAGS_max_staging_bytes);
}

// TLS, tokens and what may go without them.
void SetSecurityFlags(opserver::Options& options) {
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  options.tls_refresh_interval_s = absl::GetFlag(FLAGS_tls_refresh_interval_s);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.reflection_without_auth =
      absl::GetFlag(FLAGS_reflection_without_auth);
  options.allow_insecure = absl::GetFlag(FLAGS_allow_insecure);
}

opserver::Options OptionsFromFlags() {
  opserver::Options options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.health_listen = absl::GetFlag(FLAGS_health_listen);
  options.metrics_serve = MetricsServeFromFlags();
  SetDeviceFlags(options);
  options.session_limits = SessionLimitsFromFlags();
  options.transfer_limits = TransferLimitsFromFlags();
  SetSecurityFlags(options);
  options.max_health_watches = absl::GetFlag(FLAGS_max_health_watches);
  options.receive_window_bytes = absl::GetFlag(FLAGS_receive_window_bytes);
  options.data_port = absl::GetFlag(FLAGS_data_port);
  options.data_advertise = absl::GetFlag(FLAGS_data_advertise);
  options.shutdown_grace =
      absl::Milliseconds(std::max(0, absl::GetFlag(FLAGS_shutdown_grace_ms)));
  options.detect_mutex_deadlocks = absl::GetFlag(FLAGS_detect_mutex_deadlocks);
  options.drain = absl::Seconds(std::max(0, absl::GetFlag(FLAGS_drain_s)));
  return options;
}

// Block the shutdown and reload signals before any thread starts so every
// thread inherits the mask and sigwait() is the only receiver.
sigset_t BlockSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// --register: the server in etcd (null without the flag). Registered
// before "listening on", which tools wait for: a client that sees the line
// finds the server in etcd. A registration that fails ends the process.
std::unique_ptr<opserver::EtcdRegistration> RegisterOrExit(
    opserver::Server& server) {
  if (absl::GetFlag(FLAGS_register).empty()) return nullptr;
  auto registered = opserver::RegisterServer(
      {absl::GetFlag(FLAGS_register), absl::GetFlag(FLAGS_register_ttl_s),
       absl::GetFlag(FLAGS_register_address),
       absl::GetFlag(FLAGS_etcd_ca_file), absl::GetFlag(FLAGS_etcd_cert_file),
       absl::GetFlag(FLAGS_etcd_key_file), absl::GetFlag(FLAGS_etcd_user),
       absl::GetFlag(FLAGS_etcd_password_file)},
      server);
  if (!registered.ok()) {
    opserver::LogLine(
        absl::StrCat("error: --register: ", registered.status().message()));
    server.Shutdown();
    std::_Exit(opserver::kUsageErrorExit);
  }
  return *std::move(registered);
}

// SIGHUP: certificates are re-read on their own (--tls_refresh_interval_s);
// tokens are swapped now. A bad file keeps the old tokens.
void ReloadTokens(opserver::Server& server) {
  if (absl::Status status = server.ReloadTokens(); !status.ok()) {
    opserver::LogLine(absl::StrCat("SIGHUP: ", status.message()));
  }
}

// Waits for a signal of `signals` other than SIGHUP (which reloads the
// tokens) and returns it.
int WaitForSignal(const sigset_t& signals, opserver::Server& server) {
  int signal_number = 0;
  for (;;) {
    sigwait(&signals, &signal_number);
    if (signal_number != SIGHUP) return signal_number;
    ReloadTokens(server);
  }
}

// SIGTERM with --drain_s: out of etcd, then the drain, until every session
// has closed, its time is up or a second SIGTERM (or SIGINT) ends it.
void DrainServer(opserver::Server& server, absl::Duration drain_time,
                 opserver::EtcdRegistration* registration,
                 const sigset_t& signals, int signal_number) {
  opserver::LogLine(absl::StrCat(
      "received ", strsignal(signal_number), ", draining for up to ",
      absl::FormatDuration(drain_time), " (",
      server.sessions().session_count(),
      " sessions open; a second SIGTERM ends the drain)"));
  // The drain waits on its own thread so that this one stays the only
  // receiver of signals; when it ends, it wakes the sigwait below.
  // Out of etcd first: no new job finds a server that refuses sessions.
  if (registration != nullptr) registration->Withdraw();
  std::atomic<bool> drained{false};
  const pthread_t main_thread = pthread_self();
  auto drain = [&] {
    const opserver::Server::DrainEnd end = server.Drain();
    if (end == opserver::Server::DrainEnd::kSessionsClosed) {
      opserver::LogLine("drained: every session has closed");
    } else if (end == opserver::Server::DrainEnd::kTimeUp) {
      opserver::LogLine(absl::StrCat("drain time is over with ",
                                     server.sessions().session_count(),
                                     " sessions open"));
    }
    drained.store(true);
  };
  absl::StatusOr<std::thread> drainer =
      opserver::StartThread("the drain thread", [&] {
        drain();
        pthread_kill(main_thread, SIGTERM);
      });
  if (!drainer.ok()) {
    // No thread (a client holds every thread the process may have): the
    // drain runs here, to its end or its time limit; a second SIGTERM
    // waits for it.
    opserver::LogLine(absl::StrCat(drainer.status().message(),
                                   "; draining on the main thread"));
    drain();
  } else {
    signal_number = WaitForSignal(signals, server);
  }
  if (!drained.load()) {
    opserver::LogLine(absl::StrCat("received ", strsignal(signal_number),
                                   " while draining: ending the drain"));
    server.EndDrain();
  }
  if (drainer.ok()) drainer->join();
  opserver::LogLine("shutting down");
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<char*> args = opserver::ParseFlagsOrExit(
      argc, argv, "opserver",
      "Serves aclnn backward operators over gRPC.\n\n"
      "Usage: opserver [--listen=HOST:PORT] [--device=cpu|ascend[:N,...]] "
      "[--threads=N] [FLAG...]\n\n"
      "Every flag is in docs/server-flags.md; --helpfull also lists the "
      "libraries' flags, --version prints the release, commit and build "
      "mode. A flag that cannot be used exits with status 2.",
      "server/main.cc");
  if (args.size() > 1) {
    std::fprintf(stderr,
                 "opserver: unexpected argument '%s'; opserver takes only "
                 "flags (try --help)\n",
                 args[1]);
    return opserver::kUsageErrorExit;
  }
  const sigset_t signals = BlockSignals();
  const opserver::Options options = OptionsFromFlags();

  if (absl::GetFlag(FLAGS_preflight)) return Preflight(options);

  // The last grpc_shutdown() (destroying the last grpc::Server runs it)
  // does gRPC's library-wide cleanup, which joins gRPC's executor threads;
  // one of them can be polling until an internal timer fires, and the soak
  // (bench/soak.cc) saw the process exit up to 10 s after "stopped", past
  // --shutdown_grace_ms. This reference keeps the server's destruction from
  // running that cleanup; the process ends without it below, once
  // everything opserver owns is released.
  grpc_init();
  auto server = opserver::Server::Start(options);
  if (!server.ok()) {
    opserver::LogLine(absl::StrCat("error: ", server.status().message()));
    return 2;
  }
  if (!(*server)->metrics_address().empty()) {
    // Before "listening on", which tools wait for: both are known then.
    std::printf("metrics on %s\n", (*server)->metrics_address().c_str());
  }
  if (!(*server)->health_address().empty()) {
    std::printf("health on %s\n", (*server)->health_address().c_str());
  }
  std::unique_ptr<opserver::EtcdRegistration> registration =
      RegisterOrExit(**server);
  std::printf("listening on %s\n", (*server)->address().c_str());
  std::fflush(stdout);
  opserver::LogLine(absl::StrCat("started: listening on ", (*server)->address(),
                                 ", device ", options.device));

  const int signal_number = WaitForSignal(signals, **server);
  if (signal_number == SIGTERM && options.drain > absl::ZeroDuration()) {
    DrainServer(**server, options.drain, registration.get(), signals,
                signal_number);
  } else {
    opserver::LogLine(
        absl::StrCat("received ", strsignal(signal_number), ", shutting down"));
  }
  if (registration != nullptr) registration->Withdraw();
  (*server)->Shutdown();
  // Sessions (their memory, their streams' running launches), the device
  // and the gRPC server.
  server->reset();
  opserver::LogLine("stopped");
#if defined(__SANITIZE_ADDRESS__)
  // _Exit skips LeakSanitizer's check at exit; what gRPC still holds is
  // referenced from its globals and not reported.
  __lsan_do_leak_check();
#endif
  std::fflush(stdout);
  std::_Exit(0);
}
