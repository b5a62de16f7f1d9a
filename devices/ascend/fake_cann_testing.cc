// The tests' view of the fake CANN (fake_cann.cc says what the fake is),
// resolved with CannLibrary::Lookup.

#include <cctype>
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

using fake_cann::current_context;
using fake_cann::Fake;
using fake_cann::last_error;
using fake_cann::State;

extern "C" {

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

// isalpha(c), as the fake's C library answers it: CANN's code makes such
// character tests on whatever thread calls it.
int fake_cann_is_alpha(int c) { return std::isalpha(c) != 0 ? 1 : 0; }

}  // extern "C"
