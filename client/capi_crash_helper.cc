// Test helper: an aclnn-style program that takes device memory and then
// waits to be killed, so a test can check the server frees what a crashed
// program held (the C API binds its session to an Attach call). With
// "busy", it keeps queueing launches on the 8 MiB after that, so it dies
// with the pipelined command window full and the stream's queue long.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "acl/acl.h"
#include "aclnnop/aclnn_hardswish_backward.h"

int main(int argc, char** argv) {
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
  if (argc > 1 && std::strcmp(argv[1], "busy") == 0) {
    int64_t shape[] = {2 << 20};  // 8 MiB of floats, in place.
    aclTensor* t = aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0,
                                   ACL_FORMAT_ND, shape, 1, p);
    for (;;) {  // Until SIGKILL.
      uint64_t ws = 0;
      aclOpExecutor* executor = nullptr;
      if (aclnnHardswishBackwardGetWorkspaceSize(t, t, t, &ws, &executor) !=
              ACLNN_SUCCESS ||
          aclnnHardswishBackward(nullptr, 0, executor, nullptr) !=
              ACLNN_SUCCESS) {
        std::fprintf(stderr, "%s\n", aclGetRecentErrMsg());
        return 1;
      }
    }
  }
  for (;;) pause();  // Until SIGKILL.
}
