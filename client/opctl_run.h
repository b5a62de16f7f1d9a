// opctl run: one call of any operator the server offers, built from what
// ListOperators says about it, on values from the command line or .npy
// files, its output printed or written as .npy.
#ifndef OPSERVER_CLIENT_OPCTL_RUN_H_
#define OPSERVER_CLIENT_OPCTL_RUN_H_

#include <string>
#include <vector>

#include "client/opctl_command.h"

namespace opserver::remote::opctl {

// `opctl run OP --INPUT=... [--PARAM=...]` (`raw`: what follows "run");
// --help prints the usage and the server's operators. Every error is one
// line and exit status 1.
int Run(const Connector& connect, const std::vector<std::string>& raw);

}  // namespace opserver::remote::opctl

#endif  // OPSERVER_CLIENT_OPCTL_RUN_H_
