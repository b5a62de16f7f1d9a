#include "server/server.h"

#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "server/device_factory.h"
#include "server/listen_address.h"

namespace opserver {

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const Options& options) {
  absl::StatusOr<ListenAddress> listen = ParseListenAddress(options.listen);
  if (!listen.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen: ", listen.status().message()));
  }
  absl::StatusOr<std::unique_ptr<Device>> device =
      CreateDevice(options.device, options.threads);
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

  std::unique_ptr<Server> server(new Server());
  server->options_ = options;
  server->device_ = *std::move(device);
  server->runtime_service_ =
      std::make_unique<RuntimeService>(server->device_.get());
  server->health_service_ = std::make_unique<HealthService>(
      std::set<std::string>{v1::Runtime::service_full_name()});

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Without this, a second server could bind the same port through
  // SO_REUSEPORT and silently take half the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen->ToString(),
                           grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->runtime_service_.get());
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

Server::~Server() { Shutdown(); }

void Server::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_ || grpc_server_ == nullptr) return;
  shut_down_ = true;
  health_service_->Shutdown();
  grpc_server_->Shutdown(
      absl::ToChronoTime(absl::Now() + options_.shutdown_grace));
  grpc_server_->Wait();
}

}  // namespace opserver
