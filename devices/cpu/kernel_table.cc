#include "devices/cpu/kernel_table.h"

#include <cstddef>
#include <unordered_map>
#include <utility>

#include "devices/cpu/op_loops.h"
#include "kernels/op_kind.h"
#include "kernels/ops/all.h"

namespace opserver::cpu {
namespace {

using kernels::DType;
using kernels::DTypes;
using kernels::OpKind;
#define OPSERVER_USING(Name) using kernels::Name;
OPSERVER_OPS(OPSERVER_USING)
#undef OPSERVER_USING

uint64_t Key(OpKind op, DType g, DType s, DType o) {
  return (static_cast<uint64_t>(op) << 48) |
         (static_cast<uint64_t>(static_cast<uint32_t>(g)) << 32) |
         (static_cast<uint64_t>(static_cast<uint32_t>(s)) << 16) |
         static_cast<uint64_t>(static_cast<uint32_t>(o));
}

using Table = std::unordered_map<uint64_t, Kernel>;

// Combination I of Op::kKernels: its strided kernel and, where
// OpLoops<Op>::Simd says so, the SIMD kernel for unit strides.
template <class Op, size_t I>
void AddKernel(Table& t, OpKind op) {
  constexpr DTypes d = Op::kKernels[I];
  Kernel k;
  k.strided = OpLoops<Op>::template Strided<d.g, d.s, d.o>();
  if constexpr (OpLoops<Op>::Simd(d)) k.contig = SimdContigKernel(op, d.o);
  t[Key(op, d.g, d.s, d.o)] = k;
}

template <class Op, size_t... I>
void AddOp(Table& t, OpKind op, std::index_sequence<I...>) {
  (AddKernel<Op, I>(t, op), ...);
}

Table BuildTable() {
  Table t;
#define OPSERVER_ADD_OP(Name)     \
  AddOp<Name>(t, OpKind::k##Name, \
              std::make_index_sequence<Name::kKernels.size()>());
  OPSERVER_OPS(OPSERVER_ADD_OP)
#undef OPSERVER_ADD_OP
  return t;
}

}  // namespace

const Kernel* FindKernel(OpKind op, DType g, DType s, DType o) {
  static const Table* const table = new Table(BuildTable());
  auto it = table->find(Key(op, g, s, o));
  return it == table->end() ? nullptr : &it->second;
}

}  // namespace opserver::cpu
