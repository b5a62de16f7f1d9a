#include "client/opctl_run.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/host_tensor.h"
#include "common/status_macros.h"
#include "kernels/dtype.h"

namespace opserver::remote::opctl {
namespace {

using kernels::DType;

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

}  // namespace

int Run(const Connector& connect, const std::vector<std::string>& raw) {
  if (WantsHelp(raw)) {
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

}  // namespace opserver::remote::opctl
