// JoinPool: the C API's devices from an etcd:// OPSERVER_ADDRESS.
#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "client/aclnn_state.h"
#include "client/etcd_pool.h"
#include "common/status_macros.h"

namespace opserver {

absl::Status JoinPool(State& state) {
  ASSIGN_OR_RETURN(ClaimOptions claim, ClaimOptionsFromEnv());
  ASSIGN_OR_RETURN(PoolResolution pool,
                   ResolvePool(state.address, claim, EtcdCredentialsFromEnv()));
  for (const PoolDevice& device : pool.devices) {
    auto server = std::find_if(
        state.servers.begin(), state.servers.end(),
        [&](const ServerSlot& slot) { return slot.address == device.address; });
    if (server == state.servers.end()) {
      server =
          state.servers.insert(state.servers.end(), ServerSlot{device.address});
      server->devices = 0;
    }
    ++*server->devices;
    DeviceSlot slot;
    slot.server = server - state.servers.begin();
    slot.local = device.device;
    state.devices.push_back(std::move(slot));
  }
  state.claim = std::move(pool.claim);
  return absl::OkStatus();
}

}  // namespace opserver
