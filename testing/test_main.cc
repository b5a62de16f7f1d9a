#include "testing/test_main.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace opserver::test_main {

int RunWithPaths(int argc, char** argv, std::initializer_list<PathArg> paths) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != static_cast<int>(paths.size()) + 1) {
    std::string usage = absl::StrCat("usage: ", argv[0]);
    for (const PathArg& arg : paths) absl::StrAppend(&usage, " ", arg.name);
    std::fprintf(stderr, "%s\n", usage.c_str());
    return 2;
  }
  char** next = argv + 1;
  for (const PathArg& arg : paths) *arg.path = *next++;
  return RUN_ALL_TESTS();
}

}  // namespace opserver::test_main
