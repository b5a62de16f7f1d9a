// The operators against reference data produced by PyTorch
// (devices/cpu/testdata/torch_reference.txt, written by
// scripts/gen_torch_refs.py from Debian's python3-torch; the script explains
// which cases PyTorch shares with the spec).

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "devices/cpu/plan.h"
#include "gtest/gtest.h"
#include "kernels/half.h"

namespace opserver::kernels {
namespace {

using cpu::Plan;
using cpu::PrepareOp;
using cpu::RunPlan;

struct Case {
  std::string op, dtype;
  double param = 0;
  int64_t n = 0;
  std::vector<double> grad, self, out;
  std::vector<uint8_t> mask;
};

std::vector<double> ReadValues(std::istringstream& line) {
  std::vector<double> v;
  std::string word;
  while (line >> word) v.push_back(std::stod(word));
  return v;
}

std::vector<Case> LoadCases() {
  std::ifstream file("devices/cpu/testdata/torch_reference.txt");
  EXPECT_TRUE(file.good()) << "reference data missing";
  std::vector<Case> cases;
  std::string text;
  while (std::getline(file, text)) {
    std::istringstream line(text);
    std::string key;
    line >> key;
    if (key == "case") {
      cases.emplace_back();
      line >> cases.back().op >> cases.back().dtype >> cases.back().param >>
          cases.back().n;
    } else if (key == "grad") {
      cases.back().grad = ReadValues(line);
    } else if (key == "self") {
      cases.back().self = ReadValues(line);
    } else if (key == "out") {
      cases.back().out = ReadValues(line);
    } else if (key == "mask") {
      for (double b : ReadValues(line)) {
        cases.back().mask.push_back(static_cast<uint8_t>(b));
      }
    }
  }
  return cases;
}

DType ParseDType(const std::string& name) {
  if (name == "FLOAT16") return DType::kFloat16;
  if (name == "BFLOAT16") return DType::kBFloat16;
  return DType::kFloat;
}

std::vector<char> Encode(DType dtype, const std::vector<double>& values) {
  std::vector<char> bytes(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    if (dtype == DType::kFloat) {
      std::memcpy(&bytes[i * 4], &f, 4);
    } else {
      uint16_t h =
          dtype == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  return bytes;
}

double Decode(DType dtype, const char* p) {
  if (dtype == DType::kFloat) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
}

TensorView View(DType dtype, int64_t n, void* data) {
  TensorView v;
  v.dtype = dtype;
  v.shape = {n};
  v.data = data;
  return v;
}

TEST(TorchReference, EveryCaseMatchesPyTorch) {
  std::vector<Case> cases = LoadCases();
  ASSERT_GT(cases.size(), 100u);
  int checked = 0;
  for (const Case& c : cases) {
    const DType dtype = ParseDType(c.dtype);
    const OpInfo* info = FindOp(c.op);
    ASSERT_NE(info, nullptr) << c.op;
    std::vector<char> grad = Encode(dtype, c.grad);
    std::vector<char> self =
        c.op == "DropoutBackward"
            ? std::vector<char>(c.mask.begin(), c.mask.end())
            : Encode(dtype, c.self);
    std::vector<char> out(c.n * DTypeSize(dtype));
    OpCall call;
    call.op = info->kind;
    call.grad_output = View(dtype, c.n, grad.data());
    call.self = c.op == "DropoutBackward"
                    ? View(DType::kUint8, static_cast<int64_t>(c.mask.size()),
                           self.data())
                    : View(dtype, c.n, self.data());
    call.out = View(dtype, c.n, out.data());
    call.params.threshold = c.param;
    call.params.lambd = c.param;
    call.params.negative_slope = Scalar::Float(c.param);
    call.params.scale = c.param;
    absl::StatusOr<Plan> plan = PrepareOp(call);
    ASSERT_TRUE(plan.ok()) << c.op << " " << c.dtype << ": " << plan.status();
    ASSERT_TRUE(RunPlan(*plan, nullptr, 0, nullptr).ok());
    int mismatches = 0;
    for (int64_t i = 0; i < c.n && mismatches < 3; ++i) {
      const double actual = Decode(dtype, &out[i * DTypeSize(dtype)]);
      const double expected = c.out[i];
      const bool same =
          (std::isnan(actual) && std::isnan(expected)) || actual == expected;
      if (!same) {
        ADD_FAILURE() << c.op << " " << c.dtype << " param " << c.param
                      << " n=" << c.n << " element " << i << ": got " << actual
                      << ", PyTorch " << expected;
        ++mismatches;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cases.size()));
}

}  // namespace
}  // namespace opserver::kernels
