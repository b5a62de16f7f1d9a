#include "server/runtime_service.h"

#include "absl/status/status.h"
#include "server/grpc_status_util.h"
#include "server/version.h"

namespace opserver {

RuntimeService::RuntimeService(Device* device) : device_(device) {}

grpc::ServerUnaryReactor* RuntimeService::GetDeviceInfo(
    grpc::CallbackServerContext* context,
    const v1::GetDeviceInfoRequest* /*request*/,
    v1::GetDeviceInfoResponse* response) {
  DeviceDescription description = device_->Describe();
  response->set_kind(description.kind);
  response->set_name(description.name);
  response->set_memory_bytes(description.memory_bytes);
  response->set_threads(description.threads);
  response->set_server_version(kServerVersion);
  response->set_grpc_version(grpc::Version());
  response->set_api_version(kApiVersion);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(absl::OkStatus()));
  return reactor;
}

}  // namespace opserver
