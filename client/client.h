#ifndef OPSERVER_CLIENT_CLIENT_H_
#define OPSERVER_CLIENT_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/opserver.grpc.pb.h"

namespace opserver {

// How a Client reaches its server.
struct ConnectOptions {
  // Deadline for establishing the connection in Connect().
  absl::Duration connect_timeout = absl::Seconds(5);
  // Deadline applied to each RPC.
  absl::Duration call_timeout = absl::Seconds(30);
};

// The C++ thin client of an opserver. Thread-safe.
//
//   auto client = Client::Connect("127.0.0.1:50051");
//   if (!client.ok()) ...;
//   auto info = (*client)->GetDeviceInfo();
class Client {
 public:
  // Dials `address` (HOST:PORT) and waits until the channel is ready.
  // UNAVAILABLE (naming the address) when no server answers in time.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& address, const ConnectOptions& options = {});

  const std::string& address() const { return address_; }

  absl::StatusOr<v1::GetDeviceInfoResponse> GetDeviceInfo();

  // grpc.health.v1 Check for `service` ("" = the whole server); returns e.g.
  // "SERVING".
  absl::StatusOr<std::string> CheckHealth(const std::string& service = "");

 private:
  Client(std::string address, std::shared_ptr<grpc::Channel> channel,
         const ConnectOptions& options);
  void SetDeadline(grpc::ClientContext* context) const;

  const std::string address_;
  const ConnectOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Runtime::Stub> runtime_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace opserver

#endif  // OPSERVER_CLIENT_CLIENT_H_
