#include "client/opctl_command.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/cli_flags.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"

namespace opserver::remote::opctl {

int Fail(absl::string_view message) {
  std::fprintf(stderr, "opctl: %.*s\n", static_cast<int>(message.size()),
               message.data());
  return 1;
}

// A command line opctl cannot use: the same one line, the usage status.
int UsageError(absl::string_view message) {
  Fail(message);
  return kUsageErrorExit;
}

// `status`'s message after `prefix`, with its aclnn status when that says
// more than the message.
int FailStatus(const absl::Status& status, absl::string_view prefix) {
  const int32_t aclnn = kernels::GetAclnnStatus(status);
  std::string message = absl::StrCat(prefix, status.message());
  if (aclnn == kernels::kAclnnErrParamNullptr ||
      aclnn == kernels::kAclnnErrParamInvalid ||
      aclnn == kernels::kAclnnErrInnerNullptr) {
    absl::StrAppend(&message, " (aclnn ", aclnn, ")");
  }
  return Fail(message);
}

absl::StatusOr<CommandArgs> ParseCommandArgs(
    const std::vector<std::string>& args) {
  CommandArgs parsed;
  for (const std::string& arg : args) {
    absl::string_view a = arg;
    if (!absl::ConsumePrefix(&a, "--")) {
      parsed.positional.push_back(arg);
      continue;
    }
    size_t eq = a.find('=');
    std::string name(a.substr(0, eq));
    std::string value =
        eq == absl::string_view::npos ? "true" : std::string(a.substr(eq + 1));
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed argument '", arg, "'"));
    }
    if (parsed.flags.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " given twice"));
    }
    parsed.flags[name] = value;
  }
  return parsed;
}

// The value of a command's --device (0 when absent): the server checks
// it against its devices, and its error names the count.
absl::StatusOr<uint32_t> DeviceArg(CommandArgs& args, absl::string_view cmd) {
  uint32_t device = 0;
  if (const std::string* v = args.Get("device")) {
    if (!absl::SimpleAtoi(*v, &device)) {
      return absl::InvalidArgumentError(
          absl::StrCat(cmd, ": --device=", *v,
                       " must be a device index (opctl info lists them)"));
    }
  }
  return device;
}

bool WantsHelp(const std::vector<std::string>& args) {
  return std::find(args.begin(), args.end(), "--help") != args.end();
}

// Flags of `run` itself, which no operator argument may shadow.
const std::vector<std::string>& RunFlags() {
  static const auto* const flags =
      new std::vector<std::string>{"dtype", "output", "help"};
  return *flags;
}

// The server's operators (ListOperators), checked.
absl::StatusOr<OpCatalog> FetchCatalog(Client& client) {
  ASSIGN_OR_RETURN(v1::ListOperatorsResponse ops, client.ListOperators());
  return ParseCatalog(ops, RunFlags());
}

}  // namespace opserver::remote::opctl
