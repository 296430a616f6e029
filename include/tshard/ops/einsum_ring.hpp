// The windowed einsum (GSPMD section 3.5.2's collective matmul): C = A x B with B's column
// blocks rotating around the ring of the axis both operands split, each step multiplying the
// block in hand while the next one arrives.
#pragma once
#include <algorithm>
#include <utility>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/collectives.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/core/shard.hpp"
#include "tshard/ops/gemm.hpp"

namespace tshard::detail {

// C (rows split over the ring, all columns) = A (rows split) x B (columns split), B's blocks
// rotating around the ring: each step multiplies the block in hand while the next arrives.
template <class T>
void windowed_matmul(MeshState& mesh, const SpecDesc& wa, const SpecDesc& wb, const Extents& ashape,
                     const Extents& bshape, const T* a, const T* b, T* c, const ShardLayout& lc) {
  const MeshShape& m = mesh.shape();
  const ShardLayout la = shard_layout(wa, ashape, m, mesh.coords());
  const ShardLayout lb = shard_layout(wb, bshape, m, mesh.coords());
  MPI_Comm ring = mesh.group(wb.dims[1]);
  const int k = comm_size(ring), me = comm_rank(ring);
  const Index n = bshape[1], block = lb.padded_size(), rows = la.valid[0], inner = la.valid[1];
  Scratch<T> buf0(static_cast<std::size_t>(block)), buf1(static_cast<std::size_t>(block));
  T* cur = buf0.data();
  T* next = buf1.data();
  std::copy(b, b + block, cur);
  for (int s = 0; s < k; ++s) {
    const int q = (me + s) % k;  // the column block in hand
    AsyncExchange<T> shift;
    if (s + 1 < k)
      shift.start(ring, {{(me - 1 + k) % k, cur, block}}, {{(me + 1) % k, next, block}}, "ring_shift");
    const Index col = shard_offset(n, k, q), cols = shard_valid(n, k, q);
    if (rows && cols)
      gemm<T>(false, false, rows, cols, inner, a, std::max<Index>(la.padded[0], 1), cur, std::max<Index>(lb.padded[0], 1),
              c + col * lc.padded[0], std::max<Index>(lc.padded[0], 1));
    shift.wait();
    std::swap(cur, next);
  }
}

}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void windowed_matmul<T>(MeshState&, const SpecDesc&, \
    const SpecDesc&, const Extents&, const Extents&, const T*, const T*, T*, const ShardLayout&))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
