// Test helper: an aclnn-style program that takes device memory and then
// waits to be killed, so a test can check the server frees what a crashed
// program held (the C API binds its session to an Attach call).
#include <unistd.h>

#include <cstdio>

#include "acl/acl.h"

int main() {
  if (aclInit(nullptr) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS) {
    std::fprintf(stderr, "%s\n", aclGetRecentErrMsg());
    return 1;
  }
  void* p = nullptr;
  if (aclrtMalloc(&p, 8 << 20, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS) {
    std::fprintf(stderr, "%s\n", aclGetRecentErrMsg());
    return 1;
  }
  std::printf("allocated\n");
  std::fflush(stdout);
  for (;;) pause();  // Until SIGKILL.
}
