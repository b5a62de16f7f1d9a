#ifndef OPSERVER_RUNTIME_BYTE_RANGE_H_
#define OPSERVER_RUNTIME_BYTE_RANGE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace opserver {

// Checks that [offset, offset + size) lies inside `buffer_size` bytes without
// overflow; INVALID_ARGUMENT naming `what` otherwise.
absl::Status CheckRange(uint64_t offset, uint64_t size, uint64_t buffer_size,
                        absl::string_view what);

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_BYTE_RANGE_H_
