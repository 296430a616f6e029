// partial -> S: a reduce-scatter over the partial axes the target splits a dim by.
#pragma once
#include <algorithm>
#include <climits>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/reshard/steps/common.hpp"

namespace tshard::detail {

// Member g's chunk is its rows along the dim with every other dim whole (padding included,
// reduced harmlessly into padding). Equal chunks back to back in memory go straight from src
// to dst; uneven chunks back to back go as they are (MPI_Reduce_scatter with counts); others
// are packed into equal padded chunks (zeroed only where a chunk has padding), since the block
// reduce-scatter (tshard's exchange, comm/collectives.hpp) is much faster than MPI's counted
// one (MPI's block form already was: 48 vs 70 ms for 64 MiB on 2 ranks here).
template <class T>
void reduce_scatter_step(const StepContext& c, const ReshardStep& st, const ShardLayout& from, const ShardLayout& to, const T* src,
                         T* dst) {
  const int k = c.group_size(st.axes), d = st.dim;
  const ReduceOp op = reduce_op_of(st.from.partial);
  MPI_Comm group = c.mesh.group(st.axes);
  const Index chunk = to.padded_size();
  const bool from_start = c.member(st.to, st.axes, 0).offset[d] == from.offset[d];
  if (slowest_dim(from, d) && from_start) {
    if (from.padded[d] == k * to.padded[d]) return reduce_scatter_block(group, src, dst, chunk, op);
    const Index slice = to.padded[d] ? chunk / to.padded[d] : 0;
    std::vector<Index> counts(k);
    Index total = 0;
    for (int g = 0; g < k; ++g) total += counts[g] = c.member(st.to, st.axes, g).valid[d] * slice;
    if (total <= collective_chunk_limit() && total <= INT_MAX) return reduce_scatter_counts(group, src, dst, counts, op);
  }
  Scratch<T> send(static_cast<std::size_t>(chunk) * k);
  for (int g = 0; g < k; ++g) {
    const ShardLayout l = c.member(st.to, st.axes, g), ov = overlap_block(from, l);
    T* c = send.data() + g * chunk;
    // What the copy leaves is zeroed: the rows past a short chunk's end, or all of a ragged one.
    bool rows_only = true;
    for (int e = 0; e < from.rank; ++e)
      if (e != d) rows_only &= ov.valid[e] == l.padded[e];
    if (!rows_only) std::fill(c, c + chunk, T(0));
    copy_overlap(src, from, c, l);
    if (rows_only) {
      Extents start{}, rest = l.padded;
      start[d] = ov.valid[d];
      rest[d] = l.padded[d] - ov.valid[d];
      fill_box(c, l.padded, start, rest, from.rank, T(0));
    }
  }
  reduce_scatter_block(group, send.data(), dst, chunk, op);
}


}  // namespace tshard::detail
