#include "server/server.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "server/device_factory.h"
#include "server/listen_address.h"
#include "server/malloc_tuning.h"

namespace opserver {

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const Options& options) {
  absl::StatusOr<ListenAddress> listen = ParseListenAddress(options.listen);
  if (!listen.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen: ", listen.status().message()));
  }
  TransferLimits transfer = options.transfer_limits;
  // Written so that no sum can wrap (review finding 17).
  if (transfer.chunk_bytes == 0 || transfer.max_message_bytes < 1024 ||
      transfer.chunk_bytes > transfer.max_message_bytes - 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--chunk_bytes: must be > 0 and leave room for the message header "
        "below --max_message_bytes (",
        transfer.max_message_bytes, ")"));
  }
  if (transfer.max_message_bytes > (1ull << 31) - 1) {
    return absl::InvalidArgumentError(
        "--max_message_bytes: gRPC messages are limited to 2 GiB - 1");
  }
  // A WriteValues/ReadValues/Evaluate tensor of max_values doubles (8 bytes
  // each, packed) must fit in one message: the limit in force (and reported
  // by GetDeviceInfo) is the smaller one (review finding 17).
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
  absl::StatusOr<std::unique_ptr<Device>> device =
      CreateDevice(options.device, options.threads, options.memory_cache_bytes,
                   options.device_memory_bytes);
  if (!device.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.threads < 0 ? "--threads: " : "--device: ",
                     device.status().message()));
  }
  // Fail with the OS's reason before gRPC prints its own multi-line error.
  if (absl::Status probe = ProbeBind(*listen); !probe.ok()) {
    return absl::Status(probe.code(),
                        absl::StrCat("--listen: ", probe.message()));
  }

  TuneMallocForStreaming();
  std::unique_ptr<Server> server(new Server());
  server->options_ = options;
  server->device_ = *std::move(device);
  server->sessions_ = std::make_unique<SessionManager>(server->device_.get(),
                                                       options.session_limits);
  server->runtime_service_ = std::make_unique<RuntimeService>(
      server->device_.get(), server->sessions_.get(), transfer);
  server->operator_service_ = std::make_unique<OperatorService>(
      server->device_.get(), server->sessions_.get(), transfer);
  server->health_service_ = std::make_unique<HealthService>(
      std::set<std::string>{v1::Runtime::service_full_name(),
                            v1::Operators::service_full_name()});

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Without this, a second server could bind the same port through
  // SO_REUSEPORT and silently take half the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A peer that vanished without closing its connection (host down, cable
  // out) is noticed within about a minute, so the sessions bound to its
  // Attach call are freed then, not after TCP's two hours (finding 10).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddListeningPort(listen->ToString(),
                           grpc::InsecureServerCredentials(), &server->port_);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(transfer.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(transfer.max_message_bytes));
  builder.RegisterService(server->runtime_service_.get());
  builder.RegisterService(server->operator_service_.get());
  builder.RegisterService(server->health_service_.get());
  server->grpc_server_ = builder.BuildAndStart();
  if (server->grpc_server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot listen on ", listen->ToString()));
  }
  ListenAddress bound = *listen;
  bound.port = server->port_;
  server->address_ = bound.ToString();
  return server;
}

Server::~Server() {
  Shutdown();
  // Services are gone from gRPC now; end the sessions (their streams finish
  // queued work) before the device they allocate from.
  sessions_.reset();
}

void Server::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_ || grpc_server_ == nullptr) return;
  shut_down_ = true;
  health_service_->Shutdown();
  runtime_service_->Shutdown();
  grpc_server_->Shutdown(
      absl::ToChronoTime(absl::Now() + options_.shutdown_grace));
  grpc_server_->Wait();
}

}  // namespace opserver
