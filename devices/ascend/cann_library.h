// CANN's runtime and aclnn libraries, loaded at run time into a link-map
// namespace of their own.
//
// CANN's libraries (and opserver's own libaclnn_remote.so, which implements
// the same ABI as a client of another opserver) bring their own gRPC,
// protobuf and Abseil. Loaded with a plain dlopen they would share the
// server's copies, and protobuf aborts when a second set of generated
// messages registers with the one GeneratedDatabase
// (`CHECK failed: GeneratedDatabase()->Add`). dlmopen(LM_ID_NEWLM) gives
// them a namespace where every dependency is loaded afresh, so nothing they
// use can clash with the server's. The one thing the namespace shares is
// the heap: its malloc is the server's (cann_heap.c says why).
//
//   absl::StatusOr<std::shared_ptr<CannLibrary>> cann =
//       CannLibrary::Load(CannLibrary::DefaultLibraries());
//   if (!cann.ok()) { ... one line naming the library or symbol ... }
//   (*cann)->api().aclrtMalloc(&ptr, size, ACL_MEM_MALLOC_HUGE_FIRST);
#ifndef OPSERVER_DEVICES_ASCEND_CANN_LIBRARY_H_
#define OPSERVER_DEVICES_ASCEND_CANN_LIBRARY_H_

#include <locale.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_dropout_backward.h"
#include "aclnnop/aclnn_hardswish_backward.h"
#include "aclnnop/aclnn_leaky_relu_backward.h"
#include "aclnnop/aclnn_softshrink_backward.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "kernels/op_kind.h"

namespace opserver::ascend {

// The number of operators (kernels/op_kind.h), indexing CannApi::ops.
#define OPSERVER_ASCEND_COUNT_OP(Name) +1
inline constexpr int kOpCount = 0 OPSERVER_OPS(OPSERVER_ASCEND_COUNT_OP);
#undef OPSERVER_ASCEND_COUNT_OP

// Every CANN function the Ascend device calls, resolved by Load. The
// required ones are never null. The groups marked optional may be null:
// AscendDevice says what it does instead.
struct CannApi {
  // acl/acl.h
  decltype(&::aclInit) aclInit = nullptr;
  decltype(&::aclFinalize) aclFinalize = nullptr;
  decltype(&::aclGetRecentErrMsg) aclGetRecentErrMsg = nullptr;
  // acl/acl_rt.h
  decltype(&::aclrtSetDevice) aclrtSetDevice = nullptr;
  decltype(&::aclrtResetDevice) aclrtResetDevice = nullptr;
  decltype(&::aclrtGetDeviceCount) aclrtGetDeviceCount = nullptr;
  decltype(&::aclrtGetMemInfo) aclrtGetMemInfo = nullptr;
  decltype(&::aclrtGetSocName) aclrtGetSocName = nullptr;
  decltype(&::aclrtMalloc) aclrtMalloc = nullptr;
  decltype(&::aclrtFree) aclrtFree = nullptr;
  decltype(&::aclrtMemcpy) aclrtMemcpy = nullptr;
  decltype(&::aclrtMemcpyAsync) aclrtMemcpyAsync = nullptr;
  // Page-locked host memory: the staging of transfers (StagedUpload).
  decltype(&::aclrtMallocHost) aclrtMallocHost = nullptr;
  decltype(&::aclrtFreeHost) aclrtFreeHost = nullptr;
  decltype(&::aclrtCreateStream) aclrtCreateStream = nullptr;
  decltype(&::aclrtDestroyStream) aclrtDestroyStream = nullptr;
  decltype(&::aclrtSynchronizeStream) aclrtSynchronizeStream = nullptr;
  // aclnn/acl_meta.h
  decltype(&::aclCreateTensor) aclCreateTensor = nullptr;
  decltype(&::aclDestroyTensor) aclDestroyTensor = nullptr;
  decltype(&::aclCreateScalar) aclCreateScalar = nullptr;
  decltype(&::aclDestroyScalar) aclDestroyScalar = nullptr;
  decltype(&::aclSetAclOpExecutorRepeatable) aclSetAclOpExecutorRepeatable =
      nullptr;
  decltype(&::aclDestroyAclOpExecutor) aclDestroyAclOpExecutor = nullptr;

  // Optional, all or none: explicit contexts. CANN has them; a runtime of
  // the same ABI without them (libaclnn_remote.so before its runtime grew
  // contexts) is still served: each thread then binds its device with
  // aclrtSetDevice (CANN's implicit default context).
  decltype(&::aclrtCreateContext) aclrtCreateContext = nullptr;
  decltype(&::aclrtDestroyContext) aclrtDestroyContext = nullptr;
  decltype(&::aclrtSetCurrentContext) aclrtSetCurrentContext = nullptr;
  // Optional, both or none: without them, memory is zeroed by copying
  // zeros from the host (aclrtMemcpy).
  decltype(&::aclrtMemset) aclrtMemset = nullptr;
  decltype(&::aclrtMemsetAsync) aclrtMemsetAsync = nullptr;
  // Optional, all or none: graph capture (aclmdlRI). Without them, and
  // without aclrtMemsetAsync, the server replays a graph task by task
  // (AscendDevice::captures_graphs).
  decltype(&::aclmdlRICaptureBegin) aclmdlRICaptureBegin = nullptr;
  decltype(&::aclmdlRICaptureEnd) aclmdlRICaptureEnd = nullptr;
  decltype(&::aclmdlRIExecuteAsync) aclmdlRIExecuteAsync = nullptr;
  decltype(&::aclmdlRIDestroy) aclmdlRIDestroy = nullptr;

  // Per operator (indexed by kernels::OpKind), optional per operator: both
  // halves of the two-phase call, or the operator is not served. Cast to
  // the operator's own signature (aclnnop/aclnn_*.h) before calling.
  struct OpFunctions {
    void* get_workspace_size = nullptr;  // aclnnXxxGetWorkspaceSize
    void* launch = nullptr;              // aclnnXxx
  };
  std::array<OpFunctions, kOpCount> ops{};

  bool has_contexts() const { return aclrtSetCurrentContext != nullptr; }
  bool has_memset() const { return aclrtMemset != nullptr; }
  bool has_graphs() const { return aclmdlRICaptureBegin != nullptr; }
  bool has_op(kernels::OpKind op) const {
    return ops[static_cast<int>(op)].launch != nullptr;
  }
};

// The loaded libraries. aclInit has been called once by Load; the
// destructor calls aclFinalize. Thread-safe (CANN's calls are).
class CannLibrary {
 public:
  // CANN's libraries, in load order: the runtime first, then the aclnn
  // base and the operator library that depend on it.
  static std::vector<std::string> DefaultLibraries();

  // Where `name` is loaded from: a name with a '/' as it is; otherwise
  // $ASCEND_HOME_PATH/lib64/`name` when CANN's set_env.sh has set
  // ASCEND_HOME_PATH and the file exists there, else `name` itself, which
  // the dynamic loader looks up in LD_LIBRARY_PATH (set_env.sh adds CANN's
  // lib64 directories to it) and its cache.
  static std::string Resolve(const std::string& name);

  // Loads `libraries` (in order, all into one new link-map namespace),
  // resolves every symbol the device uses and calls aclInit(nullptr).
  // FAILED_PRECONDITION with one line naming the library that failed to
  // load (with the loader's reason), the required symbol none of them
  // defines, or aclInit's error.
  static absl::StatusOr<std::shared_ptr<CannLibrary>> Load(
      const std::vector<std::string>& libraries);

  // Calls aclFinalize. The libraries stay mapped: their threads (gRPC's,
  // in libaclnn_remote.so) may still run after aclFinalize returns, and
  // unmapping code under a running thread would crash it.
  ~CannLibrary();
  CannLibrary(const CannLibrary&) = delete;
  CannLibrary& operator=(const CannLibrary&) = delete;

  // Every call into CANN starts here: on a thread's first call it makes
  // the thread one that CANN's C library can run on (EnterOnThisThread).
  const CannApi& api() const {
    EnterOnThisThread();
    return api_;
  }
  // The files loaded, as given to dlmopen.
  const std::vector<std::string>& paths() const { return paths_; }

  // Any symbol of the namespace (the first library that defines it), or
  // null: for the fake library's query functions in tests.
  void* Lookup(const char* symbol) const;

  // aclGetRecentErrMsg() of the calling thread, "" when it has none.
  std::string RecentError() const;

 private:
  CannLibrary() = default;

  // The namespace's libc keeps a per-thread pointer to its character
  // class tables (isalpha, toupper, ...), which it sets only on the threads
  // it starts and on the one that loaded it. On the server's other threads
  // it is null, and the first character test that CANN's code makes there
  // reads address 2 * c: libaclnn_remote.so's gRPC, parsing the address of
  // a connection it opened on a server thread, crashed the chain's front
  // that way. The namespace's uselocale(LC_GLOBAL_LOCALE) sets the
  // pointers; this calls it once per thread and namespace.
  void EnterOnThisThread() const;
  using UseLocaleFn = locale_t (*)(locale_t);
  UseLocaleFn namespace_uselocale_ = nullptr;

  std::vector<std::string> paths_;
  std::vector<void*> handles_;
  CannApi api_;
};

}  // namespace opserver::ascend

#endif  // OPSERVER_DEVICES_ASCEND_CANN_LIBRARY_H_
