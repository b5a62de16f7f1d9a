#ifndef OPSERVER_SERVER_RUNTIME_SERVICE_H_
#define OPSERVER_SERVER_RUNTIME_SERVICE_H_

#include "proto/opserver.grpc.pb.h"
#include "server/device.h"

namespace opserver {

// opserver.v1.Runtime over one Device. The device must outlive the service.
class RuntimeService final : public v1::Runtime::CallbackService {
 public:
  explicit RuntimeService(Device* device);

  grpc::ServerUnaryReactor* GetDeviceInfo(
      grpc::CallbackServerContext* context,
      const v1::GetDeviceInfoRequest* request,
      v1::GetDeviceInfoResponse* response) override;

 private:
  Device* const device_;
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_RUNTIME_SERVICE_H_
