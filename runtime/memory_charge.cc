#include "runtime/memory_charge.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace opserver {

absl::Status ReserveSessionBytes(std::atomic<uint64_t>& held, uint64_t limit,
                                 uint64_t bytes, absl::string_view what) {
  uint64_t now = held.load();
  do {
    if (bytes > limit - std::min(limit, now)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no room for ", what, " (", bytes, " bytes): the session holds ",
          now, " of its ", limit,
          " bytes (--session_memory_bytes: buffers, open calls and pending "
          "event operations)"));
    }
  } while (!held.compare_exchange_weak(now, now + bytes));
  return absl::OkStatus();
}

}  // namespace opserver
