// What opctl's commands share: a failure as one line and its exit
// status, a command's own --name=value arguments, the connection to the
// server of a device, and the server's operators as a checked catalog.
#ifndef OPSERVER_CLIENT_OPCTL_COMMAND_H_
#define OPSERVER_CLIENT_OPCTL_COMMAND_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/client.h"
#include "client/op_catalog.h"

namespace opserver::remote::opctl {

// Prints "opctl: MESSAGE" and returns 1, the status of a failed command.
int Fail(absl::string_view message);

// A command line opctl cannot use: the same one line, the usage status.
int UsageError(absl::string_view message);

// `status`'s message after `prefix`, with its aclnn status when that says
// more than the message.
int FailStatus(const absl::Status& status, absl::string_view prefix = "");

// --name=value arguments of a command; a bare --name means "true".
struct CommandArgs {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
  std::map<std::string, bool> used;

  const std::string* Get(const std::string& name) {
    auto it = flags.find(name);
    if (it == flags.end()) return nullptr;
    used[name] = true;
    return &it->second;
  }
};

// Parses `args`: "--name=value" and "--name" into flags, anything else
// positional; INVALID_ARGUMENT for "--" or "--=x" and for a flag given twice.
absl::StatusOr<CommandArgs> ParseCommandArgs(
    const std::vector<std::string>& args);

// The value of a command's --device (0 when absent): the server checks
// it against its devices, and its error names the count.
absl::StatusOr<uint32_t> DeviceArg(CommandArgs& args, absl::string_view cmd);

// Whether a command's arguments ask for its help.
bool WantsHelp(const std::vector<std::string>& args);

// Flags of `run` itself, which no operator argument may shadow.
const std::vector<std::string>& RunFlags();

// The server's operators (ListOperators), checked.
absl::StatusOr<OpCatalog> FetchCatalog(Client& client);

// A client of the server of --device=`device`, and that device's index
// on it (the same index for one server; for a pool, the ordinal's).
struct Connection {
  std::unique_ptr<Client> client;
  uint32_t device = 0;
};
// Connects with the global flags; `pipeline` = ConnectOptions::pipeline.
using Connector =
    std::function<absl::StatusOr<Connection>(bool pipeline, uint32_t device)>;

}  // namespace opserver::remote::opctl

#endif  // OPSERVER_CLIENT_OPCTL_COMMAND_H_
