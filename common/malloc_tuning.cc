#include "common/malloc_tuning.h"

#include <malloc.h>

namespace opserver {

void TuneMallocForStreaming() {
  // Blocks below 256 MiB come from the heap and stay there when freed;
  // larger ones (device buffers use their own pool) are still mmap'ed.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // One arena per gRPC thread would keep a separate set of freed chunks
  // each; two arenas bound the memory kept to a few chunks.
  mallopt(M_ARENA_MAX, 2);
}

}  // namespace opserver
