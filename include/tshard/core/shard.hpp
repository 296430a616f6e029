// Shard arithmetic exactly as docs/architecture.md's shard rule: a dim of size N split k ways has a
// padded local extent ceil(N/k); shard c starts at min(c*ceil(N/k), N) and holds
// clamp(N - c*ceil(N/k), 0, ceil(N/k)) valid elements (GSPMD's tiling, torch.chunk's rule).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>

#include "tshard/core/box_iterator.hpp"
#include "tshard/core/mesh_shape.hpp"
#include "tshard/core/spec_descriptor.hpp"

namespace tshard::detail {

constexpr Index padded_extent(Index n, Index parts) { return parts <= 1 ? n : (n + parts - 1) / parts; }
constexpr Index shard_offset(Index n, Index parts, Index c) { return std::min(c * padded_extent(n, parts), n); }
constexpr Index shard_valid(Index n, Index parts, Index c) {
  return std::clamp<Index>(n - c * padded_extent(n, parts), 0, padded_extent(n, parts));
}

// Number of shards of a split, and the shard coordinate of a rank: mixed radix of the
// rank's coordinates on the split's axes, first axis major.
inline Index split_parts(const DimSplit& s, const MeshShape& m) {
  Index k = 1;
  for (int i = 0; i < s.count; ++i) k *= m.sizes[s[i]];
  return k;
}
inline Index split_coord(const DimSplit& s, const MeshShape& m, const std::array<int, kMaxAxes>& coords) {
  Index c = 0;
  for (int i = 0; i < s.count; ++i) c = c * m.sizes[s[i]] + coords[s[i]];
  return c;
}

// The inverse of split_coord: writes shard coordinate k of a split into the coordinates of its axes.
inline void set_split_coord(const DimSplit& s, const MeshShape& m, Index k, std::array<int, kMaxAxes>& coords) {
  set_group_coords(m, s, s.count, k, coords);
}

// One dim of a shard: where it starts, how many valid elements it holds, its padded extent.
// A spec's layout along a dim depends only on the rank's coordinates on that dim's split axes,
// so the planner reasons dim by dim over those axes rather than over every rank.
struct DimBlock {
  Index offset = 0, valid = 0, padded = 0;
  Index end() const { return offset + valid; }
};
inline DimBlock dim_block(const DimSplit& s, Index n, const MeshShape& m, const std::array<int, kMaxAxes>& coords) {
  const Index k = split_parts(s, m), c = split_coord(s, m, coords);
  return {shard_offset(n, k, c), shard_valid(n, k, c), padded_extent(n, k)};
}

inline Index volume(const Extents& e, int rank) {
  Index v = 1;
  for (int d = 0; d < rank; ++d) v *= e[d];
  return v;
}

// Where one rank's shard sits: padded buffer extents, global offset and valid extents.
struct ShardLayout {
  int rank = 0;
  Extents padded{}, offset{}, valid{};
  Index padded_size() const { return volume(padded, rank); }
  Index valid_size() const { return volume(valid, rank); }
};

inline ShardLayout shard_layout(const SpecDesc& spec, const Extents& shape, const MeshShape& mesh,
                                const std::array<int, kMaxAxes>& coords) {
  ShardLayout l;
  l.rank = spec.rank;
  for (int d = 0; d < spec.rank; ++d) {
    Index k = split_parts(spec.dims[d], mesh);
    Index c = split_coord(spec.dims[d], mesh, coords);
    l.padded[d] = padded_extent(shape[d], k);
    l.offset[d] = shard_offset(shape[d], k, c);
    l.valid[d] = shard_valid(shape[d], k, c);
  }
  return l;
}

inline ShardLayout shard_layout_of_rank(const SpecDesc& spec, const Extents& shape, const MeshShape& mesh, int r) {
  return shard_layout(spec, shape, mesh, mesh.coords_of(r));
}

inline std::string shape_to_string(const Extents& shape, int rank) {
  std::string s = "[";
  for (int d = 0; d < rank; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

}  // namespace tshard::detail
