// CannLibrary::Load in a process whose C library has started no thread of
// its own yet, as `opserver preflight` is: a binary of its own, since any
// earlier test of the same process would have started threads.
//
// The server's malloc serves CANN's namespace too (cann_heap.c), and glibc's
// malloc skips its locks while __libc_single_threaded is set, which only
// the same libc's pthread_create clears. CANN's threads are the namespace
// libc's, so without Load's own thread they and the main thread shared the
// heap unlocked: the chain's preflight aborted with a corrupted heap in
// about one run in ten.

#include <sys/single_threaded.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "devices/ascend/cann_library.h"
#include "gtest/gtest.h"

namespace opserver::ascend {
namespace {

// Read in main, before gtest or anything else can start a thread.
bool g_single_threaded_at_start = false;

TEST(CannLibraryThreadsTest, LoadLeavesTheServersMallocLocking) {
  ASSERT_TRUE(g_single_threaded_at_start)
      << "the test needs a process that has started no thread yet";
  ASSERT_TRUE(__libc_single_threaded);
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  auto cann = CannLibrary::Load(
      {std::string(cwd) + "/devices/ascend/libfake_cann.so"});
  ASSERT_TRUE(cann.ok()) << cann.status();
  EXPECT_FALSE(__libc_single_threaded);
}

}  // namespace
}  // namespace opserver::ascend

int main(int argc, char** argv) {
  opserver::ascend::g_single_threaded_at_start = __libc_single_threaded;
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
