// What every reshard step's executor shares: this rank's place in the mesh, the tensor's
// global shape, and the layouts of the members of a step's group. One file per step kind
// beside this one (all_gather.hpp, all_to_all.hpp, reduce_scatter.hpp, all_reduce.hpp,
// local.hpp, direct.hpp) runs it: checks, then pack, communicate and unpack through comm/.
#pragma once
#include <vector>

#include "tshard/comm/collectives.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/core/box_copy.hpp"
#include "tshard/core/shard.hpp"
#include "tshard/reshard/step.hpp"

namespace tshard::detail {

struct StepContext {
  MeshState& mesh;
  Extents shape;

  // This rank's block under spec s.
  ShardLayout mine(const SpecDesc& s) const { return shard_layout(s, shape, mesh.shape(), mesh.coords()); }
  // The block under s of member g of this rank's group over `axes`.
  ShardLayout member(const SpecDesc& s, const std::vector<int>& axes, int g) const {
    return shard_layout(s, shape, mesh.shape(), group_member_coords(mesh.shape(), axes, g, mesh.coords()));
  }
  int group_size(const std::vector<int>& axes) const { return detail::group_size(mesh.shape(), axes); }
};

// A block with dim d's extent, offset and valid length taken from another block.
inline ShardLayout with_dim_of(ShardLayout l, const ShardLayout& o, int d) {
  l.padded[d] = o.padded[d];
  l.offset[d] = o.offset[d];
  l.valid[d] = o.valid[d];
  return l;
}

// True when the blocks along d are contiguous in memory (every later dim has extent 1).
inline bool slowest_dim(const ShardLayout& l, int d) {
  for (int e = d + 1; e < l.rank; ++e)
    if (l.padded[e] != 1) return false;
  return true;
}

}  // namespace tshard::detail
