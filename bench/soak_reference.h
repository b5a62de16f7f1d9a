// What the soak computes on the host to check the server: the dtypes'
// byte encodings, the operators' names, tensor names and dtypes, and the
// expected result of one element, from the kernels' own formulas.
#ifndef OPSERVER_BENCH_SOAK_REFERENCE_H_
#define OPSERVER_BENCH_SOAK_REFERENCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/op_signatures.h"
#include "proto/opserver.pb.h"

namespace opserver::soak {

using v1::DataType;

// Bytes per element (1 for the dtypes the soak does not compute with).
int DSize(DataType dt);
bool IsIntegral(DataType dt);
void EncodeValue(DataType dt, double v, char* p);
double DecodeValue(DataType dt, const char* p);
// `v` as stored in `dt` and read back.
double RoundTo(DataType dt, double v);
std::string Encode(DataType dt, const std::vector<double>& values);

// The operators, names and tensor names from the signature table
// (kernels/op_signatures.h), in its order: an operator added there is in
// the soak's list too (its Reference and OpDTypes cases say what it
// computes).
#define OPSERVER_SOAK_OP(Name, in0, in1, out, PARAMS) k##Name,
enum Op { OPSERVER_OPERATORS(OPSERVER_SOAK_OP) kNumOps };
#undef OPSERVER_SOAK_OP
extern const char* const kOpNames[kNumOps];
// The second input's name (self, or DropoutBackward's mask) and the
// output's.
const char* SecondName(int op);
const char* OutName(int op);
// The dtypes the soak runs each operator with (gradOutput = self = out).
std::vector<DataType> OpDTypes(int op);

v1::TensorDesc Desc(uint64_t buffer, DataType dt, std::vector<int64_t> shape,
                    std::vector<int64_t> strides = {}, int64_t offset = 0,
                    uint64_t buffer_offset = 0);

// One element of `op`'s output in `dt`: gradOutput `g`, self `x` (or, for
// DropoutBackward, the mask `bit`), computed by the kernels' formulas.
// A random input of `dt`: exactly representable in it, and never on an
// operator's boundary, so every result is checked exactly. `rand(n)` is in
// [0, n).
template <typename Rand>
double InputValue(DataType dt, Rand&& rand) {
  switch (dt) {
    case v1::INT32:
      return static_cast<double>(rand(2001)) - 1000;
    case v1::INT8:
      return static_cast<double>(rand(201)) - 100;
    case v1::UINT8:
      return static_cast<double>(rand(201));
    default:
      return (static_cast<double>(rand(48)) - 24 + 0.5) * 0.25;
  }
}

double Reference(int op, DataType dt, const v1::OpParams& p, double g, double x,
                 bool bit);
// Whether `got` matches `want` within `dt`'s rounding (relative to the
// larger of `want` and the gradient `g`).
bool CloseEnough(DataType dt, double got, double want, double g);

}  // namespace opserver::soak

#endif  // OPSERVER_BENCH_SOAK_REFERENCE_H_
