// A server's ListOperators answer as opctl reads it (client/op_catalog): the
// input is parsed as a ListOperatorsResponse, every entry checked by
// ParseCatalog, and each usable operator gets the call opctl run would
// build (parameters at their defaults, every input of shape [3]) whose
// output shape OutputShape asks of the client's kernels::Validate. A server
// is not trusted by its clients: nothing it lists may crash one.
//
// Invariants besides memory safety: every entry is usable or rejected, not
// both; a usable operator has inputs, an output and dtypes for each, a
// parameter has its OpParams field, and Find finds it by name.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "client/op_catalog.h"
#include "fuzz/fuzz_support.h"
#include "proto/opserver.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace opserver;
  using namespace opserver::remote;
  fuzz::QuietProtobuf();
  v1::ListOperatorsResponse response;
  if (!response.ParseFromArray(data, static_cast<int>(size))) return 0;
  const OpCatalog catalog = ParseCatalog(response, {"dtype", "output", "help"});
  FUZZ_CHECK(catalog.ops.size() + catalog.rejected.size() ==
                 static_cast<size_t>(response.operators_size()),
             catalog.ops.size(), " usable + ", catalog.rejected.size(),
             " rejected of ", response.operators_size());
  for (const OpSignature& op : catalog.ops) {
    FUZZ_CHECK(!op.inputs.empty() && !op.output.dtypes.empty(), op.name);
    FUZZ_CHECK(catalog.Find(op.name) != nullptr, op.name);
    v1::OpParams params;
    for (const ParamSignature& p : op.params) {
      FUZZ_CHECK(p.field != nullptr, op.name, " ", p.name);
      SetParam(p, p.default_value.value_or(1), p.default_dtype(), &params);
    }
    std::map<std::string, ArgShape> inputs;
    for (const TensorSignature& t : op.inputs) {
      FUZZ_CHECK(!t.dtypes.empty(), op.name, " ", t.name);
      inputs[t.name] = ArgShape{t.dtypes.front(), {3}};
    }
    absl::StatusOr<std::vector<int64_t>> shape =
        OutputShape(op, params, inputs, op.output.dtypes.front());
    fuzz::Report(op.name, shape.status());
  }
  fuzz::Report(catalog.Names(), absl::OkStatus());
  return 0;
}
