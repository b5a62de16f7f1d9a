// The main() of a test that runs binaries of the build, which its BUILD
// rule passes as arguments (args = ["$(rootpath //server:opserver)", ...]):
//
//   std::string g_opserver;
//   int main(int argc, char** argv) {
//     return opserver::test_main::RunWithPaths(argc, argv,
//                                              {{"OPSERVER", &g_opserver}});
//   }
#ifndef OPSERVER_TESTING_TEST_MAIN_H_
#define OPSERVER_TESTING_TEST_MAIN_H_

#include <initializer_list>
#include <string>

namespace opserver::test_main {

// One path argument: its name in the usage line, and where it goes.
struct PathArg {
  const char* name;
  std::string* path;
};

// Initializes gtest (which takes its own flags out), stores exactly one
// argument per entry of `paths`, in order, and runs every test. With any
// other count: a usage line naming them on stderr, and 2.
int RunWithPaths(int argc, char** argv, std::initializer_list<PathArg> paths);

}  // namespace opserver::test_main

#endif  // OPSERVER_TESTING_TEST_MAIN_H_
