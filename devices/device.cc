#include "devices/device.h"

#include <utility>

#include "kernels/tensor.h"

namespace opserver {

DevicePlan::DevicePlan(const Device* device, kernels::ValidCall valid)
    : device_(device),
      valid_(std::move(valid)),
      numel_(kernels::NumElements(valid_.out_shape)) {}

}  // namespace opserver
