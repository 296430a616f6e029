// R -> S, or a plain copy: every rank keeps a slice of its own block, nothing moves.
#pragma once
#include <algorithm>
#include <climits>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/reshard/steps/common.hpp"

namespace tshard::detail {

template <class T>
void local_step(const StepContext&, const ReshardStep&, const ShardLayout& from, const ShardLayout& to, const T* src,
                T* dst) {
  copy_overlap(src, from, dst, to);
}

}  // namespace tshard::detail
