#include "devices/ascend/fake_cann_state.h"

#include <string>

namespace fake_cann {

Fake& State() {
  static Fake* fake = new Fake();
  return *fake;
}

thread_local std::string last_error;
// The context current on this thread (device id + 1 for a default one).
thread_local void* current_context = nullptr;

void Log(const std::string& line) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.log.push_back(line);
}

void Count(const char* kind, int delta) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.live[kind] += delta;
}

// The injected failure of `function`, consumed; 0 if none.
int Injected(const char* function) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.failures.find(function);
  if (it == f.failures.end()) return 0;
  const int code = it->second.first;
  last_error = it->second.second;
  f.failures.erase(it);
  f.log.push_back(std::string(function) + " FAILED " + std::to_string(code));
  return code;
}

// A call that needs a device on this thread.
int NeedContext(const char* function) {
  if (current_context != nullptr) return 0;
  last_error = std::string(function) + ": no context on this thread";
  Log(std::string(function) + " NO CONTEXT");
  return ACL_ERROR_RT_CONTEXT_NULL;
}

// The capture `stream` is in, or null (f.mu held).
Model* CaptureOf(Fake& f, void* stream) {
  auto it = f.captures.find(stream);
  return it == f.captures.end() ? nullptr : &it->second;
}

std::string Dims(const int64_t* dims, uint64_t n) {
  std::string s = "[";
  for (uint64_t i = 0; i < n; ++i) {
    if (i != 0) s += ",";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

// "alloc+OFFSET" when `p` is inside an aclrtMalloc block, else "host".
std::string Where(const void* p) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = f.allocations.upper_bound(a);
  if (it != f.allocations.begin()) {
    --it;
    if (a < it->first + it->second.size || a == it->first) {
      return "alloc+" + std::to_string(a - it->first);
    }
  }
  return "unknown";
}

aclnnStatus RunOp(const char* function, void* workspace,
                  uint64_t workspace_size, aclOpExecutor* executor,
                  aclrtStream stream) {
  if (int code = Injected(function); code != 0) return code;
  if (int code = NeedContext(function); code != 0) return code;
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.executors.count(executor) == 0 || f.streams.count(stream) == 0) {
    last_error = std::string(function) + ": unknown executor or stream";
    return ACLNN_ERR_INNER_NULLPTR;
  }
  Model* capture = CaptureOf(f, stream);
  if (capture != nullptr) ++capture->tasks;
  f.log.push_back(std::string(function) +
                  " workspace_size=" + std::to_string(workspace_size) +
                  (workspace != nullptr ? " workspace" : " no-workspace") +
                  (capture != nullptr ? " captured" : ""));
  if (!executor->repeatable) {
    f.executors.erase(executor);
    f.live["executor"] -= 1;
    delete executor;
  }
  return ACLNN_SUCCESS;
}

}  // namespace fake_cann
