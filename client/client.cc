#include "client/client.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"

namespace opserver {
namespace {

// The client-side mirror of the server's ToGrpcStatus.
absl::Status FromGrpcStatus(const grpc::Status& status,
                            absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const std::string& address, const ConnectOptions& options) {
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(
          absl::ToChronoTime(absl::Now() + options.connect_timeout))) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach opserver at ", address, " within ",
                     absl::FormatDuration(options.connect_timeout)));
  }
  return std::unique_ptr<Client>(
      new Client(address, std::move(channel), options));
}

Client::Client(std::string address, std::shared_ptr<grpc::Channel> channel,
               const ConnectOptions& options)
    : address_(std::move(address)),
      options_(options),
      channel_(std::move(channel)),
      runtime_(v1::Runtime::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)) {}

void Client::SetDeadline(grpc::ClientContext* context) const {
  context->set_deadline(
      absl::ToChronoTime(absl::Now() + options_.call_timeout));
}

absl::StatusOr<v1::GetDeviceInfoResponse> Client::GetDeviceInfo() {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::GetDeviceInfoResponse response;
  absl::Status status = FromGrpcStatus(
      runtime_->GetDeviceInfo(&context, v1::GetDeviceInfoRequest(), &response),
      "GetDeviceInfo");
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<std::string> Client::CheckHealth(const std::string& service) {
  grpc::ClientContext context;
  SetDeadline(&context);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  absl::Status status = FromGrpcStatus(
      health_->Check(&context, request, &response), "Health.Check");
  if (!status.ok()) return status;
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
      response.status());
}

}  // namespace opserver
