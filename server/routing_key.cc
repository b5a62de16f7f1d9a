#include "server/routing_key.h"

#include "common/session_routing.h"

namespace opserver {

std::optional<std::string> SessionRoutingKeyOf(
    const grpc::ServerContextBase* context) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kSessionRoutingHeader);
  if (it == metadata.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

}  // namespace opserver
