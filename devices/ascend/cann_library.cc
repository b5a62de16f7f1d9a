#include "devices/ascend/cann_library.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace opserver::ascend {
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
  Lmid_t namespace_id = LM_ID_NEWLM;
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
    if (namespace_id == LM_ID_NEWLM) {
      // The rest join the namespace the first one created, so that the
      // aclnn libraries bind to that runtime, not to a copy of their own.
      if (dlinfo(handle, RTLD_DI_LMID, &namespace_id) != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot find the link-map namespace of ", path, ": ",
                         LoaderError()));
      }
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
  return library;
}

CannLibrary::~CannLibrary() {
  if (api_.aclFinalize != nullptr) api_.aclFinalize();
}

void* CannLibrary::Lookup(const char* symbol) const {
  for (void* handle : handles_) {
    if (void* address = dlsym(handle, symbol); address != nullptr) {
      return address;
    }
  }
  return nullptr;
}

std::string CannLibrary::RecentError() const {
  const char* message =
      api_.aclGetRecentErrMsg != nullptr ? api_.aclGetRecentErrMsg() : nullptr;
  return message != nullptr ? message : "";
}

}  // namespace opserver::ascend
