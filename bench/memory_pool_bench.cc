// What tenant isolation costs: a buffer handed from one session to another
// is zeroed. Measured in the same run against the
// machine's limit for that work (a plain memset of the same bytes) and
// against reuse within one session (no zeroing: the steady state).
//
//   bazel run -c opt //bench:memory_pool_bench

#include <cstdint>
#include <cstring>

#include "benchmark/benchmark.h"
#include "devices/cpu/memory_pool.h"

namespace opserver {
namespace {

// Leaves one block of `bytes`, written by owner 1 (its pages faulted in), in
// the pool's cache, as a session's freed buffer is.
void Warm(cpu::MemoryPool& pool, uint64_t bytes) {
  void* block = *pool.Allocate(bytes, 1);
  std::memset(block, 1, bytes);
  pool.Deallocate(block, bytes);
}

// Allocate + Deallocate of one cached block by the same owner: no zeroing.
void BM_ReuseSameOwner(benchmark::State& state) {
  const uint64_t bytes = state.range(0);
  cpu::MemoryPool pool(uint64_t{8} << 30);
  Warm(pool, bytes);
  for (auto _ : state) {
    void* block = *pool.Allocate(bytes, 1);
    benchmark::DoNotOptimize(block);
    pool.Deallocate(block, bytes);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

// The same block alternating between two owners: zeroed every time.
void BM_ReuseOtherOwner(benchmark::State& state) {
  const uint64_t bytes = state.range(0);
  cpu::MemoryPool pool(uint64_t{8} << 30);
  Warm(pool, bytes);
  uint64_t owner = 1;
  for (auto _ : state) {
    owner = 3 - owner;
    void* block = *pool.Allocate(bytes, owner);
    benchmark::DoNotOptimize(block);
    pool.Deallocate(block, bytes);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

// The limit: memset of the same number of bytes, already faulted in.
void BM_MemsetLimit(benchmark::State& state) {
  const uint64_t bytes = state.range(0);
  cpu::MemoryPool pool(uint64_t{8} << 30);
  void* block = *pool.Allocate(bytes, 1);
  std::memset(block, 1, bytes);
  for (auto _ : state) {
    std::memset(block, 0, bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  pool.Deallocate(block, bytes);
}

#define OPSERVER_SIZES ->Arg(64 << 10)->Arg(4 << 20)->Arg(256 << 20)
BENCHMARK(BM_ReuseSameOwner) OPSERVER_SIZES;
BENCHMARK(BM_ReuseOtherOwner) OPSERVER_SIZES;
BENCHMARK(BM_MemsetLimit) OPSERVER_SIZES;

}  // namespace
}  // namespace opserver

BENCHMARK_MAIN();
