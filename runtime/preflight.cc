#include "runtime/preflight.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/op_call.h"
#include "kernels/validate.h"
#include "runtime/executor.h"

namespace opserver {
namespace {

// Eight values across the operators' boundaries (threshold 1, lambd 0.5,
// Hardswish's -3 and 3, zero and both signs for LeakyRelu).
constexpr double kValues[] = {-4.0, -1.5, -0.25, 0.0, 0.25, 1.0, 2.5, 6.0};
constexpr int64_t kElements = sizeof(kValues) / sizeof(kValues[0]);

// Enough for any scalar parameter Evaluate reads: a double value.
constexpr uint32_t kMaxValues = 1024;

// The value a parameter gets: its advertised default, else one of its type.
double ParamValue(const kernels::ScalarArgInfo& arg) {
  if (arg.default_value.has_value()) return *arg.default_value;
  if (arg.type == "bool") return 0;
  return 1.0;
}

void SetParam(const kernels::ScalarArgInfo& arg, v1::OpParams* params) {
  const google::protobuf::FieldDescriptor* field =
      params->GetDescriptor()->FindFieldByCamelcaseName(std::string(arg.name));
  if (field == nullptr) return;  // Evaluate reports the missing argument.
  SetOpParamField(*field, ParamValue(arg),
                  arg.dtypes.empty() ? kernels::DType::kFloat : arg.dtypes[0],
                  params);
}

v1::ValueTensor FloatTensor(bool with_values) {
  v1::ValueTensor t;
  t.set_dtype(v1::FLOAT);
  t.add_shape(kElements);
  if (with_values) {
    for (double v : kValues) t.add_values(v);
  }
  return t;
}

// A DropoutBackward mask for kElements: bytes for 128 elements (the mask's
// alignment), a pattern that keeps some elements and drops others.
v1::ValueTensor MaskTensor(const kernels::TensorArgInfo& arg) {
  v1::ValueTensor t;
  t.set_dtype(static_cast<v1::DataType>(arg.dtypes[0]));
  constexpr int64_t kBytes = 128 / 8;
  t.add_shape(kBytes);
  for (int64_t i = 0; i < kBytes; ++i) t.add_values((0xA5 + 37 * i) & 0xff);
  return t;
}

v1::EvaluateRequest RequestFor(const kernels::OpInfo& op) {
  v1::EvaluateRequest request;
  request.set_op(std::string(op.name));
  int input = 0;
  for (const kernels::TensorArgInfo& arg : op.tensors) {
    if (arg.is_output) {
      *request.mutable_output() = FloatTensor(/*with_values=*/false);
      continue;
    }
    const bool mask = op.bit_mask_input && input == 1;
    (*request.mutable_inputs())[std::string(arg.name)] =
        mask ? MaskTensor(arg) : FloatTensor(/*with_values=*/true);
    ++input;
  }
  for (const kernels::ScalarArgInfo& arg : op.scalars) {
    SetParam(arg, request.mutable_params());
  }
  return request;
}

std::string Describe(int index, const Device& device) {
  const DeviceDescription d = device.Describe();
  return absl::StrFormat("device %d: %s (%s), %.1f GiB, %.1f GiB free", index,
                         d.kind, d.name,
                         static_cast<double>(d.memory_bytes) / (1ull << 30),
                         static_cast<double>(device.FreeBytes()) / (1ull << 30));
}

}  // namespace

std::vector<v1::EvaluateRequest> PreflightRequests() {
  std::vector<v1::EvaluateRequest> requests;
  for (const kernels::OpInfo& op : kernels::OpRegistry()) {
    requests.push_back(RequestFor(op));
  }
  return requests;
}

std::string CompareOutputs(const v1::ValueTensor& got,
                           const v1::ValueTensor& want) {
  if (got.dtype() != want.dtype()) {
    return absl::StrCat("dtype ", got.dtype(), ", want ", want.dtype());
  }
  if (got.shape_size() != want.shape_size() ||
      !std::equal(got.shape().begin(), got.shape().end(),
                  want.shape().begin())) {
    return "the output shape differs";
  }
  if (got.values_size() != want.values_size()) {
    return absl::StrCat(got.values_size(), " values, want ",
                        want.values_size());
  }
  for (int i = 0; i < got.values_size(); ++i) {
    const double a = got.values(i);
    const double b = want.values(i);
    const bool same = (std::isnan(a) && std::isnan(b)) ||
                      std::memcmp(&a, &b, sizeof(a)) == 0;
    if (!same) {
      return absl::StrCat("element ", i, " is ", a, ", the CPU device's ", b);
    }
  }
  return "";
}

bool RunPreflight(const std::vector<Device*>& devices, Device& reference,
                  std::ostream& out) {
  for (size_t i = 0; i < devices.size(); ++i) {
    out << Describe(static_cast<int>(i), *devices[i]) << "\n";
  }
  const std::vector<v1::EvaluateRequest> requests = PreflightRequests();
  int failed = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    for (const v1::EvaluateRequest& request : requests) {
      absl::StatusOr<v1::ValueTensor> want =
          RunEvaluate(request, &reference, kMaxValues);
      absl::StatusOr<v1::ValueTensor> got =
          RunEvaluate(request, devices[i], kMaxValues);
      std::string verdict = "ok";
      if (!want.ok()) {
        verdict = absl::StrCat("ERROR on the CPU device: ",
                               want.status().ToString());
      } else if (!got.ok()) {
        verdict = absl::StrCat("ERROR: ", got.status().ToString());
      } else if (std::string diff = CompareOutputs(*got, *want);
                 !diff.empty()) {
        verdict = absl::StrCat("MISMATCH: ", diff);
      }
      if (verdict != "ok") ++failed;
      out << "device " << i << " " << request.op() << ": " << verdict << "\n";
    }
  }
  const size_t total = devices.size() * requests.size();
  out << (failed == 0 ? "preflight passed: " : "preflight FAILED: ")
      << total - failed << " of " << total << " operator runs matched the CPU "
      << "device\n";
  return failed == 0;
}

}  // namespace opserver
