// The run-time shape of a mesh: axis names and sizes, and rank <-> coordinate arithmetic
// (row-major, last axis fastest: the fixed semantics in docs/architecture.md). No MPI here.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tshard/core/error.hpp"
#include "tshard/core/kernel_instances.hpp"

namespace tshard::detail {

inline constexpr int kMaxAxes = 8;
inline constexpr int kMaxRank = 8;

struct MeshShape {
  std::vector<std::string> names;
  std::vector<int> sizes;

  int axes() const { return int(sizes.size()); }
  // The size of axis a (in the mesh's axis order): mesh.shape()[0].
  int operator[](int a) const { return sizes.at(std::size_t(a)); }
  int size() const {
    int p = 1;
    for (int s : sizes) p *= s;
    return p;
  }
  // Coordinates of a rank: row-major, last axis fastest.
  std::array<int, kMaxAxes> coords_of(int rank) const {
    std::array<int, kMaxAxes> c{};
    for (int a = axes() - 1; a >= 0; --a) {
      c[a] = rank % sizes[a];
      rank /= sizes[a];
    }
    return c;
  }
  int rank_of(const std::array<int, kMaxAxes>& c) const {
    int r = 0;
    for (int a = 0; a < axes(); ++a) r = r * sizes[a] + c[a];
    return r;
  }
  // Whether ranks a and b have the same coordinates on every axis outside the bit mask `axes`.
  // With a spec's split axes: whether they hold blocks of the same copy of the tensor.
  bool same_outside(int a, int b, std::uint32_t axes) const {
    const auto ca = coords_of(a), cb = coords_of(b);
    for (int x = 0; x < this->axes(); ++x)
      if (!(axes & (1u << x)) && ca[x] != cb[x]) return false;
    return true;
  }
  // Whether coordinates c are 0 on every axis outside `axes`: the first copy of the tensor.
  bool first_outside(const std::array<int, kMaxAxes>& c, std::uint32_t axes) const {
    for (int x = 0; x < this->axes(); ++x)
      if (!(axes & (1u << x)) && c[x] != 0) return false;
    return true;
  }
  std::string describe() const;
};

// The axes set in a bit mask, in order.
inline std::vector<int> axes_of_mask(std::uint32_t mask, int axes) {
  std::vector<int> v;
  for (int a = 0; a < axes; ++a)
    if (mask & (1u << a)) v.push_back(a);
  return v;
}

// The number of ranks in a group over `axes`: the product of their sizes.
inline int group_size(const MeshShape& m, const std::vector<int>& axes) {
  int k = 1;
  for (int a : axes) k *= m.sizes[a];
  return k;
}

// Writes member g of the group over axes[0..count) into coords: the mixed radix of its
// coordinates on those axes, first axis major, as shard numbers count. `axes` is any indexable
// list of axis numbers (a std::vector<int>, a DimSplit).
template <class Axes>
void set_group_coords(const MeshShape& m, const Axes& axes, int count, long g, std::array<int, kMaxAxes>& coords) {
  for (int i = count - 1; i >= 0; --i) {
    coords[axes[i]] = int(g % m.sizes[axes[i]]);
    g /= m.sizes[axes[i]];
  }
}

// Coordinates of group rank g of the group over `axes`, with the other coordinates from `base`.
inline std::array<int, kMaxAxes> group_member_coords(const MeshShape& m, const std::vector<int>& axes, long g,
                                                     std::array<int, kMaxAxes> base) {
  set_group_coords(m, axes, int(axes.size()), g, base);
  return base;
}

// Calls f(coords) for every combination of coordinates on the axes of the bit mask `axes`
// (last axis fastest), the others as in `base`: the distinct groups of what depends on those
// axes alone, which is fewer than the ranks.
template <class F>
void for_each_coords(const MeshShape& m, std::uint32_t axes, std::array<int, kMaxAxes> base, F&& f) {
  const std::vector<int> a = axes_of_mask(axes, m.axes());
  for (int x : a) base[x] = 0;
  while (true) {
    f(static_cast<const std::array<int, kMaxAxes>&>(base));
    int i = int(a.size()) - 1;
    while (i >= 0 && ++base[a[i]] == m.sizes[a[i]]) base[a[i--]] = 0;
    if (i < 0) return;
  }
}

// n as the product of k factors as close to each other as possible, largest first (the MPI
// standard's rule for MPI_Dims_create): 12 over 2 is {4, 3}, 16 over 3 is {4, 2, 2}, 7 over 2 is
// {7, 1}, 72 over 2 is {9, 8}.
std::vector<int> balanced_factors(int n, int k);

// Resolve the -1 entries so that the product equals `ranks`: the rest of the ranks shared among
// them by balanced_factors, in axis order. MeshError when impossible. Depends only on global
// facts, so every rank throws alike.
std::vector<int> infer_mesh_sizes(std::vector<int> sizes, int ranks, const std::vector<std::string>& names);

}  // namespace tshard::detail

#if TSHARD_HEADER_BODIES
#include "tshard/core/mesh_shape-inl.hpp"
#endif
