// opctl's commands that print what a server (or a pool) says about
// itself: info, stats and ops.
#ifndef OPSERVER_CLIENT_OPCTL_INFO_H_
#define OPSERVER_CLIENT_OPCTL_INFO_H_

#include <string>

#include "client/client.h"
#include "client/etcd_pool.h"
#include "client/opctl_command.h"

namespace opserver::remote::opctl {

// opctl info: the server's devices, version, health and whether it drains.
int Info(Client& client);

// opctl stats: sessions, buffers, transfers and each device's memory.
int Stats(Client& client);

// opctl ops: each operator with its tensors, dtypes and parameters.
int Ops(Client& client);

// info of a pool: its ordinals as etcd registers them, each with its
// server and the server's own device index.
int PoolInfo(const PoolResolution& pool, const std::string& server);

// stats of every server of a pool, in ordinal order, each under its address.
int PoolStats(const PoolResolution& pool, const Connector& connect);

}  // namespace opserver::remote::opctl

#endif  // OPSERVER_CLIENT_OPCTL_INFO_H_
