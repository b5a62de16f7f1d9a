#include "devices/ascend/cann_library.h"

#include <dlfcn.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/single_threaded.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "devices/ascend/cann_heap.h"

// ASan, as GCC (__SANITIZE_ADDRESS__) and Clang (--config=fuzz) say it.
#if defined(__SANITIZE_ADDRESS__)
#define OPSERVER_CANN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OPSERVER_CANN_ASAN 1
#endif
#endif
#if defined(OPSERVER_CANN_ASAN)
#include <sanitizer/lsan_interface.h>
#endif

namespace opserver::ascend {

// libcann_heap.so's bytes (cann_heap_so.cc, generated from cann_heap.c).
extern const unsigned char kCannHeapSo[];
extern const size_t kCannHeapSoSize;

namespace {

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// dlerror() without line breaks, so the error stays one line.
std::string LoaderError() {
  const char* error = dlerror();
  std::string text = error != nullptr ? error : "unknown error";
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  return text;
}

// Thread-specific keys across two copies of libc.
//
// The namespace dlmopen makes gets a libc of its own, whose
// pthread_key_create hands out key numbers from its own table, starting at
// 0, as the server's libc does. Both index the same per-thread slots, so a
// key of each libc with the same number would hold both libraries'
// per-thread values: measured with the ASan build of the server, where
// libaclnn_remote.so's Abseil and the server's then aborted with "detected
// illegal recursion into Mutex code". So the numbers are split: the
// namespace's libc is loaded first and its lowest numbers are taken by
// placeholders, which leaves its libraries the numbers from
// kNamespaceFirstKey (or higher, above the server's) up; once they are
// loaded and initialized, the server's libc takes placeholders for those
// numbers and kNamespaceSpareKeys more (keys CANN may create later), so
// that the server's later keys come after them. The first namespace of a
// process (the server makes one) keeps its keys below 32: glibc keeps keys
// 0-31 inside each thread, while a higher key makes the libc that sets it
// allocate a block that the thread's own libc frees at thread exit (both
// from the server's heap since the namespace's malloc is the server's, see
// cann_heap.c, but no block is simpler). Later namespaces (tests load
// several) get higher numbers.
constexpr pthread_key_t kNamespaceFirstKey = 16;
constexpr pthread_key_t kNamespaceSpareKeys = 8;

using KeyCreateFn = int (*)(pthread_key_t*, void (*)(void*));
using KeyDeleteFn = int (*)(pthread_key_t);

// The lowest key number `create` hands out now (taken and given back).
pthread_key_t NextKey(KeyCreateFn create, KeyDeleteFn remove) {
  pthread_key_t key = 0;
  if (create(&key, nullptr) != 0) return PTHREAD_KEYS_MAX;
  remove(key);
  return key;
}

// Takes every key number below `end` that `create` still has free; they
// stay taken for the life of the process.
void TakeKeysBelow(KeyCreateFn create, KeyDeleteFn remove, pthread_key_t end) {
  for (;;) {
    pthread_key_t key = 0;
    if (create(&key, nullptr) != 0) return;
    if (key >= end) {
      remove(key);
      return;
    }
  }
}

// Under ASan, what the namespace allocates is left out of LeakSanitizer's
// check, as it was while the namespace had a heap of its own: LSan knows
// only the threads the server's libc started, so it never scans the stacks
// of CANN's threads and would report what only they hold.
#if defined(OPSERVER_CANN_ASAN)
struct NotLeakChecked {
  NotLeakChecked() { __lsan_disable(); }
  ~NotLeakChecked() { __lsan_enable(); }
};
#else
// Non-trivial, so that the variables below are not "unused".
struct NotLeakChecked {
  NotLeakChecked() {}
  ~NotLeakChecked() {}
};
#endif

void* HeapMalloc(size_t bytes) {
  NotLeakChecked off;
  return malloc(bytes);
}
void HeapFree(void* p) { free(p); }
void* HeapCalloc(size_t n, size_t size) {
  NotLeakChecked off;
  return calloc(n, size);
}
void* HeapRealloc(void* p, size_t bytes) {
  NotLeakChecked off;
  return realloc(p, bytes);
}
void* HeapMemalign(size_t alignment, size_t bytes) {
  NotLeakChecked off;
  return memalign(alignment, bytes);
}
int HeapPosixMemalign(void** p, size_t alignment, size_t bytes) {
  NotLeakChecked off;
  return posix_memalign(p, alignment, bytes);
}
void* HeapAlignedAlloc(size_t alignment, size_t bytes) {
  NotLeakChecked off;
  return aligned_alloc(alignment, bytes);
}
void* HeapValloc(size_t bytes) {
  NotLeakChecked off;
  return valloc(bytes);
}
void* HeapPvalloc(size_t bytes) {
  NotLeakChecked off;
  return pvalloc(bytes);
}
size_t HeapUsableSize(void* p) { return malloc_usable_size(p); }

// The allocator the namespace's malloc (cann_heap.c) goes on to: the
// server's, which the dynamic loader uses too.
constexpr CannHeap kServerHeap = {
    HeapMalloc,   HeapFree,          HeapCalloc,       HeapRealloc,
    HeapMemalign, HeapPosixMemalign, HeapAlignedAlloc, HeapValloc,
    HeapPvalloc,  HeapUsableSize};

// Makes a new link-map namespace whose first object is libcann_heap.so
// (loaded from the bytes in the server, through a memfd), so that its
// malloc leads every lookup in the namespace, and hands it the server's
// allocator. Its handle.
absl::StatusOr<void*> LoadHeap() {
  const int fd = memfd_create("libcann_heap.so", MFD_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  }
  size_t written = 0;
  while (written < kCannHeapSoSize) {
    const ssize_t n =
        write(fd, kCannHeapSo + written, kCannHeapSoSize - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      close(fd);
      return absl::InternalError(
          absl::StrCat("writing libcann_heap.so: ", strerror(error)));
    }
    written += static_cast<size_t>(n);
  }
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  void* heap = dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
  close(fd);  // The mapping stays.
  if (heap == nullptr) return absl::InternalError(LoaderError());
  auto install =
      reinterpret_cast<CannHeapInstallFn>(dlsym(heap, "cann_heap_install"));
  if (install == nullptr) {
    return absl::InternalError("libcann_heap.so has no cann_heap_install");
  }
  install(&kServerHeap);
  return heap;
}

}  // namespace

std::vector<std::string> CannLibrary::DefaultLibraries() {
  return {"libascendcl.so", "libnnopbase.so", "libopapi.so"};
}

std::string CannLibrary::Resolve(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* home = std::getenv("ASCEND_HOME_PATH");
  if (home != nullptr && *home != '\0') {
    std::string candidate = absl::StrCat(home, "/lib64/", name);
    if (IsFile(candidate)) return candidate;
  }
  return name;
}

absl::StatusOr<std::shared_ptr<CannLibrary>> CannLibrary::Load(
    const std::vector<std::string>& libraries) {
  if (libraries.empty()) {
    return absl::FailedPreconditionError("no CANN library to load");
  }
  std::shared_ptr<CannLibrary> library(new CannLibrary());
  // The server's malloc serves the namespace (cann_heap.c), and glibc's
  // malloc takes no lock while its own libc has never started a thread
  // (__libc_single_threaded). Threads the namespace's libc starts do not
  // count: in a process that had none of its own (opserver preflight),
  // CANN's threads and the server's main thread then shared the main heap
  // unlocked, and about one preflight in ten aborted with a corrupted
  // heap. One thread of the server's libc, started and joined, ends the
  // single-threaded mode for good.
  if (__libc_single_threaded) std::thread([] {}).join();
  // The namespace starts with its malloc (cann_heap.c), which brings its
  // libc, alone, so that the thread keys are split (kNamespaceFirstKey)
  // before any library of CANN runs; the libraries then all join it, so
  // that the aclnn libraries bind to that runtime, not to copies of their
  // own, and allocate from the server's heap.
  absl::StatusOr<void*> heap = LoadHeap();
  if (!heap.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make a link-map namespace for CANN: ",
                     heap.status().message()));
  }
  Lmid_t namespace_id = LM_ID_NEWLM;
  void* libc = nullptr;
  if (dlinfo(*heap, RTLD_DI_LMID, &namespace_id) == 0) {
    // Already there, as libcann_heap.so's dependency.
    libc = dlmopen(namespace_id, "libc.so.6", RTLD_NOW | RTLD_LOCAL);
  }
  if (libc == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot make a link-map namespace for CANN: ", LoaderError()));
  }
  const auto namespace_key_create =
      reinterpret_cast<KeyCreateFn>(dlsym(libc, "pthread_key_create"));
  const auto namespace_key_delete =
      reinterpret_cast<KeyDeleteFn>(dlsym(libc, "pthread_key_delete"));
  if (namespace_key_create == nullptr || namespace_key_delete == nullptr) {
    return absl::FailedPreconditionError(
        "the link-map namespace's libc has no pthread_key_create");
  }
  library->namespace_uselocale_ =
      reinterpret_cast<UseLocaleFn>(dlsym(libc, "uselocale"));
  if (library->namespace_uselocale_ == nullptr) {
    return absl::FailedPreconditionError(
        "the link-map namespace's libc has no uselocale");
  }
  // Above the server's keys now, with room for a few more of its own.
  TakeKeysBelow(namespace_key_create, namespace_key_delete,
                std::max<pthread_key_t>(
                    kNamespaceFirstKey,
                    NextKey(&pthread_key_create, &pthread_key_delete) + 4));
  for (const std::string& name : libraries) {
    const std::string path = Resolve(name);
    // RTLD_LOCAL: the symbols are reached through the handles only.
    // RTLD_NOW: a library with an unresolved dependency fails here, at
    // start, not at its first call.
    void* handle = dlmopen(namespace_id, path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot load CANN library ", path, ": ", LoaderError(),
          " (source the set_env.sh of CANN, or name the files with "
          "--cann_libraries)"));
    }
    library->paths_.push_back(path);
    library->handles_.push_back(handle);
  }

  CannApi& api = library->api_;
  std::string missing;
  auto required = [&](auto& function, const char* symbol) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(
        library->Lookup(symbol));
    if (function == nullptr && missing.empty()) missing = symbol;
  };
  auto optional = [&](auto& function, const char* symbol) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(
        library->Lookup(symbol));
  };
#define OPSERVER_REQUIRED(name) required(api.name, #name)
  OPSERVER_REQUIRED(aclInit);
  OPSERVER_REQUIRED(aclFinalize);
  OPSERVER_REQUIRED(aclGetRecentErrMsg);
  OPSERVER_REQUIRED(aclrtSetDevice);
  OPSERVER_REQUIRED(aclrtResetDevice);
  OPSERVER_REQUIRED(aclrtGetDeviceCount);
  OPSERVER_REQUIRED(aclrtGetMemInfo);
  OPSERVER_REQUIRED(aclrtGetSocName);
  OPSERVER_REQUIRED(aclrtMalloc);
  OPSERVER_REQUIRED(aclrtFree);
  OPSERVER_REQUIRED(aclrtMemcpy);
  OPSERVER_REQUIRED(aclrtMemcpyAsync);
  OPSERVER_REQUIRED(aclrtMallocHost);
  OPSERVER_REQUIRED(aclrtFreeHost);
  OPSERVER_REQUIRED(aclrtCreateStream);
  OPSERVER_REQUIRED(aclrtDestroyStream);
  OPSERVER_REQUIRED(aclrtSynchronizeStream);
  OPSERVER_REQUIRED(aclCreateTensor);
  OPSERVER_REQUIRED(aclDestroyTensor);
  OPSERVER_REQUIRED(aclCreateScalar);
  OPSERVER_REQUIRED(aclDestroyScalar);
  OPSERVER_REQUIRED(aclSetAclOpExecutorRepeatable);
  OPSERVER_REQUIRED(aclDestroyAclOpExecutor);
#undef OPSERVER_REQUIRED
  if (!missing.empty()) {
    api.aclFinalize = nullptr;  // aclInit was not called.
    return absl::FailedPreconditionError(
        absl::StrCat("CANN symbol ", missing, " is in none of ",
                     absl::StrJoin(library->paths_, ", ")));
  }
  optional(api.aclrtCreateContext, "aclrtCreateContext");
  optional(api.aclrtDestroyContext, "aclrtDestroyContext");
  optional(api.aclrtSetCurrentContext, "aclrtSetCurrentContext");
  if (api.aclrtCreateContext == nullptr || api.aclrtDestroyContext == nullptr ||
      api.aclrtSetCurrentContext == nullptr) {
    api.aclrtCreateContext = nullptr;
    api.aclrtDestroyContext = nullptr;
    api.aclrtSetCurrentContext = nullptr;
  }
  optional(api.aclrtMemset, "aclrtMemset");
  optional(api.aclrtMemsetAsync, "aclrtMemsetAsync");
  if (api.aclrtMemset == nullptr || api.aclrtMemsetAsync == nullptr) {
    api.aclrtMemset = nullptr;
    api.aclrtMemsetAsync = nullptr;
  }
  optional(api.aclmdlRICaptureBegin, "aclmdlRICaptureBegin");
  optional(api.aclmdlRICaptureEnd, "aclmdlRICaptureEnd");
  optional(api.aclmdlRIExecuteAsync, "aclmdlRIExecuteAsync");
  optional(api.aclmdlRIDestroy, "aclmdlRIDestroy");
  if (api.aclmdlRICaptureBegin == nullptr ||
      api.aclmdlRICaptureEnd == nullptr ||
      api.aclmdlRIExecuteAsync == nullptr || api.aclmdlRIDestroy == nullptr) {
    api.aclmdlRICaptureBegin = nullptr;
    api.aclmdlRICaptureEnd = nullptr;
    api.aclmdlRIExecuteAsync = nullptr;
    api.aclmdlRIDestroy = nullptr;
  }
  // Operators: both halves or neither.
  int index = 0;
#define OPSERVER_RESOLVE_OP(Name)                                              \
  {                                                                            \
    CannApi::OpFunctions& op = api.ops[index++];                               \
    op.get_workspace_size = library->Lookup("aclnn" #Name "GetWorkspaceSize"); \
    op.launch = library->Lookup("aclnn" #Name);                                \
    if (op.get_workspace_size == nullptr || op.launch == nullptr) op = {};     \
  }
  OPSERVER_OPS(OPSERVER_RESOLVE_OP)
#undef OPSERVER_RESOLVE_OP

  if (aclError error = api.aclInit(nullptr); error != ACL_SUCCESS) {
    library->api_.aclFinalize = nullptr;  // Nothing to finalize.
    return absl::FailedPreconditionError(absl::StrCat(
        "aclInit failed with error ", error, ": ", library->RecentError()));
  }
  // The server's later keys come after the namespace's and its spares.
  TakeKeysBelow(&pthread_key_create, &pthread_key_delete,
                NextKey(namespace_key_create, namespace_key_delete) +
                    kNamespaceSpareKeys);
  return library;
}

CannLibrary::~CannLibrary() {
  if (api_.aclFinalize != nullptr) api().aclFinalize();
}

void* CannLibrary::Lookup(const char* symbol) const {
  for (void* handle : handles_) {
    if (void* address = dlsym(handle, symbol); address != nullptr) {
      return address;
    }
  }
  return nullptr;
}

void CannLibrary::EnterOnThisThread() const {
  // Namespaces are never unloaded, so their uselocale names them; a
  // process has a few at most (tests load several).
  thread_local std::vector<UseLocaleFn> entered;
  if (std::find(entered.begin(), entered.end(), namespace_uselocale_) !=
      entered.end()) {
    return;
  }
  namespace_uselocale_(LC_GLOBAL_LOCALE);
  entered.push_back(namespace_uselocale_);
}

std::string CannLibrary::RecentError() const {
  const char* message = api_.aclGetRecentErrMsg != nullptr
                            ? api().aclGetRecentErrMsg()
                            : nullptr;
  return message != nullptr ? message : "";
}

}  // namespace opserver::ascend
