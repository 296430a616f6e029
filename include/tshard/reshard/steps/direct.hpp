// Direct: each rank receives exactly the elements it lacks from one owner, point to point
// (reshard/redistribute.hpp), where that is cheaper than the staged collectives.
#pragma once
#include <algorithm>
#include <climits>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/reshard/steps/common.hpp"
#include "tshard/reshard/redistribute.hpp"

namespace tshard::detail {

template <class T>
void direct_step(const StepContext& c, const ReshardStep& st, const ShardLayout&, const ShardLayout&, const T* src,
                 T* dst) {
  redistribute<T>(c.mesh, st.from, c.shape, src, st.to, c.shape, dst, Extents{});
}

}  // namespace tshard::detail
