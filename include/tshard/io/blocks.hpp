// A rank's block in a file: whether it writes it (the first replica), and its valid box between
// our column-major padded buffer and C order (last index fastest), the order of C-order .npy
// files and of HDF5 datasets.
#pragma once
#include <algorithm>

#include "tshard/comm/mesh.hpp"
#include "tshard/core/shard.hpp"

namespace tshard::io::detail {

// Whether this rank writes its block: it holds valid elements and is the first replica of
// them (coordinate 0 on every axis the tensor is not split over).
inline bool first_replica(const tshard::detail::MeshState& mesh, const tshard::detail::SpecDesc& spec,
                          const tshard::detail::ShardLayout& layout) {
  if (layout.valid_size() == 0) return false;
  const std::uint32_t split = spec.split_axes();
  for (int a = 0; a < mesh.shape().axes(); ++a)
    if (!(split & (1u << a)) && mesh.coords()[a] != 0) return false;
  return true;
}

// Moves a rank's valid box between its column-major padded buffer and a contiguous C-order box
// (last index fastest): a reversal of the axes, done as cache-blocked 2-D transposes of the first
// and last dims for each index of the dims between.
template <class T, bool ToCOrder>
void c_order_copy(const tshard::detail::ShardLayout& layout, const T* from, T* to) {
  const int r = layout.rank;
  if (layout.valid_size() == 0) return;
  if (r == 1) {
    std::copy(from, from + layout.valid[0], to);
    return;
  }
  const tshard::detail::Index n0 = layout.valid[0], nl = layout.valid[r - 1];
  // Strides of dims 0 and r-1 in both layouts, and of the middle dims.
  tshard::detail::Index col_stride[tshard::detail::kMaxRank], c_stride[tshard::detail::kMaxRank];
  col_stride[0] = 1;
  for (int d = 1; d < r; ++d) col_stride[d] = col_stride[d - 1] * layout.padded[d - 1];
  c_stride[r - 1] = 1;
  for (int d = r - 2; d >= 0; --d) c_stride[d] = c_stride[d + 1] * layout.valid[d + 1];
  tshard::detail::Extents mid{};
  constexpr tshard::detail::Index B = 64;
  for (;;) {
    tshard::detail::Index col = 0, c = 0;
    for (int d = 1; d < r - 1; ++d) {
      col += mid[d] * col_stride[d];
      c += mid[d] * c_stride[d];
    }
    const tshard::detail::Index ls = col_stride[r - 1], fs = c_stride[0];
    for (tshard::detail::Index i0 = 0; i0 < n0; i0 += B) {
      const tshard::detail::Index a_end = std::min(n0, i0 + B);
      for (tshard::detail::Index il = 0; il < nl; il += B) {
        const tshard::detail::Index b_end = std::min(nl, il + B);
        // The inner loop writes contiguously: along the last dim in C order, the first in ours.
        if constexpr (ToCOrder) {
          for (tshard::detail::Index a = i0; a < a_end; ++a) {
            T* __restrict__ dst = to + c + a * fs;
            const T* __restrict__ src = from + col + a;
            for (tshard::detail::Index b = il; b < b_end; ++b) dst[b] = src[b * ls];
          }
        } else {
          for (tshard::detail::Index b = il; b < b_end; ++b) {
            T* __restrict__ dst = to + col + b * ls;
            const T* __restrict__ src = from + c + b;
            for (tshard::detail::Index a = i0; a < a_end; ++a) dst[a] = src[a * fs];
          }
        }
      }
    }
    int d = 1;
    for (; d < r - 1; ++d) {
      if (++mid[d] < layout.valid[d]) break;
      mid[d] = 0;
    }
    if (d >= r - 1) break;
  }
}

template <class T>
void place_c_order(const T* box, const tshard::detail::ShardLayout& layout, T* out) {
  c_order_copy<T, false>(layout, box, out);
}

template <class T>
void pack_c_order(const T* in, const tshard::detail::ShardLayout& layout, T* box) {
  c_order_copy<T, true>(layout, in, box);
}

}  // namespace tshard::io::detail
