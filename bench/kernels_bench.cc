// Kernel throughput next to the machine's limit, in one binary:
//
//   bazel run -c opt //bench:kernels_bench -- --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true
//
// BM_StreamLimit is the reference: `c = a > b ? a : 0` over fp32 with
// non-temporal stores (2 reads + 1 write), the loop the performance spec
// measures as this machine's bandwidth. Every operator x fp32/fp16/bf16 runs
// at 4 Ki, 256 Ki, 16 Mi and 64 Mi elements on 1 and 2 threads; GB/s counts
// the logical bytes read and written (the dropout mask as n/8 bytes).
// BM_Launch16 is the per-launch cost of a 16-element tensor. On x86 the
// limit loop is AVX-512 or AVX2 code; elsewhere (arm64) it is the same loop
// in Highway's baseline target (NEON).

#if defined(__x86_64__) || defined(__i386__)
#define OPSERVER_BENCH_X86 1
#include <immintrin.h>
#else
#define OPSERVER_BENCH_X86 0
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#endif

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "devices/cpu/plan.h"
#include "devices/cpu/thread_pool.h"

namespace opserver::kernels {
namespace {

using cpu::Plan;
using cpu::PrepareOp;
using cpu::RunPlan;
using cpu::ThreadPool;

// Page-aligned, pre-touched memory (first touch is slow here and is not
// what is measured).
struct Memory {
  explicit Memory(size_t bytes) : bytes(bytes) {
    data = static_cast<char*>(
        std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
    std::memset(data, 0, bytes);
  }
  ~Memory() { std::free(data); }
  char* data;
  size_t bytes;
};

#if OPSERVER_BENCH_X86
template <bool kStream>
__attribute__((target("avx512f"))) void LimitAvx512(const float* a,
                                                    const float* b, float* c,
                                                    int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 va = _mm512_load_ps(a + i), vb = _mm512_load_ps(b + i);
    __mmask16 keep = _mm512_cmp_ps_mask(va, vb, _CMP_GT_OQ);
    if constexpr (kStream) {
      _mm512_stream_ps(c + i, _mm512_maskz_mov_ps(keep, va));
    } else {
      _mm512_store_ps(c + i, _mm512_maskz_mov_ps(keep, va));
    }
  }
  for (; i < n; ++i) c[i] = a[i] > b[i] ? a[i] : 0.0f;
}

__attribute__((target("avx2"))) void StreamLimitAvx2(const float* a,
                                                     const float* b, float* c,
                                                     int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 va = _mm256_load_ps(a + i), vb = _mm256_load_ps(b + i);
    __m256 keep = _mm256_cmp_ps(va, vb, _CMP_GT_OQ);
    _mm256_stream_ps(c + i, _mm256_and_ps(keep, va));
  }
  for (; i < n; ++i) c[i] = a[i] > b[i] ? a[i] : 0.0f;
}

void LimitLoop(const float* a, const float* b, float* c, int64_t n,
               bool stream) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512) {
    StreamLimitAvx2(a, b, c, n);
  } else if (stream) {
    LimitAvx512<true>(a, b, c, n);
  } else {
    LimitAvx512<false>(a, b, c, n);
  }
}

void StoreFence() { _mm_sfence(); }
#else
void LimitLoop(const float* a, const float* b, float* c, int64_t n,
               bool stream) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto va = hn::LoadU(d, a + i);
    const auto r = hn::IfThenElseZero(hn::Gt(va, hn::LoadU(d, b + i)), va);
    if (stream) {
      hn::Stream(r, d, c + i);  // c is page-aligned and i a whole vector.
    } else {
      hn::StoreU(r, d, c + i);
    }
  }
  for (; i < n; ++i) c[i] = a[i] > b[i] ? a[i] : 0.0f;
}

void StoreFence() { hwy::FlushStream(); }
#endif

// Splits [0, n) into chunks of 64 Ki elements shared by the pool's threads
// (a few per thread, like the kernels' own split, so a late-waking worker
// does not leave the caller idle).
template <typename Fn>
void Split(ThreadPool& pool, int64_t n, Fn fn) {
  constexpr int64_t kChunk = 64 * 1024;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  pool.ParallelFor(chunks, [&](int64_t c) {
    fn(c * kChunk, std::min(n, (c + 1) * kChunk));
  });
}

// The limit loop; with `stream` false it uses plain stores.
void Limit(benchmark::State& state, bool stream) {
  const int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  Memory a(n * 4), b(n * 4), c(n * 4);
  auto* fa = reinterpret_cast<float*>(a.data);
  auto* fb = reinterpret_cast<float*>(b.data);
  auto* fc = reinterpret_cast<float*>(c.data);
  for (int64_t i = 0; i < n; ++i) fa[i] = static_cast<float>(i % 7) - 3;
  ThreadPool pool(threads);
  for (auto _ : state) {
    Split(pool, n, [&](int64_t begin, int64_t end) {
      LimitLoop(fa + begin, fb + begin, fc + begin, end - begin, stream);
    });
    StoreFence();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 12);
}

void BM_Op(benchmark::State& state, OpKind op, DType dtype) {
  const int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const int64_t size = DTypeSize(dtype);
  const bool dropout = op == OpKind::kDropoutBackward;
  const int64_t mask_bytes = (n + 127) / 128 * 16;
  Memory grad(n * size), self(dropout ? mask_bytes : n * size), out(n * size);
  // Mixed signs so every branch is taken.
  for (int64_t i = 0; i < static_cast<int64_t>(self.bytes); ++i) {
    self.data[i] = static_cast<char>(i * 37 + 11);
  }
  OpCall call;
  call.op = op;
  auto view = [&](DType d, int64_t numel, char* data) {
    TensorView v;
    v.dtype = d;
    v.shape = {numel};
    v.data = data;
    return v;
  };
  call.grad_output = view(dtype, n, grad.data);
  call.self = dropout ? view(DType::kUint8, mask_bytes, self.data)
                      : view(dtype, n, self.data);
  call.out = view(dtype, n, out.data);
  call.params.threshold = 0;
  call.params.lambd = 0.5;
  call.params.negative_slope = Scalar::Float(0.01);
  call.params.scale = 2;
  absl::StatusOr<Plan> plan = PrepareOp(call);
  if (!plan.ok()) {
    state.SkipWithError(std::string(plan.status().message()).c_str());
    return;
  }
  ThreadPool pool(threads);
  for (auto _ : state) {
    absl::Status status = RunPlan(*plan, nullptr, 0, &pool);
    if (!status.ok()) state.SkipWithError("RunPlan failed");
    benchmark::ClobberMemory();
  }
  const int64_t bytes = n * size * 2 + (dropout ? n / 8 : n * size);
  state.SetBytesProcessed(state.iterations() * bytes);
}

// One launch of a 16-element fp32 ThresholdBackward: RunPlan alone, and
// GetWorkspaceSize (PrepareOp) + RunPlan as an aclnn caller pays it.
void BM_Launch16(benchmark::State& state) {
  const bool with_prepare = state.range(0) != 0;
  float grad[16], self[16], out[16];
  for (int i = 0; i < 16; ++i) {
    grad[i] = static_cast<float>(i);
    self[i] = static_cast<float>(i % 5) - 2;
  }
  OpCall call;
  call.op = OpKind::kThresholdBackward;
  for (auto [slot, data] :
       {std::pair{&call.grad_output, grad}, std::pair{&call.self, self},
        std::pair{&call.out, out}}) {
    TensorView v;
    v.dtype = DType::kFloat;
    v.shape = {16};
    v.data = data;
    *slot = v;
  }
  ThreadPool pool(2);
  absl::StatusOr<Plan> plan = PrepareOp(call);
  for (auto _ : state) {
    if (with_prepare) plan = PrepareOp(call);
    benchmark::DoNotOptimize(RunPlan(*plan, nullptr, 0, &pool));
    benchmark::ClobberMemory();
  }
}

void SizesAndThreads(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{4} << 10, int64_t{256} << 10, int64_t{16} << 20,
                    int64_t{64} << 20}) {
    for (int threads : {1, 2}) b->Args({n, threads});
  }
  b->ArgNames({"n", "threads"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}

void BM_StreamLimit(benchmark::State& state) { Limit(state, true); }
void BM_PlainStoreLimit(benchmark::State& state) { Limit(state, false); }

BENCHMARK(BM_StreamLimit)->Apply(SizesAndThreads);
BENCHMARK(BM_PlainStoreLimit)->Apply(SizesAndThreads);
BENCHMARK(BM_Launch16)->Arg(0)->Arg(1)->ArgName("with_prepare");

void RegisterOps() {
  const std::pair<OpKind, const char*> ops[] = {
      {OpKind::kThresholdBackward, "Threshold"},
      {OpKind::kSoftshrinkBackward, "Softshrink"},
      {OpKind::kHardswishBackward, "Hardswish"},
      {OpKind::kLeakyReluBackward, "LeakyRelu"},
      {OpKind::kDropoutBackward, "Dropout"}};
  const std::pair<DType, const char*> dtypes[] = {{DType::kFloat, "fp32"},
                                                  {DType::kFloat16, "fp16"},
                                                  {DType::kBFloat16, "bf16"}};
  for (auto [op, op_name] : ops) {
    for (auto [dtype, dtype_name] : dtypes) {
      benchmark::RegisterBenchmark(
          (std::string("BM_") + op_name + "/" + dtype_name).c_str(),
          [op = op, dtype = dtype](benchmark::State& state) {
            BM_Op(state, op, dtype);
          })
          ->Apply(SizesAndThreads);
    }
  }
}

}  // namespace
}  // namespace opserver::kernels

int main(int argc, char** argv) {
  opserver::kernels::RegisterOps();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
