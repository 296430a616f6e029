// S -> R: an all-gather over the axes a dim drops, each member's block placed straight into the
// new one where MPI allows.
#pragma once
#include <algorithm>
#include <climits>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/reshard/steps/common.hpp"

namespace tshard::detail {

inline Index slice_stride(const ShardLayout& l, int d) {
  Index s = 1;
  for (int e = 0; e < d; ++e) s *= l.padded[e];
  return s;
}

// Past MPI's int-sized datatypes: gather whole padded blocks and copy them into place.
template <class T>
void all_gather_packed(const StepContext& c, const ReshardStep& st, const ShardLayout& from, const ShardLayout& to, const T* src, T* dst) {
  const int k = c.group_size(st.axes);
  const Index n = from.padded_size();
  Scratch<T> all(static_cast<std::size_t>(n) * k);
  all_gather(c.mesh.group(st.axes), src, n, all.data());
  for (int g = 0; g < k; ++g) copy_overlap(all.data() + g * n, c.member(st.from, st.axes, g), dst, to);
}

// Each member's block travels straight into place in mine: where the padded blocks tile the
// new block, one all-gather (a plain one when the blocks are back to back in memory, else
// with a datatype that places each block); with uneven padding, one box per member
// (Alltoallw), valid elements only. No scratch and no unpacking either way.
template <class T>
void all_gather_step(const StepContext& c, const ReshardStep& st, const ShardLayout& from, const ShardLayout& to, const T* src, T* dst) {
  const int k = c.group_size(st.axes), d = st.dim, rank = from.rank;
  if (k == 1) return copy_overlap(src, from, dst, to);  // an axis of size 1: nothing moves
  const Index n = from.padded_size();
  if (n == 0) return;
  MPI_Comm group = c.mesh.group(st.axes);
  const bool tiles = to.padded[d] == k * from.padded[d] && c.member(st.from, st.axes, 0).offset[d] == to.offset[d];
  if (tiles && slowest_dim(to, d)) return all_gather(group, src, n, dst);
  if (slowest_dim(to, d) && to.padded_size() <= std::min<Index>(INT_MAX, collective_chunk_limit())) {
    // Uneven, but each member's block is one run in both buffers.
    const Index slice = to.padded[d] ? to.padded_size() / to.padded[d] : 0;
    std::vector<int> counts(k), displs(k);
    for (int g = 0; g < k; ++g) {
      const ShardLayout l = c.member(st.from, st.axes, g);
      counts[g] = int(l.valid[d] * slice);
      displs[g] = int(l.valid[d] ? (l.offset[d] - to.offset[d]) * slice : 0);
    }
    return all_gather_counts(group, src, dst, counts, displs);
  }
  if (!fits_datatype(from.padded, rank) || !fits_datatype(to.padded, rank) || n > collective_chunk_limit())
    return all_gather_packed(c, st, from, to, src, dst);
  if (tiles) {
    BoxType<T> block(rank, to.padded, Extents{}, from.padded, from.padded[d] * slice_stride(to, d));
    return all_gather_placed(group, src, n, dst, block.get());
  }
  BoxExchange<T> boxes(k);
  boxes.send_to_all(from, from);
  for (int g = 0; g < k; ++g) {
    const ShardLayout l = c.member(st.from, st.axes, g);
    boxes.recv(g, to, l);
  }
  boxes.run(group, src, dst, "all_gather");
}

}  // namespace tshard::detail
