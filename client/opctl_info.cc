#include "client/opctl_info.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/dtype.h"

namespace opserver::remote::opctl {
namespace {

using kernels::DType;

std::string DTypeNames(const google::protobuf::RepeatedField<int>& dtypes) {
  std::vector<std::string> names;
  for (int d : dtypes) {
    names.emplace_back(kernels::DTypeName(static_cast<DType>(d)));
  }
  return absl::StrJoin(names, ",");
}

}  // namespace

int Info(Client& client) {
  auto info = client.GetDeviceInfo();
  if (!info.ok()) return Fail(info.status().message());
  auto devices = client.ListDevices();
  if (!devices.ok()) return Fail(devices.status().message());
  auto health = client.CheckHealth();
  if (!health.ok()) return Fail(health.status().message());
  std::printf("server:   %s\n", client.address().c_str());
  // One line per device, the index first: what --device and
  // CreateSession name.
  for (const v1::DeviceInfo& d : *devices) {
    std::printf("device %u: %s (%s), %llu bytes, %u threads\n", d.index(),
                d.kind().c_str(), d.name().c_str(),
                static_cast<unsigned long long>(d.memory_bytes()), d.threads());
  }
  std::printf("version:  opserver %s, %s, gRPC %s\n",
              info->server_version().c_str(), info->api_version().c_str(),
              info->grpc_version().c_str());
  std::printf("health:   %s\n", health->c_str());
  // A draining server (--drain_s, after SIGTERM) is NOT_SERVING but still
  // serves its open sessions: say so, so NOT_SERVING does not read as down.
  grpc::ClientContext context;
  client.SetDeadline(&context);
  v1::ServerStats stats;
  if (client.runtime()
          .GetServerStats(&context, v1::GetServerStatsRequest(), &stats)
          .ok() &&
      stats.draining()) {
    std::printf("draining: yes (no new sessions; %llu open)\n",
                static_cast<unsigned long long>(stats.sessions()));
  }
  return 0;
}

int Stats(Client& client) {
  grpc::ClientContext context;
  client.SetDeadline(&context);
  v1::ServerStats stats;
  absl::Status status =
      client.CallStatus(client.runtime().GetServerStats(
                            &context, v1::GetServerStatsRequest(), &stats),
                        context, "GetServerStats");
  if (!status.ok()) return Fail(status.message());
  std::printf("sessions:     %llu\n",
              static_cast<unsigned long long>(stats.sessions()));
  std::printf("buffers:      %llu\n",
              static_cast<unsigned long long>(stats.buffers()));
  std::printf("buffer_bytes: %llu\n",
              static_cast<unsigned long long>(stats.buffer_bytes()));
  std::printf("data_port:    %u\n", stats.data_port());
  // Only when the server advertises one (--data_advertise); escaped, as
  // any text from the wire on its way to a terminal.
  if (!stats.data_address().empty()) {
    std::printf("data_address: %s\n",
                absl::CHexEscape(stats.data_address()).c_str());
  }
  std::printf("data path:    %llu transfers, %llu bytes\n",
              static_cast<unsigned long long>(stats.data_path_transfers()),
              static_cast<unsigned long long>(stats.data_path_bytes()));
  std::printf("gRPC:         %llu transfers, %llu bytes\n",
              static_cast<unsigned long long>(stats.grpc_transfers()),
              static_cast<unsigned long long>(stats.grpc_transfer_bytes()));
  std::printf("draining:     %s\n", stats.draining() ? "yes" : "no");
  // Per device (absent from servers that predate several devices).
  for (const v1::DeviceStats& d : stats.devices()) {
    std::printf(
        "device %u:     %llu sessions, %llu buffers, %llu buffer bytes, "
        "%llu of %llu bytes free\n",
        d.device(), static_cast<unsigned long long>(d.sessions()),
        static_cast<unsigned long long>(d.buffers()),
        static_cast<unsigned long long>(d.buffer_bytes()),
        static_cast<unsigned long long>(d.free_bytes()),
        static_cast<unsigned long long>(d.capacity_bytes()));
  }
  return 0;
}

int Ops(Client& client) {
  auto ops = client.ListOperators();
  if (!ops.ok()) return Fail(ops.status().message());
  for (const v1::OperatorInfo& op : ops->operators()) {
    std::printf("%s (%s)\n", op.name().c_str(), op.aclnn_name().c_str());
    if (!op.semantics().empty()) {
      std::printf("  %s\n", op.semantics().c_str());
    }
    for (const v1::TensorArgInfo& t : op.tensors()) {
      std::printf("  tensor %-11s %-6s %s\n", t.name().c_str(),
                  t.role().c_str(), DTypeNames(t.dtypes()).c_str());
    }
    for (const v1::ParamInfo& p : op.params()) {
      std::string details = p.description();
      if (p.has_default_value()) {
        const std::string value =
            p.type() == "bool" ? (p.default_value() != 0 ? "true" : "false")
                               : absl::StrCat(p.default_value());
        details = absl::StrCat("default ", value, details.empty() ? "" : "; ",
                               details);
      }
      std::printf("  param  %-11s %-6s %s\n", p.aclnn_name().c_str(),
                  p.type().c_str(), details.c_str());
    }
  }
  return 0;
}

// info of a pool: its ordinals as etcd registers them, each with its
// server and the server's own device index.
int PoolInfo(const PoolResolution& pool, const std::string& server) {
  std::printf("pool:     %s, %zu device%s%s\n", server.c_str(),
              pool.devices.size(), pool.devices.size() == 1 ? "" : "s",
              pool.claim != nullptr ? " (claimed)" : "");
  for (size_t i = 0; i < pool.devices.size(); ++i) {
    const PoolDevice& d = pool.devices[i];
    std::printf("device %zu: %s device %u: %s (%s), %llu bytes, %llu free%s\n",
                i, d.address.c_str(), d.device, d.info.kind().c_str(),
                d.info.soc_name().c_str(),
                static_cast<unsigned long long>(d.info.capacity_bytes()),
                static_cast<unsigned long long>(d.info.free_bytes()),
                d.info.draining() ? ", draining" : "");
  }
  return 0;
}

// stats of every server of a pool, in ordinal order, each under its address.
int PoolStats(const PoolResolution& pool, const Connector& connect) {
  std::vector<std::string> shown;
  for (uint32_t i = 0; i < pool.devices.size(); ++i) {
    const std::string& address = pool.devices[i].address;
    if (std::find(shown.begin(), shown.end(), address) != shown.end()) {
      continue;
    }
    shown.push_back(address);
    auto connected = connect(true, i);
    if (!connected.ok()) return Fail(connected.status().message());
    std::printf("server:       %s\n", address.c_str());
    if (int failed = Stats(*connected->client); failed != 0) return failed;
  }
  return 0;
}

}  // namespace opserver::remote::opctl
