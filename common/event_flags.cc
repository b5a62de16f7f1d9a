#include "common/event_flags.h"

#include "absl/strings/str_cat.h"

namespace opserver {

absl::Status CheckEventFlags(uint32_t flags) {
  if ((flags & ~kKnownEventFlags) == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "event flags 0x", absl::Hex(flags), " have unknown bits 0x",
      absl::Hex(flags & ~kKnownEventFlags),
      " (known: ACL_EVENT_SYNC 0x1, ACL_EVENT_CAPTURE_STREAM_PROGRESS 0x2, "
      "ACL_EVENT_TIME_LINE 0x8, ACL_EVENT_EXTERNAL 0x20, ACL_EVENT_IPC "
      "0x40)"));
}

}  // namespace opserver
