#ifndef OPSERVER_SERVER_SERVER_H_
#define OPSERVER_SERVER_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "devices/device.h"
#include "grpcpp/grpcpp.h"
#include "runtime/session.h"
#include "runtime/session_manager.h"
#include "runtime/work_pool.h"
#include "server/auth.h"
#include "server/call_log.h"
#include "server/data_listener.h"
#include "server/health_service.h"
#include "server/metrics.h"
#include "server/operator_service.h"
#include "server/runtime_service.h"

namespace opserver {

// Everything main() turns flags into. Defaults are the production defaults.
struct Options {
  // HOST:PORT or [IPV6]:PORT; port 0 picks a free port (see Server::port()).
  std::string listen = "127.0.0.1:50051";
  // Compute threads of the device; 0 = one per hardware thread.
  int threads = 0;
  // Threads that parse and apply Pipeline batches, clear new buffers and
  // run Evaluate calls, fairly between clients (runtime/work_pool.h); 0 =
  // one per hardware thread, at least 2.
  int work_threads = 0;
  // HOST:PORT to serve Prometheus metrics on (/metrics; port 0: any, see
  // Server::metrics_port()); empty: none. Like `listen`, an address other
  // machines can reach needs allow_insecure: the page names tenants.
  std::string metrics_listen;
  // HOST:PORT to serve grpc.health.v1 alone on, in plaintext, beside a
  // TLS (or token) `listen` port: Kubernetes' gRPC probes speak no TLS and
  // send no token. It answers what the main port's health service answers
  // (NOT_SERVING while draining) and serves nothing else (server
  // reflection there lists only the health service). Any address: the
  // health of a server is not a secret. Empty: none.
  std::string health_listen;
  // Threads, request time-out and queue of the /metrics server
  // (--metrics_threads, --metrics_request_timeout_ms).
  MetricsServeOptions metrics_serve;
  // Count metrics at all (the interceptor and the event counters). Off
  // only to measure what counting costs (bench/step_bench's A/B).
  bool metrics = true;
  // Device kind: "cpu", or "ascend" (NPU 0) / "ascend:N,M,..." (those NPUs).
  std::string device = "cpu";
  // Devices the server owns (--devices; DeviceOptions::devices): the CPU
  // device is split into this many logical devices, each with an equal
  // share of device_memory_bytes and memory_cache_bytes and its own
  // streams, all computing on one pool of `threads` threads. An Ascend
  // device list (ascend:0,1) names its devices itself.
  int devices = 1;
  // The CANN libraries the Ascend device loads (--cann_libraries); empty =
  // CANN's own, found as its set_env.sh arranges.
  std::vector<std::string> cann_libraries;
  // How long Shutdown() lets in-flight calls finish before cancelling them.
  absl::Duration shutdown_grace = absl::Seconds(5);
  // How long Drain() lets open sessions go on (opserver --drain_s, after
  // SIGTERM) before the shutdown; zero: no drain.
  absl::Duration drain = absl::ZeroDuration();
  // Abseil's Mutex deadlock detection (on in Debian's Abseil build) records
  // every lock order in a process-wide graph. Tests keep it (it aborts on a
  // lock-order inversion); the opserver binary turns it off
  // (--detect_mutex_deadlocks=false): it halved the pipelined launch rate.
  // Process-wide, set by Start().
  bool detect_mutex_deadlocks = true;
  // Freed device memory the CPU device keeps for reuse (split between the
  // devices like device_memory_bytes).
  uint64_t memory_cache_bytes = 4ull << 30;
  // The device's capacity: all sessions' buffers, workspaces, Evaluate
  // scratch and the reuse cache together. 0 = the device's safe default
  // (half of physical memory for the CPU device). With several devices,
  // the total they share: each gets device_memory_bytes / devices, rounded
  // down to whole 4 KiB pages.
  uint64_t device_memory_bytes = 0;
  // --device=ascend: page-locked staging memory each NPU's running
  // transfers may hold at once (DeviceOptions::staging_bytes). At least
  // one transfer's three chunks of the larger of the transfer limits'
  // chunk_bytes and staging_chunk_bytes.
  uint64_t max_staging_bytes = 1ull << 30;
  // Sessions, handles, memory and idle timeout.
  SessionLimits session_limits;
  // Chunk and message sizes, typed-value counts.
  TransferLimits transfer_limits;
  // HTTP/2 receive window of each call (what a client may send ahead of
  // what the server has read): bounds the memory an upload holds in gRPC's
  // buffers besides its device buffer. 0 = gRPC's BDP probing, which grows
  // the window as far as the sender keeps the link busy (fastest, but the
  // memory follows the sender, not this setting). See BENCHMARKS.md for the
  // measured trade-off: 4 MiB (one default chunk) held uploads at the
  // socket's speed on loopback with 2-3 chunks of memory, where BDP probing
  // used 6-20 chunks and was no faster (gRPC also opens the window to the
  // rest of a message the server is waiting for: 64 KiB was as fast).
  uint64_t receive_window_bytes = 4ull << 20;

  // TLS: the server's PEM certificate chain and private key (both or
  // neither). With a client CA, clients must present a certificate it signed
  // (mTLS). The files are re-read every tls_refresh_interval_s seconds, so
  // rotated certificates take effect without a restart.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  int tls_refresh_interval_s = 60;
  // "TENANT TOKEN" lines (see TokenTable::Load). When set, every call but
  // grpc.health.v1 needs "authorization: Bearer TOKEN" metadata.
  std::string auth_token_file;
  // The data path (common/data_path.h): a TCP port beside the gRPC one,
  // on the same host, that carries the bytes of large transfers without
  // copying them through gRPC (OpenDataTransfer; BENCHMARKS.md). 0: any
  // free port (the client learns it from each OpenDataTransfer reply);
  // -1: off. Always off with TLS: the data path is plain TCP, and TLS
  // transfers stay on the encrypted channel.
  int data_port = 0;
  // HOST:PORT clients should connect to for the data path instead of
  // data_port on the host they dialed (--data_advertise): an address they
  // can reach when that host is a proxy's, or the server is behind NAT.
  // Sent in every OpenDataTransfer reply; clients that cannot use it move
  // their bytes through gRPC. Empty: none. Needs the data path on.
  std::string data_advertise;
  // For tests: DataListener::Options::drop_accepted (closes chosen data
  // connections as soon as they are accepted).
  std::function<bool()> data_drop_accepted;
  // For tests: DataListener::Options::drop_kept (closes chosen kept data
  // connections when their next ticket comes).
  std::function<bool()> data_drop_kept;
  // Lets server reflection answer without a token.
  bool reflection_without_auth = false;
  // grpc.health.v1 Health.Watch streams open at once, server-wide: they
  // need no token, so without a bound anyone who can connect could hold
  // memory with them. Beyond it Watch is RESOURCE_EXHAUSTED (Check still
  // answers).
  uint32_t max_health_watches = 100;
  // Serve a non-loopback address without TLS plus authentication (tokens or
  // client certificates) anyway; otherwise Start refuses.
  bool allow_insecure = false;
};

// The devices `options` ask for (--device, --devices, --threads, the
// memory and CANN flags), as CreateDevices takes them.
DeviceOptions DeviceOptionsFor(const Options& options);

// A running opserver: the device plus the gRPC server with the opserver
// services, grpc.health.v1 and server reflection.
//
//   auto server = Server::Start(options);   // listening when this returns
//   ... server->port() ...
//   server->Shutdown();                      // or from a signal-handling
//   thread
class Server {
 public:
  // Validates `options`, creates the device and starts listening.
  // INVALID_ARGUMENT for a bad option (message names the flag), UNAVAILABLE
  // when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const Options& options);
  // The same over `device` instead of the one Options::device names: for
  // tests of devices CreateDevice does not build (FakeDevice).
  static absl::StatusOr<std::unique_ptr<Server>> Start(
      const Options& options, std::unique_ptr<Device> device);
  // The same over `devices` (device i at index i; Options::device,
  // devices, threads and the memory sizes are then not used): for tests of
  // a server over several devices CreateDevices does not build
  // (FakeDevices). An empty list means the devices the options name, as
  // Start(options); INVALID_ARGUMENT when the list holds a null.
  static absl::StatusOr<std::unique_ptr<Server>> Start(
      const Options& options, std::vector<std::unique_ptr<Device>> devices);

  ~Server();  // Shuts down if still running.
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Sessions and accounting, for tests and operations.
  SessionManager& sessions() { return *sessions_; }

  // The port actually bound (the chosen one when Options::listen asked for 0).
  int port() const { return port_; }
  // The data path's port; 0 when it is off.
  int data_port() const {
    return data_listener_ == nullptr ? 0 : data_listener_->port();
  }
  // Host and bound port, ready for a client to dial.
  const std::string& address() const { return address_; }
  // HOST:PORT /metrics is served on (the bound port); empty without
  // Options::metrics_listen.
  const std::string& metrics_address() const { return metrics_address_; }
  // The metrics the server counts; null with Options::metrics off.
  Metrics* metrics() { return metrics_.get(); }
  // HOST:PORT of the plaintext health port (the bound port); empty without
  // Options::health_listen.
  const std::string& health_address() const { return health_address_; }

  // Re-reads Options::auth_token_file (SIGHUP): calls made afterwards are
  // checked against the new tokens, and the open streaming calls (Pipeline,
  // ExecuteStream, Attach, transfers and their data-path tickets) made with
  // a token the file no longer maps to the same tenant are cancelled. On
  // error the old tokens stay in force.
  absl::Status ReloadTokens();

  // Draining, the step before Shutdown() that lets a load balancer move
  // clients elsewhere without cutting off those the server still serves:
  // health turns NOT_SERVING ("" and every service, Watch streams stay
  // open), CreateSession is refused with UNAVAILABLE "server draining", and
  // open sessions are served as before. GetServerStats reports it.
  // Idempotent and thread-safe; it cannot be undone.
  void BeginDrain();
  bool draining() const;

  // How Drain() ended.
  enum class DrainEnd {
    kSessionsClosed,  // No session was left open.
    kTimeUp,          // Options::drain passed with sessions still open.
    kEnded,           // EndDrain() (a second SIGTERM) or Shutdown().
  };
  // BeginDrain(), then waits until every session has closed, Options::drain
  // has passed, or EndDrain() or Shutdown() is called from another thread.
  // The caller shuts down next; sessions still open are ended by that.
  DrainEnd Drain();
  // Makes a Drain() in progress (or the next one) return at once.
  void EndDrain();

  // Stops accepting calls, reports NOT_SERVING, lets in-flight calls finish
  // for up to Options::shutdown_grace and cancels the rest. Idempotent and
  // thread-safe; returns when the server has stopped.
  void Shutdown();

 private:
  Server() = default;
  // What /metrics reports beyond its counters, read now.
  MetricsSnapshot MetricsSnapshotNow() const;

  Options options_;
  // First in, last out: sessions and services count into it until they go.
  std::unique_ptr<Metrics> metrics_;
  std::string metrics_address_;
  // Index i is device i (CreateSessionRequest.device); never empty.
  std::vector<std::unique_ptr<Device>> devices_;
  // Declared before the sessions: a session's streams may still hand work
  // to it while they are torn down.
  std::unique_ptr<WorkPool> workers_;
  std::unique_ptr<SessionManager> sessions_;
  // Outlives the runtime service, which forgets its tickets.
  std::unique_ptr<DataListener> data_listener_;
  std::unique_ptr<RuntimeService> runtime_service_;
  std::unique_ptr<OperatorService> operator_service_;
  std::unique_ptr<HealthService> health_service_;
  // Options::health_listen's server and its own health service, which
  // mirrors health_service_ (Drain, Shutdown).
  absl::Status StartHealthPort(const Options& options);
  std::unique_ptr<HealthService> health_port_service_;
  std::unique_ptr<grpc::Server> health_server_;
  std::string health_address_;
  std::shared_ptr<Authenticator> authenticator_;  // Null without tokens.
  std::unique_ptr<CallLog> call_log_;  // Outlives grpc_server_'s calls.
  std::unique_ptr<grpc::Server> grpc_server_;
  int port_ = 0;
  std::string address_;
  mutable absl::Mutex drain_mu_;
  bool draining_ ABSL_GUARDED_BY(drain_mu_) = false;
  bool drain_ended_ ABSL_GUARDED_BY(drain_mu_) = false;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_SERVER_H_
