// opctl: command-line client of an opserver.
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
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/host_tensor.h"
#include "client/loopback_tcp.h"
#include "common/listen_address.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "opserver to talk to.");
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
    "Usage: opctl [--server=HOST:PORT] [--timeout_ms=N] [--tls_ca_file=PEM\n"
    "             [--tls_cert_file=PEM --tls_key_file=PEM]] [--token_file=F]\n"
    "             COMMAND [ARGS]\n"
    "Commands:\n"
    "  info    device, server version and health\n"
    "  ops     operators with their tensor arguments, dtypes and parameters\n"
    "  run     one operator on values from the command line or .npy files\n"
    "          (opctl run --help for the details)\n"
    "  stats   sessions and device memory in use on the server\n"
    "  bench   transfer throughput, per-operator latency and the\n"
    "          pipelined vs unary cost of a backward step\n"
    "          (opctl bench --help for the details)";

constexpr char kRunUsage[] =
    "Usage: opctl [--server=..] run OP [--NAME=VALUE ...]\n"
    "Runs one operator (ThresholdBackward, SoftshrinkBackward,\n"
    "HardswishBackward, LeakyReluBackward, DropoutBackward; 'opctl ops' lists\n"
    "them) through device memory and the two aclnn phases, and prints the\n"
    "output.\n"
    "  --ARG=1,2,3        values of an input tensor (gradOutput, self, mask)\n"
    "  --ARG=@FILE.npy    an input tensor from a .npy file (dtype and shape\n"
    "                     from the file)\n"
    "  --ARG_shape=2,2    shape of an input given by values (default: 1-D)\n"
    "  --ARG_dtype=NAME   dtype of one tensor, output included (default\n"
    "                     --dtype; a mask is UINT8)\n"
    "  --dtype=NAME       dtype of the tensors (default FLOAT)\n"
    "  --threshold=X --lambd=X --scale=X --negativeSlope=X\n"
    "  --negativeSlope_dtype=NAME --selfIsResult=true|false\n"
    "                     the operator's parameters\n"
    "  --output=FILE.npy  write the output there instead of printing it\n"
    "Example: opctl run ThresholdBackward --threshold=1 \\\n"
    "           --gradOutput=4.5,4.4,4.3,4.2 --self=0.2,1.2,2.2,3.2";

constexpr char kBenchUsage[] =
    "Usage: opctl [--server=..] bench [--bytes=N] [--iterations=N] "
    "[--elements=N]\n"
    "Measures upload and download throughput of --bytes (default 67108864)\n"
    "next to a raw TCP one-way stream over this host's loopback (the\n"
    "path's limit when the server is on loopback too),\n"
    "and the latency of each operator (GetWorkspaceSize + Execute +\n"
    "SynchronizeStream) on FLOAT tensors of --elements (default 1024)\n"
    "elements, over --iterations runs (default 20; median and minimum),\n"
    "then a backward step of 250 dependent operators with one synchronize,\n"
    "pipelined and with unary calls, in microseconds per operator and in\n"
    "round trips (a synchronize of an idle stream, measured alongside).";

int Fail(absl::string_view message) {
  std::fprintf(stderr, "opctl: %.*s\n", static_cast<int>(message.size()),
               message.data());
  return 1;
}

int FailStatus(const absl::Status& status) {
  const int32_t aclnn = kernels::GetAclnnStatus(status);
  std::string message(status.message());
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
  auto health = client.CheckHealth();
  if (!health.ok()) return Fail(health.status().message());
  std::printf("server:   %s\n", client.address().c_str());
  std::printf("device:   %s (%s)\n", info->kind().c_str(),
              info->name().c_str());
  std::printf("memory:   %llu bytes\n",
              static_cast<unsigned long long>(info->memory_bytes()));
  std::printf("threads:  %u\n", info->threads());
  std::printf("version:  opserver %s, %s, gRPC %s\n",
              info->server_version().c_str(), info->api_version().c_str(),
              info->grpc_version().c_str());
  std::printf("health:   %s\n", health->c_str());
  return 0;
}

int Stats(Client& client) {
  grpc::ClientContext context;
  client.SetDeadline(&context);
  v1::ServerStats stats;
  absl::Status status =
      FromGrpcStatus(client.runtime().GetServerStats(
                         &context, v1::GetServerStatsRequest(), &stats),
                     context, "GetServerStats");
  if (!status.ok()) return Fail(status.message());
  std::printf("sessions:     %llu\n",
              static_cast<unsigned long long>(stats.sessions()));
  std::printf("buffers:      %llu\n",
              static_cast<unsigned long long>(stats.buffers()));
  std::printf("buffer_bytes: %llu\n",
              static_cast<unsigned long long>(stats.buffer_bytes()));
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
      std::printf("  param  %-11s %-6s %s\n", p.aclnn_name().c_str(),
                  p.type().c_str(), p.description().c_str());
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

absl::StatusOr<double> NumberFlag(CommandArgs& args, const std::string& name,
                                  double fallback) {
  const std::string* value = args.Get(name);
  if (value == nullptr) return fallback;
  double v;
  if (!absl::SimpleAtod(*value, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, "=", *value, " is not a number"));
  }
  return v;
}

// NumPy broadcasting of two shapes.
absl::StatusOr<std::vector<int64_t>> Broadcast(std::vector<int64_t> a,
                                               std::vector<int64_t> b) {
  if (a.size() < b.size()) std::swap(a, b);
  std::vector<int64_t> out = a;
  const size_t shift = a.size() - b.size();
  for (size_t i = 0; i < b.size(); ++i) {
    int64_t x = a[shift + i], y = b[i];
    if (x != y && x != 1 && y != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("shapes [", absl::StrJoin(a, ","), "] and [",
                       absl::StrJoin(b, ","), "] do not broadcast"));
    }
    out[shift + i] = x == 1 ? y : x;
  }
  return out;
}

struct OpArgs {
  const char* name;
  std::vector<std::string> inputs;
  std::string output;
};

const OpArgs* FindOp(absl::string_view name) {
  static const OpArgs kOps[] = {
      {"ThresholdBackward", {"gradOutput", "self"}, "out"},
      {"SoftshrinkBackward", {"gradOutput", "self"}, "gradInput"},
      {"HardswishBackward", {"gradOutput", "self"}, "out"},
      {"LeakyReluBackward", {"gradOutput", "self"}, "out"},
      {"DropoutBackward", {"gradOutput", "mask"}, "out"},
  };
  absl::ConsumePrefix(&name, "aclnn");
  for (const OpArgs& op : kOps) {
    if (absl::EqualsIgnoreCase(op.name, name)) return &op;
  }
  return nullptr;
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

// Connects with the global flags; `pipeline` = ConnectOptions::pipeline.
using Connector =
    std::function<absl::StatusOr<std::unique_ptr<Client>>(bool pipeline)>;

int Run(const Connector& connect, const std::vector<std::string>& raw) {
  if (std::find(raw.begin(), raw.end(), "--help") != raw.end()) {
    std::printf("%s\n", kRunUsage);
    return 0;
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
  const OpArgs* op = FindOp(args.positional[0]);
  if (op == nullptr) {
    return Fail(absl::StrCat("run: unknown operator '", args.positional[0],
                             "' (opctl ops lists them)"));
  }
  DType dtype = DType::kFloat;
  if (const std::string* name = args.Get("dtype")) {
    auto d = ParseDType(*name);
    if (!d.ok())
      return Fail(absl::StrCat("run: --dtype: ", d.status().message()));
    dtype = *d;
  }
  auto dtype_of = [&](const std::string& arg) -> absl::StatusOr<DType> {
    if (const std::string* name = args.Get(arg + "_dtype")) {
      auto d = ParseDType(*name);
      if (!d.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", arg, "_dtype: ", d.status().message()));
      }
      return *d;
    }
    return arg == "mask" ? DType::kUint8 : dtype;
  };

  // Inputs.
  std::map<std::string, HostTensor> inputs;
  for (const std::string& arg : op->inputs) {
    const std::string* value = args.Get(arg);
    if (value == nullptr) {
      return Fail(absl::StrCat("run: ", op->name, " needs --", arg,
                               "=VALUES or --", arg, "=@FILE.npy"));
    }
    HostTensor tensor;
    if (absl::StartsWith(*value, "@")) {
      auto npy = ReadNpy(value->substr(1));
      if (!npy.ok()) {
        return Fail(absl::StrCat("run: --", arg, ": ", npy.status().message()));
      }
      tensor = *std::move(npy);
      if (args.flags.count(arg + "_shape")) {
        return Fail(absl::StrCat("run: --", arg,
                                 "_shape cannot be combined with a .npy file"));
      }
    } else {
      auto values = ParseNumberList(*value);
      if (!values.ok()) {
        return Fail(
            absl::StrCat("run: --", arg, ": ", values.status().message()));
      }
      auto d = dtype_of(arg);
      if (!d.ok()) return Fail(absl::StrCat("run: ", d.status().message()));
      tensor.dtype = *d;
      tensor.shape = {static_cast<int64_t>(values->size())};
      if (const std::string* shape = args.Get(arg + "_shape")) {
        auto s = ParseShape(*shape);
        if (!s.ok()) {
          return Fail(
              absl::StrCat("run: --", arg, "_shape: ", s.status().message()));
        }
        tensor.shape = *s;
      }
      if (tensor.numel() != static_cast<int64_t>(values->size())) {
        return Fail(absl::StrCat(
            "run: --", arg, " has ", values->size(), " values but shape [",
            absl::StrJoin(tensor.shape, ","), "] holds ", tensor.numel()));
      }
      auto bytes = EncodeValues(tensor.dtype, *values);
      if (!bytes.ok()) {
        return Fail(
            absl::StrCat("run: --", arg, ": ", bytes.status().message()));
      }
      tensor.bytes = *std::move(bytes);
    }
    inputs[arg] = std::move(tensor);
  }

  // Parameters.
  v1::OpParams params;
  auto threshold = NumberFlag(args, "threshold", 0);
  auto lambd = NumberFlag(args, "lambd", 0.5);
  auto scale = NumberFlag(args, "scale", 1);
  auto slope = NumberFlag(args, "negativeSlope", 0.01);
  for (const auto* s : {&threshold, &lambd, &scale, &slope}) {
    if (!s->ok()) return Fail(absl::StrCat("run: ", s->status().message()));
  }
  params.set_threshold(*threshold);
  params.set_lambd(*lambd);
  params.set_scale(*scale);
  DType slope_dtype = DType::kFloat;
  if (const std::string* name = args.Get("negativeSlope_dtype")) {
    auto d = ParseDType(*name);
    if (!d.ok()) {
      return Fail(
          absl::StrCat("run: --negativeSlope_dtype: ", d.status().message()));
    }
    slope_dtype = *d;
  }
  params.mutable_negative_slope()->set_dtype(
      static_cast<v1::DataType>(slope_dtype));
  params.mutable_negative_slope()->set_value(*slope);
  if (const std::string* v = args.Get("selfIsResult")) {
    if (*v != "true" && *v != "false") {
      return Fail(
          absl::StrCat("run: --selfIsResult=", *v, " must be true or false"));
    }
    params.set_self_is_result(*v == "true");
  }
  std::string output_path;
  if (const std::string* path = args.Get("output")) output_path = *path;

  // Output: the broadcast shape (DropoutBackward: gradOutput's).
  auto out_dtype = dtype_of(op->output);
  if (!out_dtype.ok())
    return Fail(absl::StrCat("run: ", out_dtype.status().message()));
  std::vector<int64_t> out_shape = inputs["gradOutput"].shape;
  if (op->inputs[1] == "self") {
    auto shape = Broadcast(inputs["gradOutput"].shape, inputs["self"].shape);
    if (!shape.ok())
      return Fail(absl::StrCat("run: ", shape.status().message()));
    out_shape = *shape;
  }
  for (const auto& [name, used] : args.used) args.flags.erase(name);
  for (const std::string& arg : op->inputs) args.flags.erase(arg + "_shape");
  if (!args.flags.empty()) {
    return Fail(absl::StrCat("run: unknown argument --",
                             args.flags.begin()->first, " for ", op->name,
                             " (try opctl run --help)"));
  }

  auto connected = connect(true);
  if (!connected.ok()) return Fail(connected.status().message());
  Client& client = **connected;
  auto session = client.CreateSession("opctl run");
  if (!session.ok()) return FailStatus(session.status());
  std::map<std::string, TensorDesc> descs;
  std::vector<DeviceBuffer> buffers;
  for (const auto& [name, tensor] : inputs) {
    auto buffer = (*session)->Malloc(tensor.bytes.size());
    if (!buffer.ok()) return FailStatus(buffer.status());
    absl::Status status = (*session)->Upload(
        buffer->handle(), 0, tensor.bytes.data(), tensor.bytes.size());
    if (!status.ok()) return FailStatus(status);
    descs[name] =
        TensorDesc::Contiguous(buffer->handle(), tensor.dtype, tensor.shape);
    buffers.push_back(*std::move(buffer));
  }
  HostTensor out;
  out.dtype = *out_dtype;
  out.shape = out_shape;
  const int64_t out_bytes = out.numel() * kernels::DTypeSize(out.dtype);
  auto out_buffer = (*session)->Malloc(out_bytes);
  if (!out_buffer.ok()) return FailStatus(out_buffer.status());
  descs[op->output] =
      TensorDesc::Contiguous(out_buffer->handle(), out.dtype, out.shape);
  auto executor = (*session)->GetWorkspaceSize(op->name, params, descs);
  if (!executor.ok()) return FailStatus(executor.status());
  DeviceBuffer workspace;
  if (executor->workspace_size() > 0) {
    auto w = (*session)->Malloc(executor->workspace_size());
    if (!w.ok()) return FailStatus(w.status());
    workspace = *std::move(w);
  }
  absl::Status status = executor->Execute(0, workspace.handle());
  if (status.ok()) status = (*session)->Synchronize();
  if (!status.ok()) return FailStatus(status);
  out.bytes.resize(out_bytes);
  status = (*session)->Download(out_buffer->handle(), 0, out.bytes.data(),
                                out_bytes);
  if (!status.ok()) return FailStatus(status);

  if (!output_path.empty()) {
    status = WriteNpy(output_path, out);
    if (!status.ok()) return Fail(absl::StrCat("run: ", status.message()));
    std::printf("%s: %s [%s] written to %s\n", op->output.c_str(),
                std::string(kernels::DTypeName(out.dtype)).c_str(),
                absl::StrJoin(out.shape, ",").c_str(), output_path.c_str());
    return 0;
  }
  std::vector<std::string> values;
  for (double v : DecodeValues(out.dtype, out.bytes)) {
    values.push_back(FormatValue(v, out.dtype));
  }
  std::printf("%s = [%s]  (%s, shape [%s])\n", op->output.c_str(),
              absl::StrJoin(values, ", ").c_str(),
              std::string(kernels::DTypeName(out.dtype)).c_str(),
              absl::StrJoin(out.shape, ",").c_str());
  return 0;
}

// A backward step as a training job issues it: 250 dependent operators
// (plan + launch each), one synchronize, pipelined and with unary calls,
// against the round trip of the same connection (a synchronize of an idle
// stream).
int BenchStep(const Connector& connect, int64_t n) {
  constexpr int kOps = 250;
  constexpr int kSteps = 5;
  std::printf("\nbackward step: %d dependent ThresholdBackward on %lld "
              "FLOAT elements, one synchronize (median of %d)\n",
              kOps, static_cast<long long>(n), kSteps);
  std::printf("%-10s %12s %14s %16s\n", "path", "us per op", "round trip us",
              "round trips/op");
  for (bool pipeline : {true, false}) {
    auto connected = connect(pipeline);
    if (!connected.ok()) return Fail(connected.status().message());
    auto session = (*connected)->CreateSession("opctl bench step");
    if (!session.ok()) return FailStatus(session.status());
    Session& s = **session;
    std::vector<float> ones(n, 1.0f);
    auto a = s.Malloc(n * 4);
    auto b = s.Malloc(n * 4);
    if (!a.ok() || !b.ok()) return FailStatus(!a.ok() ? a.status() : b.status());
    for (auto* buffer : {&a, &b}) {
      absl::Status up = s.Upload((*buffer)->handle(), 0, ones.data(), n * 4);
      if (!up.ok()) return FailStatus(up);
    }
    const TensorDesc ta = TensorDesc::Contiguous(a->handle(), DType::kFloat, {n});
    const TensorDesc tb = TensorDesc::Contiguous(b->handle(), DType::kFloat, {n});
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
    std::printf("%-10s %12.1f %14.1f %16.2f%s\n",
                pipeline ? "pipelined" : "unary", op, round_trip,
                op / round_trip,
                pipeline && !s.pipelined() ? "  (server has no Pipeline: unary)"
                                           : "");
  }
  return 0;
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
  for (const auto& [name, used] : args.used) args.flags.erase(name);
  if (!args.flags.empty()) {
    return Fail(absl::StrCat("bench: unknown argument --",
                             args.flags.begin()->first,
                             " (try opctl bench --help)"));
  }
  const int64_t bytes = sizes[0], iterations = sizes[1], n = sizes[2];
  auto connected = connect(true);
  if (!connected.ok()) return Fail(connected.status().message());
  Client& client = **connected;
  auto session = client.CreateSession("opctl bench");
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

  // Operators: plan + launch + synchronize on n FLOAT elements.
  std::vector<float> ones(n, 1.0f);
  auto a = s.Malloc(n * 4);
  auto b = s.Malloc(n * 4);
  auto c = s.Malloc(n * 4);
  const int64_t mask_bytes = (n + 127) / 128 * 16;
  auto mask = s.Malloc(mask_bytes);
  for (auto* r : {&a, &b, &c, &mask}) {
    if (!r->ok()) return FailStatus(r->status());
  }
  std::string mask_host(mask_bytes, '\x55');
  for (auto [buf, data, size] :
       {std::make_tuple(&a, static_cast<const void*>(ones.data()), n * 4),
        std::make_tuple(&b, static_cast<const void*>(ones.data()), n * 4),
        std::make_tuple(&mask, static_cast<const void*>(mask_host.data()),
                        mask_bytes)}) {
    absl::Status status = s.Upload((*buf)->handle(), 0, data, size);
    if (!status.ok()) return FailStatus(status);
  }
  const TensorDesc ta = TensorDesc::Contiguous(a->handle(), DType::kFloat, {n});
  const TensorDesc tb = TensorDesc::Contiguous(b->handle(), DType::kFloat, {n});
  const TensorDesc tc = TensorDesc::Contiguous(c->handle(), DType::kFloat, {n});
  const TensorDesc tm =
      TensorDesc::Contiguous(mask->handle(), DType::kUint8, {mask_bytes});
  std::printf("%-20s %12s %12s  (%lld FLOAT elements, %lld runs)\n", "operator",
              "median us", "min us", static_cast<long long>(n),
              static_cast<long long>(iterations));
  for (const char* op_name :
       {"ThresholdBackward", "SoftshrinkBackward", "HardswishBackward",
        "LeakyReluBackward", "DropoutBackward"}) {
    std::vector<double> times;
    for (int64_t i = 0; i < iterations; ++i) {
      const absl::Time start = absl::Now();
      absl::StatusOr<Executor> executor;
      const std::string op(op_name);
      if (op == "ThresholdBackward") {
        executor = s.ThresholdBackward(ta, tb, 0.5, tc);
      } else if (op == "SoftshrinkBackward") {
        executor = s.SoftshrinkBackward(ta, tb, 0.5, tc);
      } else if (op == "HardswishBackward") {
        executor = s.HardswishBackward(ta, tb, tc);
      } else if (op == "LeakyReluBackward") {
        executor =
            s.LeakyReluBackward(ta, tb, {DType::kFloat, 0.01}, false, tc);
      } else {
        executor = s.DropoutBackward(ta, tm, 2.0, tc);
      }
      if (!executor.ok()) return FailStatus(executor.status());
      absl::Status status = executor->Execute();
      if (status.ok()) status = s.Synchronize();
      if (!status.ok()) return FailStatus(status);
      times.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    }
    std::sort(times.begin(), times.end());
    std::printf("%-20s %12.1f %12.1f\n", op_name, times[times.size() / 2],
                times[0]);
  }
  return BenchStep(connect, n);
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
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
  std::vector<char*> args =
      absl::ParseCommandLine(command_at, argv);  // Exits on --help / bad flag.
  if (args.size() > 1) {
    return Fail(
        absl::StrCat("unexpected argument '", args[1], "' (try --help)"));
  }
  if (command_at >= argc) return Fail("missing COMMAND (try --help)");
  const std::string command = argv[command_at];
  std::vector<std::string> rest(argv + command_at + 1, argv + argc);
  if (command != "info" && command != "ops" && command != "stats" &&
      command != "run" && command != "bench") {
    return Fail(absl::StrCat("unknown command '", command, "' (try --help)"));
  }
  if ((command == "info" || command == "ops" || command == "stats") &&
      !rest.empty()) {
    return Fail(absl::StrCat("unexpected arguments after '", command,
                             "' (try --help)"));
  }
  // Help needs no server.
  if (command == "run" &&
      std::find(rest.begin(), rest.end(), "--help") != rest.end()) {
    std::printf("%s\n", kRunUsage);
    return 0;
  }
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
  const Connector connect = [options](bool pipeline) {
    ConnectOptions chosen = options;
    chosen.pipeline = pipeline;
    return Client::Connect(absl::GetFlag(FLAGS_server), chosen);
  };
  if (command == "run") return Run(connect, rest);
  if (command == "bench") return Bench(connect, rest);
  auto client = connect(true);
  if (!client.ok()) return Fail(client.status().message());
  if (command == "info") return Info(**client);
  if (command == "stats") return Stats(**client);
  return Ops(**client);
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
