// partial -> R: an all-reduce over the partial axes.
#pragma once
#include <algorithm>
#include <climits>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/reshard/steps/common.hpp"

namespace tshard::detail {

template <class T>
void all_reduce_step(const StepContext& c, const ReshardStep& st, const ShardLayout& from, const ShardLayout&,
                     const T* src, T* dst) {
  all_reduce(c.mesh.group(st.axes), src, dst, from.padded_size(), reduce_op_of(st.from.partial));
}

}  // namespace tshard::detail
