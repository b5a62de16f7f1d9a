#include "server/server.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/listen_address.h"
#include "common/malloc_tuning.h"
#include "common/status_macros.h"
#include "common/thread_start.h"
#include "devices/device_factory.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "runtime/log.h"

namespace opserver {
namespace {

// Every "/package.Service/Method" path the server serves: the log of
// refused calls names these and counts any other path as unknown.
std::vector<std::string> ServedMethods() {
  // Reflection clients try v1 and v1alpha (gRPC 1.51 serves v1alpha only).
  std::vector<std::string> methods = {
      "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"};
  for (const std::string service :
       {v1::Runtime::service_full_name(), v1::Operators::service_full_name(),
        "grpc.health.v1.Health"}) {
    const google::protobuf::ServiceDescriptor* descriptor =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            service);
    if (descriptor == nullptr) continue;  // Not linked into this build.
    for (int i = 0; i < descriptor->method_count(); ++i) {
      methods.push_back(
          absl::StrCat("/", service, "/", descriptor->method(i)->name()));
    }
  }
  return methods;
}

// Options::data_advertise checked, in its canonical spelling ("[::1]:80",
// no leading zeros); empty when not set. Clients check it again
// (ParseConnectAddress) as the peer's word it is to them.
absl::StatusOr<std::string> CheckDataAdvertise(const Options& options) {
  if (options.data_advertise.empty()) return std::string();
  absl::StatusOr<ListenAddress> parsed =
      ParseConnectAddress(options.data_advertise);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data_advertise: ", parsed.status().message()));
  }
  if (!options.tls_cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--data_advertise: the data path is off with TLS (transfers stay on "
        "the encrypted channel): drop --data_advertise");
  }
  if (options.data_port < 0) {
    return absl::InvalidArgumentError(
        "--data_advertise: the data path is off (--data_port=-1): drop "
        "--data_advertise or turn the data path on");
  }
  return parsed->ToString();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const Options& options) {
  return Start(options, std::vector<std::unique_ptr<Device>>());
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(
    const Options& options, std::unique_ptr<Device> device) {
  if (device == nullptr) {
    return absl::InvalidArgumentError("Server::Start: the device is null");
  }
  std::vector<std::unique_ptr<Device>> devices;
  devices.push_back(std::move(device));
  return Start(options, std::move(devices));
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(
    const Options& options, std::vector<std::unique_ptr<Device>> given) {
  // Empty from Start(options): the devices the options name.
  const bool given_devices = !given.empty();
  for (const std::unique_ptr<Device>& device : given) {
    if (device == nullptr) {
      return absl::InvalidArgumentError("Server::Start: a device is null");
    }
  }
  absl::StatusOr<ListenAddress> listen = ParseListenAddress(options.listen);
  if (!listen.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen: ", listen.status().message()));
  }
  TransferLimits transfer = options.transfer_limits;
  // Written so that no sum can wrap.
  if (transfer.chunk_bytes == 0 || transfer.max_message_bytes < 1024 ||
      transfer.chunk_bytes > transfer.max_message_bytes - 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--chunk_bytes: must be > 0 and leave room for the message header "
        "below --max_message_bytes (",
        transfer.max_message_bytes, ")"));
  }
  if (transfer.staging_chunk_bytes == 0 ||
      transfer.staging_chunk_bytes > kMaxStagingChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--staging_chunk_bytes: must be from 1 to ",
                     kMaxStagingChunkBytes, " (1 GiB)"));
  }
  if (transfer.idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--transfer_idle_timeout_s must be positive");
  }
  if (transfer.max_message_bytes > (1ull << 31) - 1) {
    return absl::InvalidArgumentError(
        "--max_message_bytes: gRPC messages are limited to 2 GiB - 1");
  }
  // A WriteValues/ReadValues/Evaluate tensor of max_values doubles (8 bytes
  // each, packed) must fit in one message: the limit in force (and reported
  // by GetDeviceInfo) is the smaller one.
  transfer.max_values = static_cast<uint32_t>(std::min<uint64_t>(
      transfer.max_values, (transfer.max_message_bytes - 1024) / 8));
  if (options.session_limits.max_launch_elements == 0 ||
      options.session_limits.max_queued_per_stream == 0 ||
      options.session_limits.max_pending_replies == 0) {
    return absl::InvalidArgumentError(
        "--max_launch_elements, --max_queued_per_stream and "
        "--max_pending_replies must be positive");
  }
  if (options.session_limits.max_sessions == 0 ||
      options.session_limits.max_handles_per_session == 0 ||
      options.session_limits.idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--max_sessions, --max_handles_per_session and --idle_timeout_s must "
        "be positive");
  }
  if (options.session_limits.callback_block_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--callback_block_timeout_ms must be positive");
  }
  // Security before anything is allocated: a server that would expose the
  // device to the network unprotected must not start at all.
  const bool tls = !options.tls_cert_file.empty();
  if (tls != !options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert_file and --tls_key_file: give both or neither");
  }
  if (!tls && !options.tls_client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca_file: client certificates need TLS: give "
        "--tls_cert_file and --tls_key_file too");
  }
  // gRPC takes the window as an int (and clamps it to HTTP/2's 2^31 - 1).
  if (options.receive_window_bytes >
      uint64_t{std::numeric_limits<int>::max()}) {
    return absl::InvalidArgumentError(
        "--receive_window_bytes: at most 2 GiB - 1 (0 = BDP probing)");
  }
  if (options.data_port < -1 || options.data_port > 65535) {
    return absl::InvalidArgumentError(
        "--data_port: 0 (any free port), 1-65535, or -1 (off)");
  }
  ASSIGN_OR_RETURN(std::string data_advertise, CheckDataAdvertise(options));
  if (options.drain < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_s: must not be negative");
  }
  if (options.tls_refresh_interval_s <= 0) {
    return absl::InvalidArgumentError(
        "--tls_refresh_interval_s: must be positive");
  }
  const bool authenticated =
      !options.auth_token_file.empty() || !options.tls_client_ca_file.empty();
  if (!IsLoopback(*listen) && !(tls && authenticated)) {
    if (!options.allow_insecure) {
      return absl::InvalidArgumentError(
          absl::StrCat("--listen: ", listen->host,
                       " is reachable from other machines: serve it with TLS "
                       "(--tls_cert_file, --tls_key_file) and authentication "
                       "(--auth_token_file or --tls_client_ca_file), or pass "
                       "--allow_insecure to expose it anyway"));
    }
    LogLine(absl::StrCat("warning: --allow_insecure: serving ", listen->host,
                         ", reachable from other machines, without ",
                         !tls && !authenticated
                             ? "TLS or authentication"
                             : (tls ? "authentication" : "TLS")));
  }
  std::optional<ListenAddress> metrics_listen;
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<ListenAddress> parsed =
        ParseListenAddress(options.metrics_listen);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_listen: ", parsed.status().message()));
    }
    // The page names tenants and shows their activity, and is plain HTTP.
    if (!IsLoopback(*parsed) && !options.allow_insecure) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metrics_listen: ", parsed->host,
          " is reachable from other machines, and the page names tenants: "
          "serve it on loopback (and scrape through a proxy), or pass "
          "--allow_insecure"));
    }
    if (!options.metrics) {
      return absl::InvalidArgumentError(
          "--metrics_listen: metrics are turned off (Options::metrics)");
    }
    metrics_listen = *parsed;
  }
  std::shared_ptr<Authenticator> authenticator;
  if (!options.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(TokenTable tokens,
                     TokenTable::Load(options.auth_token_file));
    if (!tokens.warning().empty()) LogLine(tokens.warning());
    authenticator = std::make_shared<Authenticator>(
        std::move(tokens), options.reflection_without_auth, ServedMethods());
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::ServerCredentials> credentials,
      MakeServerCredentials(
          TlsFiles{options.tls_cert_file, options.tls_key_file,
                   options.tls_client_ca_file,
                   static_cast<unsigned int>(options.tls_refresh_interval_s)},
          authenticator));

  absl::StatusOr<std::vector<std::unique_ptr<Device>>> devices =
      std::move(given);
  if (!given_devices) devices = CreateDevices(DeviceOptionsFor(options));
  if (!devices.ok()) {
    const char* flag = options.threads < 0       ? "--threads: "
                       : options.device != "cpu" ? "--device: "
                                                 : "--devices: ";
    return absl::InvalidArgumentError(
        absl::StrCat(flag, devices.status().message()));
  }
  // Fail with the OS's reason before gRPC prints its own multi-line error.
  if (absl::Status probe = ProbeBind(*listen); !probe.ok()) {
    return absl::Status(probe.code(),
                        absl::StrCat("--listen: ", probe.message()));
  }

  TuneMallocForStreaming();
  if (!options.detect_mutex_deadlocks) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  std::unique_ptr<Server> server(new Server());
  server->options_ = options;
  if (options.metrics) server->metrics_ = std::make_unique<Metrics>();
  server->authenticator_ = std::move(authenticator);
  server->call_log_ = std::make_unique<CallLog>(server->authenticator_.get());
  // gRPC core logs each failed handshake: as many lines as peers like.
  CallLog::RouteGrpcCoreLog();
  server->devices_ = *std::move(devices);
  std::vector<Device*> device_list;
  for (const std::unique_ptr<Device>& device : server->devices_) {
    device_list.push_back(device.get());
    // A fallback the operator should know of (an Ascend device whose CANN
    // cannot capture graphs).
    if (std::string notice = device->StartNotice(); !notice.empty()) {
      LogLine(notice);
    }
  }
  try {
    WorkPool::Options work;
    work.threads =
        options.work_threads > 0
            ? options.work_threads
            : std::max(2,
                       static_cast<int>(std::thread::hardware_concurrency()));
    // Behind the RPC threads: a client's heavy requests must not delay
    // other clients' small calls (WorkPool::Options::nice).
    work.nice = 10;
    server->workers_ = std::make_unique<WorkPool>(work);
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("--work_threads: cannot start the threads: ", e.what()));
  }
  try {
    server->sessions_ = std::make_unique<SessionManager>(
        device_list, options.session_limits, server->metrics_.get());
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the session reaper thread: ", e.what()));
  }
  if (!tls && options.data_port >= 0) {
    DataListener::Options data;
    data.host = listen->host;
    data.port = options.data_port;
    data.advertise = data_advertise;
    data.drop_accepted = options.data_drop_accepted;
    data.drop_kept = options.data_drop_kept;
    absl::StatusOr<std::unique_ptr<DataListener>> listener =
        DataListener::Start(data);
    if (!listener.ok()) {
      return absl::Status(
          listener.status().code(),
          absl::StrCat("--data_port: ", listener.status().message()));
    }
    server->data_listener_ = *std::move(listener);
  }
  try {
    server->runtime_service_ = std::make_unique<RuntimeService>(
        server->sessions_.get(), transfer, server->authenticator_.get(),
        server->data_listener_.get(), server->workers_.get());
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the transfer watchdog thread: ", e.what()));
  }
  // ListOperators describes device 0; Evaluate runs on the device its
  // request names.
  server->operator_service_ = std::make_unique<OperatorService>(
      server->devices_[0].get(), server->sessions_.get(), transfer,
      server->workers_.get(), server->authenticator_.get(),
      server->data_listener_ != nullptr ? server->runtime_service_.get()
                                        : nullptr);
  server->health_service_ = std::make_unique<HealthService>(
      std::set<std::string>{v1::Runtime::service_full_name(),
                            v1::Operators::service_full_name()},
      options.max_health_watches);

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Without this, a second server could bind the same port through
  // SO_REUSEPORT and silently take half the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A peer that vanished without closing its connection (host down, cable
  // out) is noticed within about a minute, so the sessions bound to its
  // Attach call are freed then, not after TCP's two hours.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  if (options.receive_window_bytes > 0) {
    // A fixed window instead of BDP probing, which would grow it to whatever
    // a fast sender keeps in flight (tens of MiB per upload on loopback).
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                               static_cast<int>(options.receive_window_bytes));
  }
  builder.AddListeningPort(listen->ToString(), credentials, &server->port_);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(transfer.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(transfer.max_message_bytes));
  builder.RegisterService(server->runtime_service_.get());
  builder.RegisterService(server->operator_service_.get());
  builder.RegisterService(server->health_service_.get());
  {
    std::vector<
        std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    if (server->metrics_ != nullptr) {
      interceptors = server->metrics_->Interceptors();
    }
    interceptors.push_back(server->call_log_->MakeInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  server->grpc_server_ = builder.BuildAndStart();
  if (server->grpc_server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot listen on ", listen->ToString()));
  }
  ListenAddress bound = *listen;
  bound.port = server->port_;
  server->address_ = bound.ToString();
  RETURN_IF_ERROR(server->StartHealthPort(options));
  if (metrics_listen.has_value()) {
    Server* s = server.get();
    s->metrics_->SetSnapshot([s] { return s->MetricsSnapshotNow(); });
    absl::StatusOr<int> port =
        s->metrics_->Serve(metrics_listen->ToString(), options.metrics_serve);
    if (!port.ok()) {
      return absl::Status(
          port.status().code(),
          absl::StrCat("--metrics_listen: ", port.status().message()));
    }
    metrics_listen->port = *port;
    s->metrics_address_ = metrics_listen->ToString();
  }
  return server;
}

MetricsSnapshot Server::MetricsSnapshotNow() const {
  MetricsSnapshot s;
  for (uint32_t i = 0; i < devices_.size(); ++i) {
    MetricsSnapshot::Device d;
    d.device = absl::StrCat(i);
    d.memory_capacity_bytes = devices_[i]->Describe().memory_bytes;
    d.memory_used_bytes = sessions_->device_accounting(i).bytes.load();
    d.memory_cached_bytes = devices_[i]->CachedBytes();
    d.memory_free_bytes = devices_[i]->FreeBytes();
    s.devices.push_back(std::move(d));
  }
  for (const SessionManager::OwnerStats& owner : sessions_->StatsByOwner()) {
    s.tenants.push_back(MetricsSnapshot::Tenant{
        owner.owner, absl::StrCat(owner.device), owner.sessions, owner.streams,
        owner.executors, owner.buffers, owner.buffer_bytes, owner.events,
        owner.pending_event_operations, owner.attach_streams,
        owner.pending_synchronizes, owner.graphs, owner.graph_tasks});
    s.devices[owner.device].queued_launches += owner.queued_launches;
  }
  const RuntimeService::TransferTotals totals = runtime_service_->Totals();
  s.data_path_transfers = totals.data_path_transfers;
  s.data_path_bytes = totals.data_path_bytes;
  s.grpc_transfers = totals.grpc_transfers;
  s.grpc_transfer_bytes = totals.grpc_bytes;
  if (data_listener_ != nullptr) {
    s.data_port_refused = data_listener_->refused();
    s.data_port_accepted = data_listener_->accepted();
    s.data_port_reused = data_listener_->reused();
  }
  return s;
}

absl::Status Server::ReloadTokens() {
  if (authenticator_ == nullptr) {
    return absl::FailedPreconditionError(
        "--auth_token_file was not given: no tokens to reload");
  }
  ASSIGN_OR_RETURN(TokenTable tokens,
                   TokenTable::Load(options_.auth_token_file));
  if (!tokens.warning().empty()) LogLine(tokens.warning());
  const size_t count = tokens.size();
  const size_t ended = authenticator_->SetTokens(std::move(tokens));
  LogLine(absl::StrCat("reloaded ", count, " tokens from ",
                       options_.auth_token_file, "; ended ", ended,
                       " open calls made with tokens no longer in it"));
  return absl::OkStatus();
}

DeviceOptions DeviceOptionsFor(const Options& options) {
  DeviceOptions device_options;
  device_options.kind = options.device;
  device_options.threads = options.threads;
  device_options.memory_cache_bytes = options.memory_cache_bytes;
  device_options.memory_bytes = options.device_memory_bytes;
  device_options.cann_libraries = options.cann_libraries;
  device_options.devices = options.devices;
  device_options.staging_bytes = options.max_staging_bytes;
  device_options.staging_chunk_bytes =
      std::max(options.transfer_limits.chunk_bytes,
               options.transfer_limits.staging_chunk_bytes);
  return device_options;
}

absl::Status Server::StartHealthPort(const Options& options) {
  if (options.health_listen.empty()) return absl::OkStatus();
  absl::StatusOr<ListenAddress> listen =
      ParseListenAddress(options.health_listen);
  if (!listen.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--health_listen: ", listen.status().message()));
  }
  health_port_service_ = std::make_unique<HealthService>(
      std::set<std::string>{v1::Runtime::service_full_name(),
                            v1::Operators::service_full_name()},
      options.max_health_watches);
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(listen->ToString(),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(health_port_service_.get());
  health_server_ = builder.BuildAndStart();
  if (health_server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("--health_listen: cannot listen on ", listen->ToString()));
  }
  listen->port = port;
  health_address_ = listen->ToString();
  return absl::OkStatus();
}

Server::~Server() {
  // No scrape reads the sessions or services once they start going.
  if (metrics_ != nullptr) metrics_->SetSnapshot(nullptr);
  Shutdown();
  // Services are gone from gRPC now; end the sessions (their streams finish
  // queued work) before the device they allocate from.
  sessions_.reset();
}

void Server::BeginDrain() {
  // Under the lock, so that draining() says true only once CreateSession
  // refuses and health says NOT_SERVING (a caller that saw it and then
  // created a session could get one otherwise). Neither call takes it.
  absl::MutexLock lock(&drain_mu_);
  if (draining_ || grpc_server_ == nullptr) return;
  runtime_service_->BeginDrain();
  health_service_->Drain();
  if (health_port_service_ != nullptr) health_port_service_->Drain();
  draining_ = true;
}

bool Server::draining() const {
  absl::MutexLock lock(&drain_mu_);
  return draining_;
}

Server::DrainEnd Server::Drain() {
  BeginDrain();
  const absl::Time deadline = absl::Now() + options_.drain;
  // Sessions end on many paths (CloseSession, an Attach stream's end, the
  // idle timeout): their count is polled rather than signalled.
  constexpr absl::Duration kPoll = absl::Milliseconds(50);
  absl::MutexLock lock(&drain_mu_);
  for (;;) {
    if (drain_ended_) return DrainEnd::kEnded;
    if (sessions_->session_count() == 0) return DrainEnd::kSessionsClosed;
    const absl::Time now = absl::Now();
    if (now >= deadline) return DrainEnd::kTimeUp;
    drain_mu_.AwaitWithDeadline(absl::Condition(&drain_ended_),
                                std::min(deadline, now + kPoll));
  }
}

void Server::EndDrain() {
  absl::MutexLock lock(&drain_mu_);
  drain_ended_ = true;
}

void Server::Shutdown() {
  EndDrain();
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_ || grpc_server_ == nullptr) return;
  shut_down_ = true;
  health_service_->Shutdown();
  if (health_server_ != nullptr) {
    health_port_service_->Shutdown();  // Its Watch streams end now.
    health_server_->Shutdown();
    health_server_->Wait();
  }
  runtime_service_->Shutdown();
  const absl::Time deadline = absl::Now() + options_.shutdown_grace;
  // gRPC cancels the calls still running at the deadline but then waits
  // for each to finish, and a synchronize (or a pipelined fence) finishes
  // only when its stream's queue has run: seconds or minutes of queued
  // work. So at the deadline the queued work is dropped too, and those
  // calls end with CANCELLED at once.
  absl::Notification stopped;
  absl::StatusOr<std::thread> canceller =
      StartThread("the shutdown canceller thread", [this, deadline, &stopped] {
        if (!stopped.WaitForNotificationWithDeadline(deadline)) {
          sessions_->CancelAllWork();
        }
      });
  if (!canceller.ok()) {
    // No thread to wait for the deadline (a client holds every thread the
    // process may have): the queued work is dropped now, so the calls
    // waiting on it end at once and shutdown completes without the grace.
    LogLine(absl::StrCat(canceller.status().message(),
                         "; cancelling queued work now, without the grace"));
    sessions_->CancelAllWork();
  }
  grpc_server_->Shutdown(absl::ToChronoTime(deadline));
  grpc_server_->Wait();
  stopped.Notify();
  if (canceller.ok()) canceller->join();
  if (authenticator_ != nullptr) authenticator_->FlushRejections();
  call_log_->Flush();
  CallLog::FlushGrpcCoreLog();
}

}  // namespace opserver
