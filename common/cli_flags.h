// Command-line parsing shared by the binaries a user runs (opserver,
// opctl): Abseil's flags with the project's exit codes and its own --help
// and --version.
//
//   --help, --helpshort   the usage message and the program's own flags
//                         (those defined in `main_file`), exit 0
//   --helpfull            every flag, Abseil's and gRPC's included, exit 0
//   --version             "<program> <release> (commit <commit>, <mode>
//                         build)", exit 0
//   an unknown flag or a value that does not parse: Abseil's error line and
//   exit status kUsageErrorExit.
#ifndef OPSERVER_COMMON_CLI_FLAGS_H_
#define OPSERVER_COMMON_CLI_FLAGS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace opserver {

// Exit status of a command line that cannot be used (docs/server-flags.md,
// docs/opctl.md).
inline constexpr int kUsageErrorExit = 2;

// The line --version prints, without a newline.
std::string VersionLine(absl::string_view program);

// absl::ParseCommandLine(argc, argv) with the behaviour above: returns the
// positional arguments (argv[0] first) or exits. `main_file` is the path,
// from the repository root, of the file that defines the program's flags
// (e.g. "server/main.cc").
std::vector<char*> ParseFlagsOrExit(int argc, char** argv,
                                    absl::string_view program,
                                    absl::string_view usage,
                                    absl::string_view main_file);

}  // namespace opserver

#endif  // OPSERVER_COMMON_CLI_FLAGS_H_
