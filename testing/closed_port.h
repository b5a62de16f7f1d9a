// A loopback port nothing listens on, for tests of refused connections:
// bound to port 0 (so the kernel picks a free one) and closed again.
#ifndef OPSERVER_TESTING_CLOSED_PORT_H_
#define OPSERVER_TESTING_CLOSED_PORT_H_

#include <string>

namespace opserver {

// The port; 0 when no socket could be bound.
int ClosedPort();
// "127.0.0.1:PORT" of ClosedPort().
std::string ClosedPortAddress();

}  // namespace opserver

#endif  // OPSERVER_TESTING_CLOSED_PORT_H_
