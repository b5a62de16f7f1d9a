// A fake of CANN's runtime and aclnn libraries for AscendDevice's unit
// tests: the calls the device resolves, with host memory for device memory
// and nothing computed (the chain test, tests/ascend_chain_test.sh, checks
// the numbers). It records every call, counts the objects it hands out so a
// test sees leaks, checks that the calling thread has a device bound, and
// fails a named call on demand. Tests reach its state through the
// fake_cann_* functions at the end, resolved with CannLibrary::Lookup.
//
// Built in variants (BUILD.bazel): FAKE_CANN_NO_DROPOUT leaves out
// aclnnDropoutBackward*, FAKE_CANN_NO_CONTEXTS the contexts and aclrtMemset
// (a runtime without them), FAKE_CANN_NO_SYNC aclrtSynchronizeStream (a
// required symbol), FAKE_CANN_NO_GRAPHS the graph capture (aclmdlRI).
//
// Graph capture: between aclmdlRICaptureBegin and aclmdlRICaptureEnd on a
// stream, aclnn launches, aclrtMemsetAsync and device-to-device
// aclrtMemcpyAsync on it are recorded, not run (logged with " captured");
// each aclmdlRIExecuteAsync runs the recorded memsets and copies. A host
// copy or a synchronize of a capturing stream invalidates the capture, as
// CANN does.
//
// Host<->device copies can be held at a gate (fake_cann_hold_host_copies),
// so a test sees what the device does while a copy is still running.
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
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

namespace {

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

}  // namespace

extern "C" {

// ---- acl/acl.h, acl/acl_rt.h ----

aclError aclInit(const char*) {
  Log("aclInit");
  State().initialized = true;
  return ACL_SUCCESS;
}

aclError aclFinalize(void) {
  Log("aclFinalize");
  State().initialized = false;
  return ACL_SUCCESS;
}

const char* aclGetRecentErrMsg(void) { return last_error.c_str(); }

aclError aclrtSetDevice(int32_t deviceId) {
  if (int code = Injected("aclrtSetDevice"); code != 0) return code;
  if (deviceId < 0 || deviceId > 3) {
    last_error = "aclrtSetDevice: no device " + std::to_string(deviceId);
    return ACL_ERROR_INVALID_DEVICE;
  }
  Log("aclrtSetDevice " + std::to_string(deviceId));
  current_context = reinterpret_cast<void*>(uintptr_t(deviceId) + 1);
  return ACL_SUCCESS;
}

aclError aclrtResetDevice(int32_t deviceId) {
  Log("aclrtResetDevice " + std::to_string(deviceId));
  current_context = nullptr;
  return ACL_SUCCESS;
}

aclError aclrtGetDeviceCount(uint32_t* count) {
  *count = 4;
  return ACL_SUCCESS;
}

aclError aclrtGetMemInfo(aclrtMemAttr, size_t* free, size_t* total) {
  if (int code = NeedContext("aclrtGetMemInfo"); code != 0) return code;
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  *free = f.mem_free;
  *total = f.mem_total;
  return ACL_SUCCESS;
}

const char* aclrtGetSocName(void) { return "FakeAscend910B"; }

aclError aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy) {
  if (int code = Injected("aclrtMalloc"); code != 0) return code;
  if (int code = NeedContext("aclrtMalloc"); code != 0) return code;
  if (size == 0) {
    last_error = "aclrtMalloc: size 0";
    return ACL_ERROR_INVALID_PARAM;
  }
  char* p = new char[size];
  // What an NPU's memory may hold: never zero by chance.
  std::memset(p, 0xAB, size);
  *devPtr = p;
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.allocations[reinterpret_cast<uintptr_t>(p)] = {size};
  f.live["allocation"] += 1;
  f.log.push_back("aclrtMalloc " + std::to_string(size));
  return ACL_SUCCESS;
}

aclError aclrtFree(void* devPtr) {
  if (int code = NeedContext("aclrtFree"); code != 0) return code;
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.allocations.erase(reinterpret_cast<uintptr_t>(devPtr)) == 0) {
    last_error = "aclrtFree: unknown pointer";
    return ACL_ERROR_INVALID_PARAM;
  }
  f.live["allocation"] -= 1;
  f.log.push_back("aclrtFree");
  delete[] static_cast<char*>(devPtr);
  return ACL_SUCCESS;
}

aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count,
                     aclrtMemcpyKind kind) {
  if (int code = NeedContext("aclrtMemcpy"); code != 0) return code;
  if (count > destMax) return ACL_ERROR_INVALID_PARAM;
  std::memcpy(dst, src, count);
  Log("aclrtMemcpy " + std::to_string(count) + " kind=" + std::to_string(kind));
  return ACL_SUCCESS;
}

aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src,
                          size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream) {
  if (int code = Injected("aclrtMemcpyAsync"); code != 0) return code;
  if (int code = NeedContext("aclrtMemcpyAsync"); code != 0) return code;
  if (count > destMax) return ACL_ERROR_INVALID_PARAM;
  const std::string line = "aclrtMemcpyAsync " + std::to_string(count) +
                           " kind=" + std::to_string(kind);
  {
    Fake& f = State();
    std::lock_guard<std::mutex> lock(f.mu);
    if (Model* capture = CaptureOf(f, stream); capture != nullptr) {
      if (kind != ACL_MEMCPY_DEVICE_TO_DEVICE) {
        capture->invalidated = true;
        last_error = "aclrtMemcpyAsync: a host copy on a capturing stream";
        f.log.push_back(line + " REFUSED");
        return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
      }
      capture->work.push_back([=] { std::memmove(dst, src, count); });
      ++capture->tasks;
      f.log.push_back(line + " captured");
      return ACL_SUCCESS;
    }
  }
  if (kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_HOST) {
    Fake& f = State();
    std::unique_lock<std::mutex> lock(f.mu);
    if (f.hold && f.permits == 0) {
      ++f.held;
      f.log.push_back(line + " held");
      f.gate.wait(lock, [&f] { return !f.hold || f.permits > 0; });
      --f.held;
    }
    if (f.hold) --f.permits;
  }
  std::memcpy(dst, src, count);
  Log(line);
  return ACL_SUCCESS;
}

aclError aclrtMallocHost(void** hostPtr, size_t size) {
  if (int code = Injected("aclrtMallocHost"); code != 0) return code;
  if (int code = NeedContext("aclrtMallocHost"); code != 0) return code;
  if (hostPtr == nullptr || size == 0) return ACL_ERROR_INVALID_PARAM;
  char* p = new char[size];
  std::memset(p, 0xCD, size);
  *hostPtr = p;
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.host_blocks[reinterpret_cast<uintptr_t>(p)] = size;
  f.live["host"] += 1;
  f.log.push_back("aclrtMallocHost " + std::to_string(size));
  return ACL_SUCCESS;
}

aclError aclrtFreeHost(void* hostPtr) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.host_blocks.erase(reinterpret_cast<uintptr_t>(hostPtr)) == 0) {
    last_error = "aclrtFreeHost: unknown pointer";
    return ACL_ERROR_INVALID_PARAM;
  }
  f.live["host"] -= 1;
  f.log.push_back("aclrtFreeHost");
  delete[] static_cast<char*>(hostPtr);
  return ACL_SUCCESS;
}

aclError aclrtCreateStream(aclrtStream* stream) {
  if (int code = Injected("aclrtCreateStream"); code != 0) return code;
  if (int code = NeedContext("aclrtCreateStream"); code != 0) return code;
  *stream = new char;
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.streams.insert(*stream);
  f.live["stream"] += 1;
  f.log.push_back("aclrtCreateStream");
  return ACL_SUCCESS;
}

aclError aclrtDestroyStream(aclrtStream stream) {
  if (int code = NeedContext("aclrtDestroyStream"); code != 0) return code;
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.streams.erase(stream) == 0) return ACL_ERROR_INVALID_PARAM;
  f.live["stream"] -= 1;
  f.log.push_back("aclrtDestroyStream");
  delete static_cast<char*>(stream);
  return ACL_SUCCESS;
}

#ifndef FAKE_CANN_NO_SYNC
aclError aclrtSynchronizeStream(aclrtStream stream) {
  if (int code = Injected("aclrtSynchronizeStream"); code != 0) return code;
  if (int code = NeedContext("aclrtSynchronizeStream"); code != 0) {
    return code;
  }
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (Model* capture = CaptureOf(f, stream); capture != nullptr) {
    capture->invalidated = true;
    last_error = "aclrtSynchronizeStream: the stream is capturing";
    f.log.push_back("aclrtSynchronizeStream REFUSED");
    return ACL_ERROR_RT_STREAM_CAPTURED;
  }
  f.log.push_back("aclrtSynchronizeStream");
  return ACL_SUCCESS;
}
#endif

#ifndef FAKE_CANN_NO_CONTEXTS
aclError aclrtCreateContext(void** context, int32_t deviceId) {
  if (int code = Injected("aclrtCreateContext"); code != 0) return code;
  void* c = new char;
  *context = c;
  current_context = c;
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.contexts.insert(c);
  f.live["context"] += 1;
  f.log.push_back("aclrtCreateContext " + std::to_string(deviceId));
  return ACL_SUCCESS;
}

aclError aclrtDestroyContext(void* context) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.contexts.erase(context) == 0) return ACL_ERROR_INVALID_PARAM;
  if (current_context == context) current_context = nullptr;
  f.live["context"] -= 1;
  f.log.push_back("aclrtDestroyContext");
  delete static_cast<char*>(context);
  return ACL_SUCCESS;
}

aclError aclrtSetCurrentContext(void* context) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.contexts.count(context) == 0) return ACL_ERROR_INVALID_PARAM;
  current_context = context;
  f.log.push_back("aclrtSetCurrentContext");
  return ACL_SUCCESS;
}

aclError aclrtMemset(void* devPtr, size_t maxCount, int32_t value,
                     size_t count) {
  if (int code = Injected("aclrtMemset"); code != 0) return code;
  if (int code = NeedContext("aclrtMemset"); code != 0) return code;
  if (count > maxCount) return ACL_ERROR_INVALID_PARAM;
  std::memset(devPtr, value, count);
  Log("aclrtMemset " + std::to_string(count));
  return ACL_SUCCESS;
}

aclError aclrtMemsetAsync(void* devPtr, size_t maxCount, int32_t value,
                          size_t count, aclrtStream stream) {
  if (int code = NeedContext("aclrtMemsetAsync"); code != 0) return code;
  if (count > maxCount) return ACL_ERROR_INVALID_PARAM;
  {
    Fake& f = State();
    std::lock_guard<std::mutex> lock(f.mu);
    if (Model* capture = CaptureOf(f, stream); capture != nullptr) {
      capture->work.push_back([=] { std::memset(devPtr, value, count); });
      ++capture->tasks;
      f.log.push_back("aclrtMemsetAsync " + std::to_string(count) +
                      " captured");
      return ACL_SUCCESS;
    }
  }
  std::memset(devPtr, value, count);
  Log("aclrtMemsetAsync " + std::to_string(count));
  return ACL_SUCCESS;
}
#endif

#ifndef FAKE_CANN_NO_GRAPHS
aclError aclmdlRICaptureBegin(aclrtStream stream, aclmdlRICaptureMode mode) {
  if (int code = Injected("aclmdlRICaptureBegin"); code != 0) return code;
  if (int code = NeedContext("aclmdlRICaptureBegin"); code != 0) return code;
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.streams.count(stream) == 0) return ACL_ERROR_INVALID_PARAM;
  if (!f.captures.emplace(stream, Model()).second) {
    last_error = "aclmdlRICaptureBegin: the stream is already capturing";
    return ACL_ERROR_RT_STREAM_CAPTURED;
  }
  f.log.push_back("aclmdlRICaptureBegin mode=" +
                  std::to_string(static_cast<int>(mode)));
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI* modelRI) {
  if (int code = NeedContext("aclmdlRICaptureEnd"); code != 0) return code;
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.captures.find(stream);
  if (it == f.captures.end()) {
    last_error = "aclmdlRICaptureEnd: the stream is not capturing";
    return ACL_ERROR_RT_STREAM_NOT_CAPTURED;
  }
  Model* model = new Model(std::move(it->second));
  f.captures.erase(it);
  auto failure = f.failures.find("aclmdlRICaptureEnd");
  if (model->invalidated || failure != f.failures.end()) {
    const int code = failure != f.failures.end()
                         ? failure->second.first
                         : ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED;
    last_error = failure != f.failures.end() ? failure->second.second
                                             : "the capture was invalidated";
    if (failure != f.failures.end()) f.failures.erase(failure);
    f.log.push_back("aclmdlRICaptureEnd FAILED " + std::to_string(code));
    delete model;
    return code;
  }
  f.models[model] = model;
  f.live["model"] += 1;
  f.log.push_back("aclmdlRICaptureEnd tasks=" + std::to_string(model->tasks));
  *modelRI = model;
  return ACL_SUCCESS;
}

aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream) {
  if (int code = Injected("aclmdlRIExecuteAsync"); code != 0) return code;
  if (int code = NeedContext("aclmdlRIExecuteAsync"); code != 0) return code;
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.models.find(modelRI);
  if (it == f.models.end() || f.streams.count(stream) == 0) {
    last_error = "aclmdlRIExecuteAsync: unknown model or stream";
    return ACL_ERROR_INVALID_PARAM;
  }
  for (const std::function<void()>& work : it->second->work) work();
  f.log.push_back("aclmdlRIExecuteAsync tasks=" +
                  std::to_string(it->second->tasks));
  return ACL_SUCCESS;
}

aclError aclmdlRIDestroy(aclmdlRI modelRI) {
  if (int code = NeedContext("aclmdlRIDestroy"); code != 0) return code;
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.models.find(modelRI);
  if (it == f.models.end()) return ACL_ERROR_INVALID_PARAM;
  delete it->second;
  f.models.erase(it);
  f.live["model"] -= 1;
  f.log.push_back("aclmdlRIDestroy");
  return ACL_SUCCESS;
}
#endif

// ---- aclnn/acl_meta.h ----

aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum,
                           aclDataType dataType, const int64_t* stride,
                           int64_t offset, aclFormat format,
                           const int64_t* storageDims, uint64_t storageDimsNum,
                           void* tensorData) {
  if (Injected("aclCreateTensor") != 0) return nullptr;
  std::ostringstream line;
  line << "aclCreateTensor dtype=" << dataType
       << " shape=" << Dims(viewDims, viewDimsNum)
       << " strides=" << Dims(stride, viewDimsNum) << " offset=" << offset
       << " format=" << format
       << " storage=" << Dims(storageDims, storageDimsNum)
       << " data=" << Where(tensorData);
  auto* t =
      new aclTensor{std::vector<int64_t>(viewDims, viewDims + viewDimsNum)};
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.tensors.insert(t);
  f.live["tensor"] += 1;
  f.log.push_back(line.str());
  return t;
}

aclScalar* aclCreateScalar(void* value, aclDataType dataType) {
  std::ostringstream line;
  line << "aclCreateScalar dtype=" << dataType;
  if (dataType == ACL_FLOAT) {
    float v;
    std::memcpy(&v, value, sizeof(v));
    line << " value=" << v;
  } else if (dataType == ACL_DOUBLE) {
    double v;
    std::memcpy(&v, value, sizeof(v));
    line << " value=" << v;
  } else if (dataType == ACL_INT64) {
    int64_t v;
    std::memcpy(&v, value, sizeof(v));
    line << " value=" << v;
  }
  Log(line.str());
  Count("scalar", 1);
  return new aclScalar{dataType};
}

aclnnStatus aclDestroyTensor(const aclTensor* tensor) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.tensors.erase(tensor) == 0) return ACLNN_ERR_PARAM_NULLPTR;
  f.live["tensor"] -= 1;
  f.log.push_back("aclDestroyTensor");
  delete tensor;
  return ACLNN_SUCCESS;
}

aclnnStatus aclDestroyScalar(const aclScalar* scalar) {
  Log("aclDestroyScalar");
  Count("scalar", -1);
  delete scalar;
  return ACLNN_SUCCESS;
}

aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor* executor) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.executors.count(executor) == 0) return ACLNN_ERR_INNER_NULLPTR;
  executor->repeatable = true;
  f.log.push_back("aclSetAclOpExecutorRepeatable");
  return ACLNN_SUCCESS;
}

aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor* executor) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.executors.count(executor) == 0 || !executor->repeatable) {
    return ACLNN_ERR_INNER_NULLPTR;
  }
  f.executors.erase(executor);
  f.live["executor"] -= 1;
  f.log.push_back("aclDestroyAclOpExecutor");
  delete executor;
  return ACLNN_SUCCESS;
}

// ---- aclnnop/aclnn_*.h ----

aclnnStatus aclnnThresholdBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclScalar*,
    aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor) {
  return PlanOp("aclnnThresholdBackwardGetWorkspaceSize", "ThresholdBackward",
                workspaceSize, executor, gradOutput, self,
                static_cast<const aclTensor*>(out));
}
aclnnStatus aclnnThresholdBackward(void* workspace, uint64_t workspaceSize,
                                   aclOpExecutor* executor,
                                   aclrtStream stream) {
  return RunOp("aclnnThresholdBackward", workspace, workspaceSize, executor,
               stream);
}

aclnnStatus aclnnSoftshrinkBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclScalar*,
    aclTensor* gradInput, uint64_t* workspaceSize, aclOpExecutor** executor) {
  return PlanOp("aclnnSoftshrinkBackwardGetWorkspaceSize", "SoftshrinkBackward",
                workspaceSize, executor, gradOutput, self,
                static_cast<const aclTensor*>(gradInput));
}
aclnnStatus aclnnSoftshrinkBackward(void* workspace, uint64_t workspaceSize,
                                    aclOpExecutor* executor,
                                    aclrtStream stream) {
  return RunOp("aclnnSoftshrinkBackward", workspace, workspaceSize, executor,
               stream);
}

aclnnStatus aclnnHardswishBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                   const aclTensor* self,
                                                   aclTensor* out,
                                                   uint64_t* workspaceSize,
                                                   aclOpExecutor** executor) {
  return PlanOp("aclnnHardswishBackwardGetWorkspaceSize", "HardswishBackward",
                workspaceSize, executor, gradOutput, self,
                static_cast<const aclTensor*>(out));
}
aclnnStatus aclnnHardswishBackward(void* workspace, uint64_t workspaceSize,
                                   aclOpExecutor* executor,
                                   aclrtStream stream) {
  return RunOp("aclnnHardswishBackward", workspace, workspaceSize, executor,
               stream);
}

aclnnStatus aclnnLeakyReluBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclScalar*,
    bool selfIsResult, aclTensor* out, uint64_t* workspaceSize,
    aclOpExecutor** executor) {
  Log(std::string("selfIsResult=") + (selfIsResult ? "true" : "false"));
  return PlanOp("aclnnLeakyReluBackwardGetWorkspaceSize", "LeakyReluBackward",
                workspaceSize, executor, gradOutput, self,
                static_cast<const aclTensor*>(out));
}
aclnnStatus aclnnLeakyReluBackward(void* workspace, uint64_t workspaceSize,
                                   aclOpExecutor* executor,
                                   aclrtStream stream) {
  return RunOp("aclnnLeakyReluBackward", workspace, workspaceSize, executor,
               stream);
}

#ifndef FAKE_CANN_NO_DROPOUT
aclnnStatus aclnnDropoutBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                 const aclTensor* mask,
                                                 double scale, aclTensor* out,
                                                 uint64_t* workspaceSize,
                                                 aclOpExecutor** executor) {
  // Not std::to_string: its vsnprintf crashed in glibc 2.36's printf_fp
  // on a thread of the test (this library's libc is a second copy, in
  // the namespace dlmopen made); the stream's formatting does not.
  std::ostringstream line;
  line << "scale=" << scale;
  Log(line.str());
  return PlanOp("aclnnDropoutBackwardGetWorkspaceSize", "DropoutBackward",
                workspaceSize, executor, gradOutput, mask,
                static_cast<const aclTensor*>(out));
}
aclnnStatus aclnnDropoutBackward(void* workspace, uint64_t workspaceSize,
                                 aclOpExecutor* executor, aclrtStream stream) {
  return RunOp("aclnnDropoutBackward", workspace, workspaceSize, executor,
               stream);
}
#endif

// ---- The tests' view of the fake ----

// Clears the log and the pending failures; the counts of live objects stay
// (they are what a test checks for leaks).
void fake_cann_reset(void) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.log.clear();
  f.failures.clear();
  f.workspace = 0;
  f.mem_free = f.mem_total = 1ull << 30;
  f.hold = false;
  f.permits = 0;
  f.gate.notify_all();
}

// Objects handed out and not yet released: "tensor", "scalar", "executor",
// "allocation", "stream", "context", "model", "host" (aclrtMallocHost).
int64_t fake_cann_live(const char* kind) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  return f.live[kind];
}

// The calls since the last reset, one a line. Valid until the next call.
const char* fake_cann_log(void) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.log_text.clear();
  for (const std::string& line : f.log) f.log_text += line + "\n";
  return f.log_text.c_str();
}

// The next call of `function` returns `code`, with `message` as the
// thread's aclGetRecentErrMsg (aclCreateTensor returns NULL).
void fake_cann_fail_next(const char* function, int code, const char* message) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.failures[function] = {code, message};
}

// While `on`, every host<->device aclrtMemcpyAsync waits (logged with
// " held") until a permit lets it through (fake_cann_permit_host_copies)
// or the hold is lifted (every waiting one goes on).
void fake_cann_hold_host_copies(int on) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.hold = on != 0;
  f.permits = 0;
  f.gate.notify_all();
}

// Lets `count` more held copies through.
void fake_cann_permit_host_copies(int count) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.permits += count;
  f.gate.notify_all();
}

// The host copies waiting at the gate now.
int fake_cann_held_host_copies(void) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  return f.held;
}

// Whether a live aclrtMallocHost block holds `size` bytes equal to `bytes`
// at its start: what a transfer staged there.
int fake_cann_host_holds(const void* bytes, size_t size) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  for (const auto& [address, block_size] : f.host_blocks) {
    if (block_size >= size &&
        std::memcmp(reinterpret_cast<const void*>(address), bytes, size) == 0) {
      return 1;
    }
  }
  return 0;
}

// What every aclnnXxxGetWorkspaceSize reports from now on.
void fake_cann_set_workspace(uint64_t bytes) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.workspace = bytes;
}

// What aclrtGetMemInfo reports from now on.
void fake_cann_set_mem_info(size_t free, size_t total) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.mem_free = free;
  f.mem_total = total;
}

// The namespace's malloc and free, as CANN's code calls them.
void* fake_cann_malloc(size_t bytes) { return malloc(bytes); }
void fake_cann_free(void* p) { free(p); }

// Starts `count` threads of the namespace's libc one after another, as
// CANN's own thread pools do; each sets this library's thread_locals
// (dynamic TLS, which the dynamic loader allocates) and exits before the
// next starts, which gets the stack and TLS its predecessor left in that
// libc's stack cache. The number of threads that ran.
int fake_cann_run_threads(int count) {
  int ran = 0;
  for (int i = 0; i < count; ++i) {
    std::thread thread([&ran] {
      last_error = std::string(200, 'x');
      current_context = &last_error;
      ++ran;
    });
    thread.join();
  }
  return ran;
}

}  // extern "C"
