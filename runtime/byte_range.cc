#include "runtime/byte_range.h"

#include "absl/strings/str_cat.h"

namespace opserver {

absl::Status CheckRange(uint64_t offset, uint64_t size, uint64_t buffer_size,
                        absl::string_view what) {
  if (offset > buffer_size || size > buffer_size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " [", offset, ", ", offset, " + ", size,
        ") reaches outside the buffer of ", buffer_size, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace opserver
