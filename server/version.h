#ifndef OPSERVER_SERVER_VERSION_H_
#define OPSERVER_SERVER_VERSION_H_

#include "common/version.h"

namespace opserver {

// Release of this build, reported by GetDeviceInfo and `opctl info`.
inline constexpr const char* kServerVersion = kRelease;
// API package the server speaks.
inline constexpr char kApiVersion[] = "opserver.v1";

}  // namespace opserver

#endif  // OPSERVER_SERVER_VERSION_H_
