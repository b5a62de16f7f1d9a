#ifndef OPSERVER_COMMON_EVENT_FLAGS_H_
#define OPSERVER_COMMON_EVENT_FLAGS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace opserver {

// aclrtCreateEventWithFlag's flags, as CANN numbers them. The server
// refuses unknown bits; the clients check the same rule first so the error
// is immediate (a pipelined CreateEvent would otherwise fail later).
inline constexpr uint32_t kEventSync = 0x1;
inline constexpr uint32_t kEventCaptureStreamProgress = 0x2;
inline constexpr uint32_t kEventTimeLine = 0x8;
inline constexpr uint32_t kEventExternal = 0x20;
inline constexpr uint32_t kEventIpc = 0x40;
inline constexpr uint32_t kKnownEventFlags =
    kEventSync | kEventCaptureStreamProgress | kEventTimeLine | kEventExternal |
    kEventIpc;

// INVALID_ARGUMENT naming the bits when `flags` has any CANN does not
// define.
absl::Status CheckEventFlags(uint32_t flags);

}  // namespace opserver

#endif  // OPSERVER_COMMON_EVENT_FLAGS_H_
