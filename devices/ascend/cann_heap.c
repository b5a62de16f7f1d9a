// The CANN namespace's malloc: the first object CannLibrary loads into the
// link-map namespace, so that every call of the malloc family made there
// (by CANN's libraries and by the namespace's own libc) comes here and goes
// on to the server's allocator, the one the dynamic loader uses.
//
// Why: the dynamic loader is one for the whole process and allocates with
// the malloc of the main namespace, the server's (ASan's in an ASan build).
// It allocates each thread's blocks of dynamic TLS (a dlmopen'ed library's
// thread_locals) that way, also for threads of the namespace's libc; but
// that libc, when it reuses a cached thread stack for a new thread, frees
// the previous thread's blocks with its own free (glibc's
// nptl/allocatestack.c, get_cached_stack). With a malloc of its own there,
// that free was handed memory of the other heap: glibc's "free(): invalid
// pointer" abort under ASan, a crash or a corrupted heap without it. With
// one heap for the process, whichever side frees frees it right.
//
// The cost, without ASan: a thread the namespace's libc started gets a
// per-thread cache of the server's glibc malloc (tcache) on its first
// allocation, and that libc's thread exit releases only its own malloc's
// cache, so the server's is left behind: about 1 KiB per such thread that
// exits (ascend_device_test, 2000 threads of the fake CANN); in the chain
// test's front opserver (libaclnn_remote.so's gRPC) about a dozen threads
// came and went in a run. A leak that small, against a crash.
//
// Plain C with no sanitizer flags (BUILD.bazel says why), embedded in the
// server (cann_heap_so.cc) and loaded from memory, so that nothing extra is
// installed. CannLibrary hands it the allocator with cann_heap_install
// right after loading it; whatever the namespace's libc allocates before
// that (while it initializes) comes from a small static block, never
// reused.
#include <errno.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "devices/ascend/cann_heap.h"

static struct CannHeap heap;
static int installed;

// Before cann_heap_install: bump allocation from `early`, each block after
// a header with its size.
#define EARLY_BYTES (64 * 1024)
static alignas(16) unsigned char early[EARLY_BYTES];
static size_t early_used;

static int IsEarly(const void* p) {
  return (const unsigned char*)p >= early &&
         (const unsigned char*)p < early + EARLY_BYTES;
}

static void* EarlyAlloc(size_t bytes, size_t alignment) {
  if (alignment < 16) alignment = 16;
  size_t start = __atomic_load_n(&early_used, __ATOMIC_RELAXED);
  for (;;) {
    size_t at = (start + 16 + alignment - 1) & ~(alignment - 1);
    if (at > EARLY_BYTES || bytes > EARLY_BYTES - at) {
      errno = ENOMEM;
      return NULL;
    }
    if (__atomic_compare_exchange_n(&early_used, &start, at + bytes, 0,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      memcpy(early + at - sizeof(size_t), &bytes, sizeof(size_t));
      return early + at;
    }
  }
}

static size_t EarlySize(const void* p) {
  size_t bytes;
  memcpy(&bytes, (const unsigned char*)p - sizeof(size_t), sizeof(size_t));
  return bytes;
}

static int Installed(void) {
  return __atomic_load_n(&installed, __ATOMIC_ACQUIRE);
}

__attribute__((visibility("default"))) void cann_heap_install(
    const struct CannHeap* allocator) {
  heap = *allocator;
  __atomic_store_n(&installed, 1, __ATOMIC_RELEASE);
}

__attribute__((visibility("default"))) void* malloc(size_t bytes) {
  if (!Installed()) return EarlyAlloc(bytes, 16);
  return heap.malloc(bytes);
}

__attribute__((visibility("default"))) void free(void* p) {
  if (p == NULL || IsEarly(p)) return;
  heap.free(p);
}

__attribute__((visibility("default"))) void* calloc(size_t n, size_t size) {
  if (!Installed()) {
    if (size != 0 && n > SIZE_MAX / size) {
      errno = ENOMEM;
      return NULL;
    }
    return EarlyAlloc(n * size, 16);  // `early` is zeros, never reused.
  }
  return heap.calloc(n, size);
}

__attribute__((visibility("default"))) void* realloc(void* p, size_t bytes) {
  if (p != NULL && IsEarly(p)) {
    void* moved = malloc(bytes);
    if (moved != NULL) {
      size_t old = EarlySize(p);
      memcpy(moved, p, old < bytes ? old : bytes);
    }
    return moved;
  }
  if (!Installed()) return EarlyAlloc(bytes, 16);  // p is NULL.
  return heap.realloc(p, bytes);
}

__attribute__((visibility("default"))) void* memalign(size_t alignment,
                                                      size_t bytes) {
  if (!Installed()) return EarlyAlloc(bytes, alignment);
  return heap.memalign(alignment, bytes);
}

__attribute__((visibility("default"))) int posix_memalign(void** p,
                                                          size_t alignment,
                                                          size_t bytes) {
  if (!Installed()) {
    *p = EarlyAlloc(bytes, alignment);
    return *p != NULL ? 0 : ENOMEM;
  }
  return heap.posix_memalign(p, alignment, bytes);
}

__attribute__((visibility("default"))) void* aligned_alloc(size_t alignment,
                                                           size_t bytes) {
  if (!Installed()) return EarlyAlloc(bytes, alignment);
  return heap.aligned_alloc(alignment, bytes);
}

__attribute__((visibility("default"))) void* valloc(size_t bytes) {
  if (!Installed()) return EarlyAlloc(bytes, 4096);
  return heap.valloc(bytes);
}

__attribute__((visibility("default"))) void* pvalloc(size_t bytes) {
  if (!Installed()) return EarlyAlloc((bytes + 4095) & ~(size_t)4095, 4096);
  return heap.pvalloc(bytes);
}

__attribute__((visibility("default"))) size_t malloc_usable_size(void* p) {
  if (p == NULL) return 0;
  if (IsEarly(p)) return EarlySize(p);
  return heap.malloc_usable_size(p);
}
