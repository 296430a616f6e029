// The definitions of shape.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>

#include "tshard/ops/shape.hpp"

namespace tshard::detail {

TSHARD_FUNC bool find_reshape_is_local(const SpecDesc& from, const Extents& from_shape, const SpecDesc& to,
                                       const Extents& to_shape, const MeshShape& m) {
  auto inside = [&](const ShardLayout& old, Index linear, Index n) {
    while (n > 0) {  // walk the range in pieces along the old dim 0
      Index rest = linear, len = 0;
      for (int d = 0; d < from.rank; ++d) {
        const Index i = rest % from_shape[d] - old.offset[d];
        rest /= from_shape[d];
        if (i < 0 || i >= old.valid[d]) return false;
        if (d == 0) len = std::min(n, old.valid[0] - i);
      }
      if (from.rank == 0) len = n;
      linear += len;
      n -= len;
    }
    return true;
  };
  bool local = true;
  for (int r = 0; r < m.size() && local; ++r) {
    const ShardLayout old = shard_layout_of_rank(from, from_shape, m, r);
    const ShardLayout nl = shard_layout_of_rank(to, to_shape, m, r);
    if (nl.valid_size() == 0) continue;
    const Extents strides = strides_of(to_shape, to.rank);
    for_each_index(nl.valid, 1, to.rank, [&](const Extents& i) {
      Index linear = 0;
      for (int d = 0; d < to.rank; ++d) linear += (nl.offset[d] + i[d]) * strides[d];
      return local = inside(old, linear, to.rank ? nl.valid[0] : 1);
    });
  }
  return local;
}

struct ReshapeIsLocal;
TSHARD_FUNC bool reshape_is_local(const SpecDesc& from, const Extents& from_shape, const SpecDesc& to,
                                  const Extents& to_shape, const MeshShape& m) {
  LayoutKey key(m);
  key.from = from;
  key.from_shape = from_shape;
  key.to = to;
  key.to_shape = to_shape;
  return layout_cache<ReshapeIsLocal, bool>().answer(key, [&] { return find_reshape_is_local(from, from_shape, to, to_shape, m); });
}

}  // namespace tshard::detail
