// DropoutBackward: out = bit i of mask ? gradOutput * scale : 0. Its
// registry entry, checks, element formula and dtype combinations (see
// kernels/op_spec.h).
#ifndef OPSERVER_KERNELS_OPS_DROPOUT_BACKWARD_H_
#define OPSERVER_KERNELS_OPS_DROPOUT_BACKWARD_H_

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "kernels/op_spec.h"

namespace opserver::kernels {

// kScale mode: g * scale where the mask bit is set, else exactly 0 (a
// select, not a multiply: dropped NaN/Inf become 0). The kZero and kCopy
// modes are whole-tensor fills and copies.
struct DropoutFormula {
  explicit DropoutFormula(const KernelParams& p) : scale(p.scale) {}
  float operator()(float g, bool kept) const { return kept ? g * scale : 0.0f; }
  float scale;
};

struct DropoutBackward : OpDefinition<DropoutBackward> {
  static constexpr std::array<DType, 1> kMaskSet = {DType::kUint8};
  // The result cast to any floating out.
  static constexpr auto kKernels =
      AllDTypes(kHalfFloatSet, kMaskSet, kFloatSet);

  static OpInfo Info() {
    OpInfo info{OpKind::kDropoutBackward,
                "DropoutBackward",
                "aclnnDropoutBackward",
                {{"gradOutput", false, DTypeVector(kHalfFloatSet)},
                 {"mask", false, DTypeVector(kMaskSet)},
                 {"out", true, DTypeVector(kFloatSet)}},
                {{"scale", "double", {}, 2.0}},  // nn.Dropout: p = 0.5.
                "out = bit i of mask (LSB first) ? gradOutput * scale : 0; "
                "mask holds align(numel,128)/8 bytes; scale 0 or >= 1 (1 "
                "copies)"};
    info.bit_mask_input = true;
    return info;
  }

  static absl::Status Check(const OpInfo& info, const OpCall& call,
                            std::vector<int64_t>* out_shape, KernelParams* kp) {
    const Names n(info);
    const TensorView& g = *call.grad_output;
    const TensorView& s = *call.self;
    const TensorView& o = *call.out;
    const double scale = call.params.scale;
    RETURN_IF_ERROR(CheckDType(info, g, n.g, info.tensors[0].dtypes));
    if (s.dtype != DType::kUint8) {
      return ParamInvalid(absl::StrCat(n.s, " has dtype ", DTypeName(s.dtype),
                                       "; it must be UINT8"));
    }
    if (!IsFloating(o.dtype)) {
      return ParamInvalid(absl::StrCat(n.o, " has dtype ", DTypeName(o.dtype),
                                       "; ", n.g, " (", DTypeName(g.dtype),
                                       ") can only be cast to ",
                                       DTypeList(info.tensors[2].dtypes)));
    }
    if (std::isnan(scale) || (scale != 0 && scale < 1)) {
      return ParamInvalid(
          absl::StrCat("scale must be 0 or >= 1 (it is 1/(1-p)), got ", scale));
    }
    const int64_t numel = NumElements(g);
    // align(numel, 128) / 8 without overflowing for numel near 2^63.
    const int64_t need = numel / 128 * 16 + (numel % 128 != 0 ? 16 : 0);
    const int64_t have = NumElements(s);
    if (have != need) {
      return ParamInvalid(absl::StrCat(n.s, " has ", have, " elements; a ", n.g,
                                       " of ", numel, " elements needs align(",
                                       numel, ", 128) / 8 = ", need));
    }
    if (scale == 0) {
      kp->dropout_mode = DropoutMode::kZero;
    } else if (scale == 1) {
      kp->dropout_mode = DropoutMode::kCopy;
    } else {
      kp->dropout_mode = DropoutMode::kScale;
      kp->scale = static_cast<float>(scale);
    }
    *out_shape = g.shape;
    return CheckOutShape(o, n.o, *out_shape, absl::StrCat(n.g, " shape"));
  }

  // A mask that is not contiguous is gathered into the workspace.
  static uint64_t WorkspaceSize(const OpCall& call,
                                const std::vector<int64_t>& out_shape) {
    if (NumElements(out_shape) == 0 || IsContiguous(*call.self)) return 0;
    return static_cast<uint64_t>(NumElements(*call.self));
  }
};

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_OPS_DROPOUT_BACKWARD_H_
