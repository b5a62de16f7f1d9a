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
//
// This file holds the runtime (acl/acl.h, acl/acl_rt.h); the aclnn calls
// are in fake_cann_aclnn.cc, the tests' hooks in fake_cann_testing.cc,
// the shared state in fake_cann_state.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "devices/ascend/fake_cann_state.h"

using fake_cann::CaptureOf;
using fake_cann::current_context;
using fake_cann::Fake;
using fake_cann::Injected;
using fake_cann::last_error;
using fake_cann::Log;
using fake_cann::Model;
using fake_cann::NeedContext;
using fake_cann::State;

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

}  // extern "C"
