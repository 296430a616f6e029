// The reshard executor: runs a plan's steps on one rank's buffers, instantiated once per
// element type. Each step reads the previous step's buffer and writes the next one; only the
// last writes into the caller's destination. What each kind of step does is in reshard/steps/.
#pragma once
#include <memory>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/reshard/plan_cache.hpp"
#include "tshard/reshard/steps/all_gather.hpp"
#include "tshard/reshard/steps/all_reduce.hpp"
#include "tshard/reshard/steps/all_to_all.hpp"
#include "tshard/reshard/steps/direct.hpp"
#include "tshard/reshard/steps/local.hpp"
#include "tshard/reshard/steps/reduce_scatter.hpp"

namespace tshard::detail {

// Runs one step of a plan on this rank.
template <class T>
void run_step(const StepContext& c, const ReshardStep& st, const T* src, T* dst) {
  const ShardLayout from = c.mine(st.from), to = c.mine(st.to);
  switch (st.kind) {
    case StepKind::Local: return local_step(c, st, from, to, src, dst);
    case StepKind::AllReduce: return all_reduce_step(c, st, from, to, src, dst);
    case StepKind::AllGather: return all_gather_step(c, st, from, to, src, dst);
    case StepKind::AllToAll: return all_to_all_step(c, st, from, to, src, dst);
    case StepKind::ReduceScatter: return reduce_scatter_step(c, st, from, to, src, dst);
    case StepKind::Direct: return direct_step(c, st, from, to, src, dst);
  }
}

// dst (laid out for `dst_spec`) = src (laid out for `src_spec`), by the cached plan.
template <class T>
void execute_reshard(MeshState& mesh, const SpecDesc& src_spec, const SpecDesc& dst_spec, const Extents& shape,
                     const T* src, T* dst) {
  auto plan = cached_plan(mesh, src_spec, dst_spec, shape, sizeof(T));
  const StepContext context{mesh, shape};
  std::unique_ptr<Scratch<T>> held[2];
  const T* cur = src;
  for (std::size_t i = 0; i < plan->steps.size(); ++i) {
    const ReshardStep& st = plan->steps[i];
    T* out = dst;
    if (i + 1 < plan->steps.size()) {
      auto l = shard_layout(st.to, shape, mesh.shape(), mesh.coords());
      held[i % 2] = std::make_unique<Scratch<T>>(static_cast<std::size_t>(l.padded_size()));
      out = held[i % 2]->data();
    }
    run_step(context, st, cur, out);
    cur = out;
  }
}

}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void execute_reshard<T>(MeshState&, const SpecDesc&, \
    const SpecDesc&, const Extents&, const T*, T*))
TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
