#include "common/cli_flags.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/build_commit.h"
#include "common/version.h"

namespace opserver {
namespace {

// Set while Abseil parses the command line. Abseil (Debian's 20220623)
// reports a bad flag and calls std::exit(1) with no hook to change the
// status; this exit handler turns that exit into the documented usage
// error status. Usage flags are handled after parsing (kIgnoreUsage), so
// the only exit inside the parse is the error one.
std::atomic<bool> parsing{false};

void ExitParseErrorAsUsageError() {
  if (!parsing.load()) return;
  std::cout.flush();
  std::fflush(nullptr);
  std::_Exit(kUsageErrorExit);
}

}  // namespace

std::string VersionLine(absl::string_view program) {
  return absl::StrCat(program, " ", kRelease, " (commit ", BuildCommit(), ", ",
                      BuildMode(), " build)");
}

std::vector<char*> ParseFlagsOrExit(int argc, char** argv,
                                    absl::string_view program,
                                    absl::string_view usage,
                                    absl::string_view main_file) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  // Abseil's default shows the flags of a file named after the binary
  // (opserver.cc), which no binary here has: --help then listed nothing.
  auto own_flags = [file = std::string(main_file)](absl::string_view path) {
    return absl::EndsWith(path, file);
  };
  config.contains_help_flags = own_flags;
  config.contains_helpshort_flags = own_flags;
  config.version_string = [line = VersionLine(program)] {
    return absl::StrCat(line, "\n");
  };
  absl::SetFlagsUsageConfig(config);
  static const bool registered = std::atexit(ExitParseErrorAsUsageError) == 0;
  (void)registered;
  parsing.store(true);
  std::vector<char*> args = absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  parsing.store(false);
  // -1: no usage flag given; otherwise help or version was printed, which
  // is a success (Abseil's own handling exits 1 after --help).
  if (absl::flags_internal::HandleUsageFlags(
          std::cout, absl::ProgramUsageMessage()) != -1) {
    std::cout.flush();
    std::exit(0);
  }
  return args;
}

}  // namespace opserver
