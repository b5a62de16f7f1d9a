/* The allocator cann_heap.c (the CANN namespace's malloc) forwards to,
 * handed to it by CannLibrary through cann_heap_install. One definition
 * for both sides: cann_heap.c is C, built apart from the server, and the
 * layout must agree. */
#ifndef OPSERVER_DEVICES_ASCEND_CANN_HEAP_H_
#define OPSERVER_DEVICES_ASCEND_CANN_HEAP_H_

#include <stddef.h>

struct CannHeap {
  void* (*malloc)(size_t);
  void (*free)(void*);
  void* (*calloc)(size_t, size_t);
  void* (*realloc)(void*, size_t);
  void* (*memalign)(size_t, size_t);
  int (*posix_memalign)(void**, size_t, size_t);
  void* (*aligned_alloc)(size_t, size_t);
  void* (*valloc)(size_t);
  void* (*pvalloc)(size_t);
  size_t (*malloc_usable_size)(void*);
};

/* cann_heap.c's entry point, looked up by name once it is loaded. */
typedef void (*CannHeapInstallFn)(const struct CannHeap* allocator);

#endif /* OPSERVER_DEVICES_ASCEND_CANN_HEAP_H_ */
