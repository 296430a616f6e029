// The one N-D box iterator (the role of Eigen's TensorBlockIO): every loop over a box of a
// column-major buffer (copies, fills, reductions, stencils, window boxes) walks it with
// for_each_index, merging the leading dims that are contiguous in every buffer into one run.
#pragma once
#include <array>
#include <cstdint>
#include <type_traits>

#include "tshard/core/mesh_shape.hpp"

namespace tshard::detail {

using Index = std::int64_t;
using Extents = std::array<Index, kMaxRank>;

// Whether a box has no element: an extent of 0 (or less) in one of its dims.
inline bool empty_box(const Extents& extent, int rank) {
  for (int d = 0; d < rank; ++d)
    if (extent[d] <= 0) return true;
  return false;
}

// Calls f(idx) for every index of the box [0, extent) over dims [first, rank), dim `first`
// fastest (column-major order); entries below `first` stay 0. Nothing when one of those dims is
// empty; one call when first >= rank (a rank-0 box, or a box that is one run). An f that
// returns bool stops the walk by returning false.
template <class F>
void for_each_index(const Extents& extent, int first, int rank, F&& f) {
  for (int d = first; d < rank; ++d)
    if (extent[d] <= 0) return;
  Extents idx{};
  for (;;) {
    if constexpr (std::is_same_v<std::invoke_result_t<F&, const Extents&>, bool>) {
      if (!f(static_cast<const Extents&>(idx))) return;
    } else {
      f(static_cast<const Extents&>(idx));
    }
    int d = first;
    for (; d < rank; ++d) {
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
    }
    if (d >= rank) return;
  }
}

// Column-major strides of a buffer of extents `dims`.
inline Extents strides_of(const Extents& dims, int rank) {
  Extents s{};
  Index t = 1;
  for (int d = 0; d < rank; ++d) {
    s[d] = t;
    t *= dims[d];
  }
  return s;
}

// The linear offset of index idx over dims [first, rank).
inline Index offset_of(const Extents& idx, const Extents& strides, int first, int rank) {
  Index o = 0;
  for (int d = first; d < rank; ++d) o += idx[d] * strides[d];
  return o;
}

// The first dim that starts a new run when a box of `extent` is walked in buffers of extents
// `dims...`: dim 0 always runs, and each further dim joins the run while the box covers the dim
// below it whole in every buffer. The run is then volume(extent, first) elements.
template <class... Dims>
int first_outer_dim(const Extents& extent, int rank, const Dims&... dims) {
  if (rank == 0) return 0;
  int first = 1;
  while (first < rank && ((extent[first - 1] == dims[first - 1]) && ...)) ++first;
  return first;
}

}  // namespace tshard::detail
