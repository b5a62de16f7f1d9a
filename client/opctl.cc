// opctl: command-line client of an opserver, or of a pool of them in etcd
// (--server=etcd://HOST:PORT/PREFIX: --device counts the pool's devices as
// the C API does, and OPSERVER_CLAIM claims devices while opctl runs).
//
//   opctl [--server=HOST:PORT] [--timeout_ms=N] info
//   opctl [...] ops
//   opctl [...] stats
//   opctl [...] run OP --ARG=v1,v2,... [--ARG_shape=..] [--dtype=..] ...
//   opctl [...] bench [--bytes=N] [--iterations=N] [--elements=N]
//
// Global flags go before the command; each command parses its own.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/etcd_pool.h"
#include "client/host_tensor.h"
#include "client/loopback_tcp.h"
#include "client/op_catalog.h"
#include "common/cli_flags.h"
#include "common/etcd_address.h"
#include "common/listen_address.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051",
          "opserver to talk to, HOST:PORT, or a pool of them in etcd, "
          "etcd://HOST:PORT[,HOST:PORT...]/PREFIX (docs/pool.md).");
ABSL_FLAG(int, timeout_ms, 5000,
          "Deadline for connecting and for each call, in milliseconds.");
ABSL_FLAG(std::string, tls_ca_file, "",
          "Use TLS, trusting the server certificate this PEM CA signed.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM client certificate, for a server that requires one (mTLS).");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token to send (the server's "
          "--auth_token_file names it).");

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace opserver::remote {
namespace {

using kernels::DType;

constexpr char kUsage[] =
    "Command-line client of an opserver.\n"
    "Usage: opctl [--server=HOST:PORT|etcd://HOST:PORT/PREFIX]\n"
    "             [--timeout_ms=N] [--tls_ca_file=PEM\n"
    "             [--tls_cert_file=PEM --tls_key_file=PEM]] [--token_file=F]\n"
    "             COMMAND [ARGS]\n"
    "Commands:\n"
    "  info    devices, server version, health, and whether it drains\n"
    "  ops     operators with their tensor arguments, dtypes and parameters\n"
    "  run     one operator on values from the command line or .npy files\n"
    "          (opctl run --help for the details)\n"
    "  stats   sessions, memory in use and free per device, transfers,\n"
    "          draining\n"
    "  bench   transfer throughput, per-operator latency and the\n"
    "          pipelined vs unary cost of a backward step\n"
    "          (opctl bench --help for the details)\n"
    "With --server=etcd://..., the devices the pool's servers registered\n"
    "there are numbered as the C API numbers them (--device=N of run and\n"
    "bench is that ordinal; info lists them), OPSERVER_CLAIM=N claims N\n"
    "free devices while opctl runs, and stats covers every server.\n"
    "Exit status: 0 done, 1 the command failed (the server's answer, a\n"
    "connection, a command's arguments), 2 opctl's own command line\n"
    "(a flag, COMMAND).";

constexpr char kRunUsage[] =
    "Usage: opctl [--server=..] run OP [--NAME=VALUE ...]\n"
    "Runs one operator the server offers through device memory and the two\n"
    "aclnn phases, and prints the output. OP and its arguments are those\n"
    "'opctl ops' lists (below, when the server answers), each one a flag:\n"
    "  --ARG=1,2,3        values of an input tensor (e.g. --gradOutput)\n"
    "  --ARG=@FILE.npy    an input tensor from a .npy file (dtype and shape\n"
    "                     from the file)\n"
    "  --ARG_shape=2,2    shape of an input given by values (default: 1-D)\n"
    "  --ARG_dtype=NAME   dtype of one tensor, output included (default: the\n"
    "                     argument's only dtype if it has one, else --dtype)\n"
    "  --dtype=NAME       dtype of the tensors (default FLOAT)\n"
    "  --PARAM=X          a parameter (e.g. --threshold=1, --selfIsResult);\n"
    "                     absent: the server's default\n"
    "  --PARAM_dtype=NAME dtype of an aclScalar parameter (default: the\n"
    "                     first the server lists)\n"
    "  --output=FILE.npy  write the output there instead of printing it\n"
    "  --device=N         run on the server's device N (default 0; opctl\n"
    "                     info lists them)\n"
    "The output has the shape the operator's checks accept: the inputs'\n"
    "broadcast shape, else the shape of one input.\n"
    "Example: opctl run ThresholdBackward --threshold=1 \\\n"
    "           --gradOutput=4.5,4.4,4.3,4.2 --self=0.2,1.2,2.2,3.2";

constexpr char kBenchUsage[] =
    "Usage: opctl [--server=..] bench [--bytes=N] [--iterations=N] "
    "[--elements=N] [--device=N]\n"
    "Measures upload and download throughput of --bytes (default 67108864)\n"
    "next to a raw TCP one-way stream over this host's loopback (the\n"
    "path's limit when the server is on loopback too),\n"
    "and the latency of each operator the server offers (GetWorkspaceSize\n"
    "+ Execute + SynchronizeStream, parameters at their defaults) on\n"
    "tensors of --elements (default 1024) elements, FLOAT where allowed,\n"
    "over --iterations runs (default 20; median and minimum),\n"
    "then a backward step of 250 dependent operators with one synchronize,\n"
    "pipelined and with unary calls, in microseconds per operator and in\n"
    "round trips (a synchronize of an idle stream, measured alongside),\n"
    "all on the server's device --device (default 0).";

int Fail(absl::string_view message) {
  std::fprintf(stderr, "opctl: %.*s\n", static_cast<int>(message.size()),
               message.data());
  return 1;
}

// A command line opctl cannot use: the same one line, the usage status.
int UsageError(absl::string_view message) {
  Fail(message);
  return kUsageErrorExit;
}

// `status`'s message after `prefix`, with its aclnn status when that says
// more than the message.
int FailStatus(const absl::Status& status, absl::string_view prefix = "") {
  const int32_t aclnn = kernels::GetAclnnStatus(status);
  std::string message = absl::StrCat(prefix, status.message());
  if (aclnn == kernels::kAclnnErrParamNullptr ||
      aclnn == kernels::kAclnnErrParamInvalid ||
      aclnn == kernels::kAclnnErrInnerNullptr) {
    absl::StrAppend(&message, " (aclnn ", aclnn, ")");
  }
  return Fail(message);
}

std::string DTypeNames(const google::protobuf::RepeatedField<int>& dtypes) {
  std::vector<std::string> names;
  for (int d : dtypes) {
    names.emplace_back(kernels::DTypeName(static_cast<DType>(d)));
  }
  return absl::StrJoin(names, ",");
}

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

// --name=value arguments of a command; a bare --name means "true".
struct CommandArgs {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
  std::map<std::string, bool> used;

  const std::string* Get(const std::string& name) {
    auto it = flags.find(name);
    if (it == flags.end()) return nullptr;
    used[name] = true;
    return &it->second;
  }
};

absl::StatusOr<CommandArgs> ParseCommandArgs(
    const std::vector<std::string>& args) {
  CommandArgs parsed;
  for (const std::string& arg : args) {
    absl::string_view a = arg;
    if (!absl::ConsumePrefix(&a, "--")) {
      parsed.positional.push_back(arg);
      continue;
    }
    size_t eq = a.find('=');
    std::string name(a.substr(0, eq));
    std::string value =
        eq == absl::string_view::npos ? "true" : std::string(a.substr(eq + 1));
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed argument '", arg, "'"));
    }
    if (parsed.flags.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " given twice"));
    }
    parsed.flags[name] = value;
  }
  return parsed;
}

// Flags of `run` itself, which no operator argument may shadow.
const std::vector<std::string>& RunFlags() {
  static const auto* const flags =
      new std::vector<std::string>{"dtype", "output", "help"};
  return *flags;
}

// The server's operators (ListOperators), checked.
absl::StatusOr<OpCatalog> FetchCatalog(Client& client) {
  ASSIGN_OR_RETURN(v1::ListOperatorsResponse ops, client.ListOperators());
  return ParseCatalog(ops, RunFlags());
}

// "--gradOutput --self [--threshold=0] -> out": how to call `op`.
std::string Synopsis(const OpSignature& op) {
  std::vector<std::string> parts;
  for (const TensorSignature& t : op.inputs) parts.push_back("--" + t.name);
  for (const ParamSignature& p : op.params) {
    if (!p.default_value.has_value()) {
      parts.push_back(absl::StrCat("--", p.name, "=X"));
    } else if (p.type == "bool") {
      parts.push_back(absl::StrCat(
          "[--", p.name, "=", *p.default_value != 0 ? "true" : "false", "]"));
    } else {
      parts.push_back(absl::StrCat("[--", p.name, "=", *p.default_value, "]"));
    }
  }
  return absl::StrCat(absl::StrJoin(parts, " "), " -> ", op.output.name);
}

// Why `name` is not an operator of `catalog`, naming the ones it has.
std::string UnknownOperator(const OpCatalog& catalog, absl::string_view name) {
  std::string message = absl::StrCat("run: unknown operator '", name,
                                     "'; the server offers ", catalog.Names());
  if (!catalog.rejected.empty()) {
    absl::StrAppend(&message, " (", catalog.rejected.size(),
                    " more it lists are unusable, e.g. ",
                    catalog.rejected.front(), ")");
  }
  return message;
}

// The shortest text that reads back as the same element: 4.4 for the FLOAT
// nearest to 4.4, not 4.4000001.
std::string FormatValue(double v, DType dtype) {
  const bool single = dtype != DType::kDouble;
  char buffer[40];
  if (v == std::trunc(v) && std::fabs(v) < 1e15) {
    std::snprintf(buffer, sizeof(buffer), "%.0f", v);
    return buffer;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, v);
    const double back = std::strtod(buffer, nullptr);
    if (single ? static_cast<float>(back) == static_cast<float>(v)
               : back == v) {
      return buffer;
    }
  }
  return buffer;  // NaN never compares equal; "%g" already says "nan".
}

// A client of the server of --device=`device`, and that device's index
// on it (the same index for one server; for a pool, the ordinal's).
struct Connection {
  std::unique_ptr<Client> client;
  uint32_t device = 0;
};
// Connects with the global flags; `pipeline` = ConnectOptions::pipeline.
using Connector =
    std::function<absl::StatusOr<Connection>(bool pipeline, uint32_t device)>;

// Ordinal `ordinal` of a pool; INVALID_ARGUMENT naming the count past
// the last.
absl::StatusOr<PoolDevice> PoolOrdinal(const PoolResolution& pool,
                                       const std::string& server,
                                       uint32_t ordinal) {
  if (ordinal >= pool.devices.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=", ordinal, ": the pool ", server, " has ",
        pool.devices.size(), " device", pool.devices.size() == 1 ? "" : "s",
        " (opctl info lists them)"));
  }
  return pool.devices[ordinal];
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

// The value of a command's --device (0 when absent): the server checks
// it against its devices, and its error names the count.
absl::StatusOr<uint32_t> DeviceArg(CommandArgs& args, absl::string_view cmd) {
  uint32_t device = 0;
  if (const std::string* v = args.Get("device")) {
    if (!absl::SimpleAtoi(*v, &device)) {
      return absl::InvalidArgumentError(
          absl::StrCat(cmd, ": --device=", *v,
                       " must be a device index (opctl info lists them)"));
    }
  }
  return device;
}

// Usage, then each operator the server offers; the server's silence is
// reported, not an error (help works without a server).
int RunHelp(const Connector& connect) {
  std::printf("%s\n", kRunUsage);
  auto connected = connect(true, 0);
  absl::StatusOr<OpCatalog> catalog =
      connected.ok() ? FetchCatalog(*connected->client) : connected.status();
  if (!catalog.ok()) {
    std::printf(
        "\n(The operators come from the server, which did not answer: "
        "%s. 'opctl ops' lists them.)\n",
        std::string(catalog.status().message()).c_str());
    return 0;
  }
  std::printf("\nOperators on %s ('opctl ops' describes them):\n",
              connected->client->address().c_str());
  for (const OpSignature& op : catalog->ops) {
    std::printf("  %s %s\n", op.name.c_str(), Synopsis(op).c_str());
  }
  for (const std::string& why : catalog->rejected) {
    std::printf("  (unusable: %s)\n", why.c_str());
  }
  return 0;
}

// Builds the call from what ListOperators says about OP: inputs and their
// dtypes, parameters by name and type with the server's defaults, the
// output's name; its shape from the client's own phase-one checks.
// The dtype of an input given as numbers, or of the output: its
// --NAME_dtype, its only dtype, or --dtype.
using RunDTypeOf = std::function<absl::StatusOr<DType>(const TensorSignature&)>;

// One input given as a list of numbers (--NAME=1,2,3 [--NAME_shape=...]).
absl::StatusOr<HostTensor> RunValues(const TensorSignature& input,
                                     CommandArgs& args,
                                     const RunDTypeOf& dtype_of,
                                     const std::string& value) {
  const std::string& arg = input.name;
  auto values = ParseNumberList(value);
  if (!values.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("run: --", arg, ": ", values.status().message()));
  }
  auto d = dtype_of(input);
  if (!d.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("run: ", d.status().message()));
  }
  HostTensor tensor;
  tensor.dtype = *d;
  tensor.shape = {static_cast<int64_t>(values->size())};
  if (const std::string* shape = args.Get(arg + "_shape")) {
    auto s = ParseShape(*shape);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("run: --", arg, "_shape: ", s.status().message()));
    }
    tensor.shape = *s;
  }
  if (tensor.numel() != static_cast<int64_t>(values->size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "run: --", arg, " has ", values->size(), " values but shape [",
        absl::StrJoin(tensor.shape, ","), "] holds ", tensor.numel()));
  }
  auto bytes = EncodeValues(tensor.dtype, *values);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("run: --", arg, ": ", bytes.status().message()));
  }
  tensor.bytes = *std::move(bytes);
  return tensor;
}

// The input tensors of `opctl run`: --NAME=VALUES (with --NAME_shape and
// the dtype flags) or --NAME=@FILE.npy for each input of `op`.
absl::StatusOr<std::map<std::string, HostTensor>> RunInputs(
    const OpSignature& op, CommandArgs& args, const RunDTypeOf& dtype_of) {
  std::map<std::string, HostTensor> inputs;
  for (const TensorSignature& input : op.inputs) {
    const std::string& arg = input.name;
    const std::string* value = args.Get(arg);
    if (value == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("run: ", op.name, " needs --", arg, "=VALUES or --", arg,
                       "=@FILE.npy"));
    }
    HostTensor tensor;
    if (absl::StartsWith(*value, "@")) {
      auto npy = ReadNpy(value->substr(1));
      if (!npy.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("run: --", arg, ": ", npy.status().message()));
      }
      tensor = *std::move(npy);
      if (args.flags.count(arg + "_shape")) {
        return absl::InvalidArgumentError(absl::StrCat(
            "run: --", arg, "_shape cannot be combined with a .npy file"));
      }
    } else {
      ASSIGN_OR_RETURN(tensor, RunValues(input, args, dtype_of, *value));
    }
    inputs[arg] = std::move(tensor);
  }
  return inputs;
}

// The operator's parameters: each flag's value, else the server's default.
absl::StatusOr<v1::OpParams> RunParams(const OpSignature& op,
                                       CommandArgs& args) {
  v1::OpParams params;
  for (const ParamSignature& p : op.params) {
    double value = 0;
    if (const std::string* text = args.Get(p.name)) {
      if (p.type == "bool") {
        if (*text != "true" && *text != "false") {
          return absl::InvalidArgumentError(absl::StrCat(
              "run: --", p.name, "=", *text, " must be true or false"));
        }
        value = *text == "true" ? 1 : 0;
      } else if (!absl::SimpleAtod(*text, &value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("run: --", p.name, "=", *text, " is not a number"));
      }
    } else if (p.default_value.has_value()) {
      value = *p.default_value;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("run: ", op.name, " needs --", p.name,
                       "=X (the server gives no default)"));
    }
    DType scalar_dtype = p.default_dtype();
    if (p.type == "scalar") {
      if (const std::string* name = args.Get(p.name + "_dtype")) {
        auto d = ParseDType(*name);
        if (!d.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "run: --", p.name, "_dtype: ", d.status().message()));
        }
        scalar_dtype = *d;
      }
    }
    SetParam(p, value, scalar_dtype, &params);
  }
  return params;
}

// Every flag given was used: a misspelt one is an error, not ignored.
absl::Status CheckRunFlagsUsed(const OpSignature& op, CommandArgs& args) {
  for (const auto& [name, used] : args.used) args.flags.erase(name);
  for (const TensorSignature& t : op.inputs)
    args.flags.erase(t.name + "_shape");
  if (args.flags.empty()) return absl::OkStatus();
  std::vector<std::string> takes;
  for (const TensorSignature& t : op.inputs) takes.push_back("--" + t.name);
  for (const ParamSignature& p : op.params) takes.push_back("--" + p.name);
  return absl::InvalidArgumentError(absl::StrCat(
      "run: unknown argument --", args.flags.begin()->first, " for ", op.name,
      ", which takes ", absl::StrJoin(takes, ", "), " (try opctl run --help)"));
}

// Uploads the inputs, runs the operator once on stream 0 and downloads
// `out` (its dtype and shape set, the bytes filled in).
absl::Status RunOnServer(Client& client, uint32_t device, const OpSignature& op,
                         const v1::OpParams& params,
                         const std::map<std::string, HostTensor>& inputs,
                         HostTensor& out) {
  ASSIGN_OR_RETURN(std::unique_ptr<Session> session,
                   client.CreateSession("opctl run", /*attach=*/true, device));
  std::map<std::string, TensorDesc> descs;
  std::vector<DeviceBuffer> buffers;
  for (const auto& [name, tensor] : inputs) {
    ASSIGN_OR_RETURN(DeviceBuffer buffer, session->Malloc(tensor.bytes.size()));
    RETURN_IF_ERROR(session->Upload(buffer.handle(), 0, tensor.bytes.data(),
                                    tensor.bytes.size()));
    descs[name] =
        TensorDesc::Contiguous(buffer.handle(), tensor.dtype, tensor.shape);
    buffers.push_back(std::move(buffer));
  }
  int64_t out_bytes = 0;
  if (__builtin_mul_overflow(out.numel(), kernels::DTypeSize(out.dtype),
                             &out_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("run: an output of shape [", absl::StrJoin(out.shape, ","),
                     "] is too large"));
  }
  ASSIGN_OR_RETURN(DeviceBuffer out_buffer, session->Malloc(out_bytes));
  descs[op.output.name] =
      TensorDesc::Contiguous(out_buffer.handle(), out.dtype, out.shape);
  ASSIGN_OR_RETURN(Executor executor,
                   session->GetWorkspaceSize(op.name, params, descs));
  DeviceBuffer workspace;
  if (executor.workspace_size() > 0) {
    ASSIGN_OR_RETURN(workspace, session->Malloc(executor.workspace_size()));
  }
  RETURN_IF_ERROR(executor.Execute(0, workspace.handle()));
  RETURN_IF_ERROR(session->Synchronize());
  out.bytes.resize(out_bytes);
  return session->Download(out_buffer.handle(), 0, out.bytes.data(), out_bytes);
}

// The result: written to --output as .npy, or printed.
int PrintRunOutput(const OpSignature& op, const HostTensor& out,
                   const std::string& output_path) {
  if (!output_path.empty()) {
    absl::Status status = WriteNpy(output_path, out);
    if (!status.ok()) return Fail(absl::StrCat("run: ", status.message()));
    std::printf("%s: %s [%s] written to %s\n", op.output.name.c_str(),
                std::string(kernels::DTypeName(out.dtype)).c_str(),
                absl::StrJoin(out.shape, ",").c_str(), output_path.c_str());
    return 0;
  }
  std::vector<std::string> values;
  for (double v : DecodeValues(out.dtype, out.bytes)) {
    values.push_back(FormatValue(v, out.dtype));
  }
  std::printf("%s = [%s]  (%s, shape [%s])\n", op.output.name.c_str(),
              absl::StrJoin(values, ", ").c_str(),
              std::string(kernels::DTypeName(out.dtype)).c_str(),
              absl::StrJoin(out.shape, ",").c_str());
  return 0;
}

// `opctl run OP --INPUT=... [--PARAM=...]`: one call of OP on the server,
// its output printed. Every error is one line and exit status 1.
int Run(const Connector& connect, const std::vector<std::string>& raw) {
  if (std::find(raw.begin(), raw.end(), "--help") != raw.end()) {
    return RunHelp(connect);
  }
  auto parsed = ParseCommandArgs(raw);
  if (!parsed.ok()) return Fail(parsed.status().message());
  CommandArgs& args = *parsed;
  if (args.positional.size() != 1) {
    return Fail(args.positional.empty()
                    ? "run: missing OP (try opctl run --help)"
                    : absl::StrCat("run: unexpected argument '",
                                   args.positional[1], "'"));
  }
  absl::StatusOr<uint32_t> device = DeviceArg(args, "run");
  if (!device.ok()) return Fail(device.status().message());
  DType dtype = DType::kFloat;
  if (const std::string* name = args.Get("dtype")) {
    auto d = ParseDType(*name);
    if (!d.ok()) {
      return Fail(absl::StrCat("run: --dtype: ", d.status().message()));
    }
    dtype = *d;
  }
  auto connected = connect(true, *device);
  if (!connected.ok()) return Fail(connected.status().message());
  Client& client = *connected->client;
  absl::StatusOr<OpCatalog> catalog = FetchCatalog(client);
  if (!catalog.ok()) return FailStatus(catalog.status(), "run: ");
  const OpSignature* op = catalog->Find(args.positional[0]);
  if (op == nullptr) {
    return Fail(UnknownOperator(*catalog, args.positional[0]));
  }
  const RunDTypeOf dtype_of =
      [&](const TensorSignature& t) -> absl::StatusOr<DType> {
    if (const std::string* name = args.Get(t.name + "_dtype")) {
      auto d = ParseDType(*name);
      if (!d.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", t.name, "_dtype: ", d.status().message()));
      }
      return *d;
    }
    return t.dtypes.size() == 1 ? t.dtypes.front() : dtype;
  };

  // The command line, checked whole before the server does anything.
  auto inputs = RunInputs(*op, args, dtype_of);
  if (!inputs.ok()) return Fail(inputs.status().message());
  auto params = RunParams(*op, args);
  if (!params.ok()) return Fail(params.status().message());
  std::string output_path;
  if (const std::string* path = args.Get("output")) output_path = *path;
  auto out_dtype = dtype_of(op->output);
  if (!out_dtype.ok()) {
    return Fail(absl::StrCat("run: ", out_dtype.status().message()));
  }
  if (absl::Status used = CheckRunFlagsUsed(*op, args); !used.ok()) {
    return Fail(used.message());
  }

  // Output: the shape the operator's checks accept, asked of the same
  // checks the server runs before anything is uploaded.
  std::map<std::string, ArgShape> shapes;
  for (const auto& [name, tensor] : *inputs) {
    shapes[name] = ArgShape{tensor.dtype, tensor.shape};
  }
  absl::StatusOr<std::vector<int64_t>> out_shape =
      OutputShape(*op, *params, shapes, *out_dtype);
  if (!out_shape.ok()) return FailStatus(out_shape.status(), "run: ");

  HostTensor out;
  out.dtype = *out_dtype;
  out.shape = *out_shape;
  absl::Status status =
      RunOnServer(client, connected->device, *op, *params, *inputs, out);
  if (!status.ok()) return FailStatus(status);
  return PrintRunOutput(*op, out, output_path);
}

// A backward step as a training job issues it: 250 dependent operators
// (plan + launch each), one synchronize, pipelined and with unary calls,
// against the round trip of the same connection (a synchronize of an idle
// stream).
int BenchStep(const Connector& connect, int64_t n, uint32_t device) {
  constexpr int kOps = 250;
  constexpr int kSteps = 5;
  std::printf(
      "\nbackward step: %d dependent ThresholdBackward on %lld "
      "FLOAT elements, one synchronize (median of %d)\n",
      kOps, static_cast<long long>(n), kSteps);
  std::printf("%-10s %12s %14s %16s\n", "path", "us per op", "round trip us",
              "round trips/op");
  for (bool pipeline : {true, false}) {
    auto connected = connect(pipeline, device);
    if (!connected.ok()) return Fail(connected.status().message());
    auto session = connected->client->CreateSession("opctl bench step", true,
                                                    connected->device);
    if (!session.ok()) return FailStatus(session.status());
    Session& s = **session;
    std::vector<float> ones(n, 1.0f);
    auto a = s.Malloc(n * 4);
    auto b = s.Malloc(n * 4);
    if (!a.ok() || !b.ok())
      return FailStatus(!a.ok() ? a.status() : b.status());
    for (auto* buffer : {&a, &b}) {
      absl::Status up = s.Upload((*buffer)->handle(), 0, ones.data(), n * 4);
      if (!up.ok()) return FailStatus(up);
    }
    const TensorDesc ta =
        TensorDesc::Contiguous(a->handle(), DType::kFloat, {n});
    const TensorDesc tb =
        TensorDesc::Contiguous(b->handle(), DType::kFloat, {n});
    std::vector<double> rtt;
    for (int i = 0; i < 50; ++i) {
      const absl::Time start = absl::Now();
      if (absl::Status st = s.Synchronize(); !st.ok()) return FailStatus(st);
      rtt.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    }
    std::vector<double> per_op;
    for (int step = 0; step < kSteps; ++step) {
      const absl::Time start = absl::Now();
      for (int i = 0; i < kOps; ++i) {
        // a -> b -> a: each reads the previous one's output.
        auto executor = i % 2 == 0 ? s.ThresholdBackward(ta, ta, 0.5, tb)
                                   : s.ThresholdBackward(tb, tb, 0.5, ta);
        if (!executor.ok()) return FailStatus(executor.status());
        if (absl::Status st = executor->Execute(); !st.ok()) {
          return FailStatus(st);
        }
      }
      if (absl::Status st = s.Synchronize(); !st.ok()) return FailStatus(st);
      per_op.push_back(absl::ToDoubleMicroseconds(absl::Now() - start) / kOps);
    }
    std::sort(rtt.begin(), rtt.end());
    std::sort(per_op.begin(), per_op.end());
    const double round_trip = rtt[rtt.size() / 2];
    const double op = per_op[per_op.size() / 2];
    std::printf(
        "%-10s %12.1f %14.1f %16.2f%s\n", pipeline ? "pipelined" : "unary", op,
        round_trip, op / round_trip,
        pipeline && !s.pipelined() ? "  (server has no Pipeline: unary)" : "");
  }
  return 0;
}

// One operator's call as bench makes it, with the buffers it names.
struct BenchCall {
  v1::OpParams params;
  std::map<std::string, TensorDesc> descs;
  std::vector<DeviceBuffer> buffers;
};

// `op` on `n` elements: FLOAT tensors where the argument allows FLOAT (else
// its first dtype), every parameter at the server's default. An input that
// can only be UINT8 is taken for a bit mask of one bit per element, sized
// as aclnn's dropout mask is (align(n, 128) / 8 bytes), since nothing on the
// wire gives an input's size rule. Fails, saying why, when the call is not
// one the operator's checks accept.
absl::StatusOr<BenchCall> PrepareBenchCall(Session& s, const OpSignature& op,
                                           int64_t n) {
  BenchCall call;
  for (const ParamSignature& p : op.params) {
    if (!p.default_value.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p.name, " has no default"));
    }
    SetParam(p, *p.default_value, p.default_dtype(), &call.params);
  }
  auto pick = [](const TensorSignature& t) {
    return std::find(t.dtypes.begin(), t.dtypes.end(), DType::kFloat) !=
                   t.dtypes.end()
               ? DType::kFloat
               : t.dtypes.front();
  };
  std::map<std::string, ArgShape> shapes;
  for (const TensorSignature& t : op.inputs) {
    ArgShape arg{pick(t), {n}};
    if (t.dtypes == std::vector<DType>{DType::kUint8}) {
      arg.shape = {(n + 127) / 128 * 16};
    }
    shapes[t.name] = arg;
  }
  const DType out_dtype = pick(op.output);
  ASSIGN_OR_RETURN(std::vector<int64_t> out_shape,
                   OutputShape(op, call.params, shapes, out_dtype));
  shapes[op.output.name] = ArgShape{out_dtype, out_shape};
  for (const auto& [name, arg] : shapes) {
    int64_t numel = 1, bytes = 0;
    for (int64_t d : arg.shape) numel *= d;  // [n] or the mask's [<= n].
    if (__builtin_mul_overflow(numel, kernels::DTypeSize(arg.dtype), &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " of ", numel, " elements is too large"));
    }
    ASSIGN_OR_RETURN(DeviceBuffer buffer, s.Malloc(bytes));
    if (name != op.output.name) {
      // Ones for FLOAT, 0x55 bytes otherwise (every other element of a mask).
      std::string host(bytes, '\x55');
      if (arg.dtype == DType::kFloat) {
        const float one = 1.0f;
        for (int64_t i = 0; i < numel; ++i) {
          std::memcpy(&host[i * sizeof(float)], &one, sizeof(float));
        }
      }
      RETURN_IF_ERROR(s.Upload(buffer.handle(), 0, host.data(), bytes));
    }
    call.descs[name] =
        TensorDesc::Contiguous(buffer.handle(), arg.dtype, arg.shape);
    call.buffers.push_back(std::move(buffer));
  }
  return call;
}

int Bench(const Connector& connect, const std::vector<std::string>& raw) {
  if (std::find(raw.begin(), raw.end(), "--help") != raw.end()) {
    std::printf("%s\n", kBenchUsage);
    return 0;
  }
  auto parsed = ParseCommandArgs(raw);
  if (!parsed.ok()) return Fail(parsed.status().message());
  CommandArgs& args = *parsed;
  if (!args.positional.empty()) {
    return Fail(
        absl::StrCat("bench: unexpected argument '", args.positional[0], "'"));
  }
  int64_t sizes[3] = {64 << 20, 20, 1024};
  const char* names[3] = {"bytes", "iterations", "elements"};
  for (int i = 0; i < 3; ++i) {
    if (const std::string* v = args.Get(names[i])) {
      if (!absl::SimpleAtoi(*v, &sizes[i]) || sizes[i] <= 0) {
        return Fail(absl::StrCat("bench: --", names[i], "=", *v,
                                 " must be a positive integer"));
      }
    }
  }
  absl::StatusOr<uint32_t> device = DeviceArg(args, "bench");
  if (!device.ok()) return Fail(device.status().message());
  for (const auto& [name, used] : args.used) args.flags.erase(name);
  if (!args.flags.empty()) {
    return Fail(absl::StrCat("bench: unknown argument --",
                             args.flags.begin()->first,
                             " (try opctl bench --help)"));
  }
  const int64_t bytes = sizes[0], iterations = sizes[1], n = sizes[2];
  auto connected = connect(true, *device);
  if (!connected.ok()) return Fail(connected.status().message());
  Client& client = *connected->client;
  auto session = client.CreateSession("opctl bench", true, connected->device);
  if (!session.ok()) return FailStatus(session.status());
  Session& s = **session;

  // Transfers.
  std::vector<char> host(bytes, 1);
  auto buffer = s.Malloc(bytes);
  if (!buffer.ok()) return FailStatus(buffer.status());
  std::vector<double> up, down, tcp;
  for (int64_t i = 0; i < std::min<int64_t>(iterations, 5); ++i) {
    // The reference, interleaved with the transfers so both see the same
    // load on this host.
    absl::StatusOr<double> tcp_seconds = LoopbackTcpOneWaySeconds(bytes);
    if (!tcp_seconds.ok()) return FailStatus(tcp_seconds.status());
    tcp.push_back(*tcp_seconds);
    absl::Time start = absl::Now();
    absl::Status status = s.Upload(buffer->handle(), 0, host.data(), bytes);
    if (!status.ok()) return FailStatus(status);
    up.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    start = absl::Now();
    status = s.Download(buffer->handle(), 0, host.data(), bytes);
    if (!status.ok()) return FailStatus(status);
    down.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::sort(up.begin(), up.end());
  std::sort(down.begin(), down.end());
  std::sort(tcp.begin(), tcp.end());
  std::printf("server %s, %lld bytes per transfer\n", client.address().c_str(),
              static_cast<long long>(bytes));
  // opctl cannot run a TCP sink on the server's host, so the reference is
  // this host's loopback: the path's limit only for a loopback server.
  absl::StatusOr<ListenAddress> address = ParseListenAddress(client.address());
  const bool loopback = address.ok() && IsLoopback(*address);
  const double tcp_gbs = bytes / tcp[0] / 1e9;
  std::printf(
      "raw TCP:  %8.3f GB/s (best of %zu, one-way over this host's "
      "loopback, same run)\n",
      tcp_gbs, tcp.size());
  std::printf("upload:   %8.3f GB/s (best of %zu)  %.2f of raw TCP\n",
              bytes / up[0] / 1e9, up.size(), bytes / up[0] / 1e9 / tcp_gbs);
  std::printf("download: %8.3f GB/s (best of %zu)  %.2f of raw TCP\n",
              bytes / down[0] / 1e9, down.size(),
              bytes / down[0] / 1e9 / tcp_gbs);
  if (!loopback) {
    std::printf(
        "(the server is not on loopback: raw TCP is this host's own ceiling, "
        "not the network's; measure the network with a tool on both ends, "
        "e.g. iperf3)\n");
  }
  buffer->Free().IgnoreError();

  // Operators: plan + launch + synchronize of each the server offers.
  absl::StatusOr<OpCatalog> catalog = FetchCatalog(client);
  if (!catalog.ok()) return FailStatus(catalog.status(), "bench: ");
  std::printf("%-20s %12s %12s  (%lld FLOAT elements, %lld runs)\n", "operator",
              "median us", "min us", static_cast<long long>(n),
              static_cast<long long>(iterations));
  for (const OpSignature& op : catalog->ops) {
    absl::StatusOr<BenchCall> call = PrepareBenchCall(s, op, n);
    if (!call.ok()) {
      std::printf("%-20s skipped: %s\n", op.name.c_str(),
                  std::string(call.status().message()).c_str());
      continue;
    }
    std::vector<double> times;
    for (int64_t i = 0; i < iterations; ++i) {
      const absl::Time start = absl::Now();
      absl::StatusOr<Executor> executor =
          s.GetWorkspaceSize(op.name, call->params, call->descs);
      if (!executor.ok()) return FailStatus(executor.status());
      absl::Status status = executor->Execute();
      if (status.ok()) status = s.Synchronize();
      if (!status.ok()) return FailStatus(status);
      times.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    }
    std::sort(times.begin(), times.end());
    std::printf("%-20s %12.1f %12.1f\n", op.name.c_str(),
                times[times.size() / 2], times[0]);
  }
  for (const std::string& why : catalog->rejected) {
    std::printf("skipped: %s\n", why.c_str());
  }
  return BenchStep(connect, n, *device);
}

int Main(int argc, char** argv) {
  // Abseil's Mutex deadlock detection (on in Debian's build) records every
  // lock order; a command-line client has no use for it, and it slows the
  // pipelined channel that `opctl bench` measures.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Global flags end at the command; what follows belongs to the command.
  int command_at = 1;
  while (command_at < argc) {
    absl::string_view arg = argv[command_at];
    if (!absl::StartsWith(arg, "-")) break;
    ++command_at;
    // "--server HOST:PORT": the value is the next argument.
    if ((arg == "--server" || arg == "-server" || arg == "--timeout_ms" ||
         arg == "-timeout_ms") &&
        command_at < argc) {
      ++command_at;
    }
  }
  // Exits on --help, --version and a bad flag.
  std::vector<char*> args =
      ParseFlagsOrExit(command_at, argv, "opctl", kUsage, "client/opctl.cc");
  if (args.size() > 1) {
    return UsageError(
        absl::StrCat("unexpected argument '", args[1], "' (try --help)"));
  }
  if (command_at >= argc) return UsageError("missing COMMAND (try --help)");
  const std::string command = argv[command_at];
  std::vector<std::string> rest(argv + command_at + 1, argv + argc);
  if (command != "info" && command != "ops" && command != "stats" &&
      command != "run" && command != "bench") {
    return UsageError(
        absl::StrCat("unknown command '", command, "' (try --help)"));
  }
  if ((command == "info" || command == "ops" || command == "stats") &&
      !rest.empty()) {
    return UsageError(absl::StrCat("unexpected arguments after '", command,
                                   "' (try --help)"));
  }
  // Help needs no server (run's lists the server's operators when it
  // answers; see RunHelp).
  if (command == "bench" &&
      std::find(rest.begin(), rest.end(), "--help") != rest.end()) {
    std::printf("%s\n", kBenchUsage);
    return 0;
  }
  const int timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  if (timeout_ms <= 0) return Fail("--timeout_ms must be positive");
  ConnectOptions options;
  options.connect_timeout = options.call_timeout =
      absl::Milliseconds(timeout_ms);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return Fail("--tls_cert_file and --tls_key_file: give both or neither");
  }
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(path);
    if (!token.ok()) {
      return Fail(absl::StrCat("--token_file: ", token.status().message()));
    }
    options.token = *std::move(token);
  }
  const std::string server = absl::GetFlag(FLAGS_server);
  // A pool is read (and claimed) once: every command sees the same
  // ordinals, and the claim lasts until opctl exits.
  std::optional<PoolResolution> pool;
  if (IsEtcdAddress(server)) {
    absl::StatusOr<ClaimOptions> claim = ClaimOptionsFromEnv();
    if (!claim.ok()) return Fail(claim.status().message());
    absl::StatusOr<PoolResolution> resolved =
        ResolvePool(server, *claim, EtcdCredentialsFromEnv());
    if (!resolved.ok()) return Fail(resolved.status().message());
    pool = *std::move(resolved);
  }
  const Connector connect = [&](bool pipeline,
                                uint32_t device) -> absl::StatusOr<Connection> {
    ConnectOptions chosen = options;
    chosen.pipeline = pipeline;
    std::string address = server;
    if (pool.has_value()) {
      ASSIGN_OR_RETURN(PoolDevice found, PoolOrdinal(*pool, server, device));
      address = found.address;
      device = found.device;
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                     Client::Connect(address, chosen));
    return Connection{std::move(client), device};
  };
  if (command == "run") return Run(connect, rest);
  if (command == "bench") return Bench(connect, rest);
  if (pool.has_value()) {
    if (command == "info") return PoolInfo(*pool, server);
    if (command == "stats") return PoolStats(*pool, connect);
  }
  auto connected = connect(true, 0);
  if (!connected.ok()) return Fail(connected.status().message());
  Client& client = *connected->client;
  if (command == "info") return Info(client);
  if (command == "stats") return Stats(client);
  return Ops(client);
}

}  // namespace
}  // namespace opserver::remote

int main(int argc, char** argv) {
  const int status = opserver::remote::Main(argc, argv);
  // Everything opctl made is gone by now (Main's locals). It leaves without
  // gRPC's library-wide cleanup, which after a failed TLS handshake can wait
  // for the channel's reconnect backoff timer: security_binary_test saw
  // opctl hang over a minute after printing its error (1 run in ~12 under
  // ASan), and LeakSanitizer report the handshake's half-freed OpenSSL
  // state. As in the server's main, the leak check then runs here.
#if defined(__SANITIZE_ADDRESS__)
  __lsan_do_leak_check();
#endif
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);
}
