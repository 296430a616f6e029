// S(d1) -> S(d2): an all-to-all over the axis that moves between dims.
#pragma once
#include <algorithm>
#include <climits>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/reshard/steps/common.hpp"

namespace tshard::detail {

template <class T>
void all_to_all_packed(const StepContext& c, const ReshardStep& st, const ShardLayout& from, const ShardLayout& to, const T* src, T* dst) {
  const int k = c.group_size(st.axes), d2 = st.dim2;
  const Index chunk = from.padded[d2] ? from.padded_size() / from.padded[d2] * to.padded[d2] : 0;
  Scratch<T> send(static_cast<std::size_t>(chunk) * k), recv(static_cast<std::size_t>(chunk) * k);
  for (int g = 0; g < k; ++g)  // the part of my block that member g keeps along d2
    copy_overlap(src, from, send.data() + g * chunk, with_dim_of(from, c.member(st.to, st.axes, g), d2));
  all_to_all(c.mesh.group(st.axes), send.data(), recv.data(), chunk);
  for (int g = 0; g < k; ++g)  // member g's block along d1, cut to mine along d2
    copy_overlap(recv.data() + g * chunk, with_dim_of(c.member(st.from, st.axes, g), to, d2), dst, to);
}

// Each member gets the box of my block it keeps, straight from my buffer into its own
// (MPI_Alltoallw with one subarray datatype per peer): no packing on either side.
template <class T>
void all_to_all_step(const StepContext& c, const ReshardStep& st, const ShardLayout& from, const ShardLayout& to, const T* src, T* dst) {
  const int k = c.group_size(st.axes), d2 = st.dim2, rank = from.rank;
  if (k == 1) return copy_overlap(src, from, dst, to);
  if (!fits_datatype(from.padded, rank) || !fits_datatype(to.padded, rank)) return all_to_all_packed(c, st, from, to, src, dst);
  BoxExchange<T> boxes(k);
  for (int g = 0; g < k; ++g) {
    boxes.send(g, from, overlap_block(from, with_dim_of(from, c.member(st.to, st.axes, g), d2)));
    boxes.recv(g, to, overlap_block(with_dim_of(c.member(st.from, st.axes, g), to, d2), to));
  }
  boxes.run(c.mesh.group(st.axes), src, dst, "all_to_all");
}

}  // namespace tshard::detail
