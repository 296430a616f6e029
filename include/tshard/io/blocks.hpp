// A rank's block in a file: whether it writes it (the first replica), and its valid box between
// our column-major padded buffer and C order (last index fastest), the order of C-order .npy
// files and of HDF5 datasets.
#pragma once
#include <algorithm>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/core/shard.hpp"

namespace tshard::io::detail {

// Whether this rank writes its block: it holds valid elements and is the first replica of
// them (coordinate 0 on every axis the tensor is not split over).
inline bool first_replica(const tshard::detail::MeshState& mesh, const tshard::detail::SpecDesc& spec,
                          const tshard::detail::ShardLayout& layout) {
  return layout.valid_size() != 0 && mesh.shape().first_outside(mesh.coords(), spec.split_axes());
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
  // Strides of every dim in both layouts; the middle dims are walked, dims 0 and r-1 transposed.
  using tshard::detail::Extents;
  using tshard::detail::Index;
  const Extents col_stride = tshard::detail::strides_of(layout.padded, r);
  Extents c_stride{};
  c_stride[r - 1] = 1;
  for (int d = r - 2; d >= 0; --d) c_stride[d] = c_stride[d + 1] * layout.valid[d + 1];
  // Tiles of 128 along the first dim by 8 along the last: the strided side of a tile touches 8
  // cache lines, which stay in L1 even when the stride is a power of two (with 64 x 64 tiles,
  // 64 lines 32 KiB apart shared one 8-way set: 4x slower here).
  constexpr Index BA = 128, BB = 8;
  const Index ls = col_stride[r - 1], fs = c_stride[0];
  tshard::detail::for_each_index(layout.valid, 1, r - 1, [&](const Extents& mid) {
    const Index col = tshard::detail::offset_of(mid, col_stride, 1, r - 1);
    const Index c = tshard::detail::offset_of(mid, c_stride, 1, r - 1);
    for (Index i0 = 0; i0 < n0; i0 += BA) {
      const Index a_end = std::min(n0, i0 + BA);
      for (Index il = 0; il < nl; il += BB) {
        const Index b_end = std::min(nl, il + BB);
        for (Index a = i0; a < a_end; ++a) {
          if constexpr (ToCOrder) {  // reads 8 lines strided by ls, writes a run of the C row
            T* __restrict__ dst = to + c + a * fs;
            const T* __restrict__ src = from + col + a;
            for (Index b = il; b < b_end; ++b) dst[b] = src[b * ls];
          } else {  // reads a run of the C row, writes 8 lines strided by ls
            T* __restrict__ dst = to + col + a;
            const T* __restrict__ src = from + c + a * fs;
            for (Index b = il; b < b_end; ++b) dst[b * ls] = src[b];
          }
        }
      }
    }
  });
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

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::io::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void c_order_copy<T, true>(const tshard::detail::ShardLayout&, \
    const T*, T*))
TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void c_order_copy<T, false>(const tshard::detail::ShardLayout&, \
    const T*, T*))
TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::io::detail
