// The operators a server offers, as ListOperators describes them, checked
// once so that tools (opctl run and bench) can build any operator's call
// from them instead of a table of their own: tensor arguments by role,
// dtypes, and parameters with their OpParams field, type and default.
//
//   auto ops = client.ListOperators();
//   OpCatalog catalog = ParseCatalog(*ops);
//   const OpSignature* op = catalog.Find("thresholdbackward");
//   v1::OpParams params;
//   for (const ParamSignature& p : op->params) {
//     SetParam(p, *p.default_value, p.default_dtype(), &params);
//   }
//
// Everything in a ListOperatorsResponse is the server's word and may be
// malformed: an entry that is unusable is left out of `ops` and explained
// in `rejected`, never trusted.
#ifndef OPSERVER_CLIENT_OP_CATALOG_H_
#define OPSERVER_CLIENT_OP_CATALOG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "kernels/dtype.h"
#include "proto/opserver.pb.h"

namespace opserver::remote {

// One tensor argument: its name (a flag of opctl run) and its dtypes.
struct TensorSignature {
  std::string name;
  std::vector<kernels::DType> dtypes;  // Never empty.
};

// One parameter: the OpParams field it sets and how.
struct ParamSignature {
  std::string name;  // aclnn name, e.g. "negativeSlope" (opctl's flag).
  // The v1::OpParams field, of a C++ type that matches `type`.
  const google::protobuf::FieldDescriptor* field = nullptr;
  std::string type;                     // "float", "double", "bool", "scalar"
  std::optional<double> default_value;  // Finite; 0 or 1 for "bool".
  std::vector<kernels::DType> dtypes;   // "scalar" only; never empty there.

  // The dtype a "scalar" has unless the caller chooses: the server's first.
  kernels::DType default_dtype() const {
    return dtypes.empty() ? kernels::DType::kFloat : dtypes.front();
  }
};

// One operator, with at least one input and exactly one output, and no two
// of its flags (names, NAME_shape of inputs, NAME_dtype of tensors and
// "scalar" parameters) alike or equal to one of `reserved_flags`.
struct OpSignature {
  std::string name;        // "ThresholdBackward"
  std::string aclnn_name;  // "aclnnThresholdBackward"
  std::vector<TensorSignature> inputs;
  TensorSignature output;
  std::vector<ParamSignature> params;
};

struct OpCatalog {
  std::vector<OpSignature> ops;  // The usable entries, in the server's order.
  // One line per entry left out, naming it and what is wrong.
  std::vector<std::string> rejected;

  // By name or aclnn name, ignoring case; nullptr when not offered.
  const OpSignature* Find(absl::string_view name) const;
  // "ThresholdBackward, SoftshrinkBackward, ..." (or "none").
  std::string Names() const;
};

// Checks every entry of `response`. Names must be identifiers of at most 64
// characters that do not collide with `reserved_flags` (the caller's own
// flags, e.g. "dtype").
OpCatalog ParseCatalog(const v1::ListOperatorsResponse& response,
                       const std::vector<std::string>& reserved_flags = {});

// Sets `param` in `params`: a bool is `value` != 0; a "scalar" gets `dtype`
// (ignored otherwise).
void SetParam(const ParamSignature& param, double value, kernels::DType dtype,
              v1::OpParams* params);

// An input's dtype and shape, for OutputShape.
struct ArgShape {
  kernels::DType dtype = kernels::DType::kFloat;
  std::vector<int64_t> shape;
};

// The shape the output of `op` must have for these inputs (by name) and
// parameters: the first of {the inputs' broadcast shape, each input's
// shape} that this client's kernels::Validate accepts. When none is, the
// error is Validate's verdict on the first (the server's own words, with
// the aclnn status). An operator this client's kernels do not know gets the
// first candidate unchecked; the server then has the last word.
absl::StatusOr<std::vector<int64_t>> OutputShape(
    const OpSignature& op, const v1::OpParams& params,
    const std::map<std::string, ArgShape>& inputs, kernels::DType out_dtype);

}  // namespace opserver::remote

#endif  // OPSERVER_CLIENT_OP_CATALOG_H_
