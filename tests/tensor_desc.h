// Tensor descriptors for tests that call the Operators service directly.
#ifndef OPSERVER_TESTS_TENSOR_DESC_H_
#define OPSERVER_TESTS_TENSOR_DESC_H_

#include <cstdint>
#include <vector>

#include "proto/opserver.pb.h"

namespace opserver {

// A view of `buffer` (offset 0); no strides means contiguous.
inline v1::TensorDesc Desc(uint64_t buffer, v1::DataType dtype,
                           const std::vector<int64_t>& shape,
                           const std::vector<int64_t>& strides = {}) {
  v1::TensorDesc desc;
  desc.set_buffer(buffer);
  desc.set_dtype(dtype);
  for (int64_t d : shape) desc.add_shape(d);
  for (int64_t s : strides) desc.add_strides(s);
  return desc;
}

}  // namespace opserver

#endif  // OPSERVER_TESTS_TENSOR_DESC_H_
