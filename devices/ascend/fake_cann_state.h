// What the parts of the fake CANN (fake_cann.cc says what it is) share:
// its state, the CANN objects it hands out, and the helpers every call
// uses (logging, counting, injected failures, the context check, plans).
#ifndef OPSERVER_DEVICES_ASCEND_FAKE_CANN_STATE_H_
#define OPSERVER_DEVICES_ASCEND_FAKE_CANN_STATE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"

struct aclTensor {
  std::vector<int64_t> shape;
};
struct aclScalar {
  aclDataType dtype;
};
struct aclOpExecutor {
  std::string op;
  bool repeatable = false;
};

namespace fake_cann {

struct Allocation {
  size_t size;
};

// A capture going on, or a captured model: what its replays do to memory.
struct Model {
  std::vector<std::function<void()>> work;
  size_t tasks = 0;
  bool invalidated = false;
};

struct Fake {
  std::mutex mu;
  // Capturing stream -> its capture; model handle -> its model.
  std::map<void*, Model> captures;
  std::map<void*, Model*> models;
  std::vector<std::string> log;
  std::map<std::string, int64_t> live;
  // Function -> (code, message) of its next call.
  std::map<std::string, std::pair<int, std::string>> failures;
  std::map<uintptr_t, Allocation> allocations;
  std::set<void*> contexts;
  std::set<void*> streams;
  std::set<const aclTensor*> tensors;
  std::set<const aclOpExecutor*> executors;
  uint64_t workspace = 0;
  size_t mem_free = 1ull << 30;
  size_t mem_total = 1ull << 30;
  bool initialized = false;
  std::string log_text;
  // aclrtMallocHost blocks: address -> size.
  std::map<uintptr_t, size_t> host_blocks;
  // The gate on host<->device copies (fake_cann_hold_host_copies): while
  // `hold`, each waits for a permit; `held` are waiting now.
  bool hold = false;
  int permits = 0;
  int held = 0;
  std::condition_variable gate;
};

Fake& State();

// The last error on this thread (aclGetRecentErrMsg).
extern thread_local std::string last_error;
// The context current on this thread (device id + 1 for a default one).
extern thread_local void* current_context;

void Log(const std::string& line);
void Count(const char* kind, int delta);
// The injected failure of `function`, consumed; 0 if none.
int Injected(const char* function);
// A call that needs a device on this thread.
int NeedContext(const char* function);
// The capture `stream` is in, or null (f.mu held).
Model* CaptureOf(Fake& f, void* stream);
std::string Dims(const int64_t* dims, uint64_t n);
// "alloc+OFFSET" when `p` is inside an aclrtMalloc block, else "host".
std::string Where(const void* p);

// aclnnXxxGetWorkspaceSize: an executor for `op` over known `tensors`.
template <class... Tensors>
aclnnStatus PlanOp(const char* function, const char* op,
                   uint64_t* workspace_size, aclOpExecutor** executor,
                   Tensors... tensors) {
  if (int code = Injected(function); code != 0) return code;
  {
    Fake& f = State();
    std::lock_guard<std::mutex> lock(f.mu);
    for (const aclTensor* t : {tensors...}) {
      if (f.tensors.count(t) == 0) {
        last_error = std::string(function) + ": unknown tensor";
        return ACLNN_ERR_PARAM_NULLPTR;
      }
    }
  }
  *workspace_size = State().workspace;
  *executor = new aclOpExecutor{op};
  {
    Fake& f = State();
    std::lock_guard<std::mutex> lock(f.mu);
    f.executors.insert(*executor);
    f.live["executor"] += 1;
    f.log.push_back(std::string(function) +
                    " workspace=" + std::to_string(*workspace_size));
  }
  return ACLNN_SUCCESS;
}

// aclnnXxx: runs (logs) `executor` on `stream`, recorded when it captures.
aclnnStatus RunOp(const char* function, void* workspace,
                  uint64_t workspace_size, aclOpExecutor* executor,
                  aclrtStream stream);

}  // namespace fake_cann

#endif  // OPSERVER_DEVICES_ASCEND_FAKE_CANN_STATE_H_
