// A rank's block in a file: whether it writes it (the first replica), and its valid box between
// our column-major padded buffer and C order (last index fastest), the order of C-order .npy
// files and of HDF5 datasets.
#pragma once
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

// f(column-major padded index, C-order index in the box) for every valid element.
template <class F>
void for_each_c_order(const tshard::detail::ShardLayout& layout, F&& f) {
  const int r = layout.rank;
  tshard::detail::Extents i{};
  const tshard::detail::Index n = layout.valid_size();
  for (tshard::detail::Index k = 0; k < n; ++k) {
    tshard::detail::Index at = 0, stride = 1;
    for (int d = 0; d < r; ++d) {
      at += i[d] * stride;
      stride *= layout.padded[d];
    }
    f(at, k);
    for (int d = r - 1; d >= 0; --d) {  // C order: the last index moves fastest
      if (++i[d] < layout.valid[d]) break;
      i[d] = 0;
    }
  }
}

template <class T>
void place_c_order(const T* box, const tshard::detail::ShardLayout& layout, T* out) {
  for_each_c_order(layout, [&](tshard::detail::Index at, tshard::detail::Index k) { out[at] = box[k]; });
}

template <class T>
void pack_c_order(const T* in, const tshard::detail::ShardLayout& layout, T* box) {
  for_each_c_order(layout, [&](tshard::detail::Index at, tshard::detail::Index k) { box[k] = in[at]; });
}

}  // namespace tshard::io::detail
