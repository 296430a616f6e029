// A gradient contribution added into a parameter's gradient, with the data-parallel sum left to
// an owner: data parallelism's deferral (PyTorch DDP's), whatever layout the contribution comes
// in. ts::ad::backward adds every parameter's cotangent through it.
#pragma once
#include <cstdint>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/simulated_timing.hpp"
#include "tshard/reshard/reshard.hpp"

namespace tshard::parallel::detail {

using tshard::detail::Extents;
using tshard::detail::Index;
using tshard::detail::SpecDesc;

// grad (laid out as `gd`) += a contribution laid out as `cd` (maybe partial). Sums over the
// axes in `deferred` are left to the owner: a partial sum stays partial over the deferred axes
// it names (`kept`), summed here over its non-deferred axes only; along the deferred axes it
// does not name, the contribution is complete and is added on their first rank only (adding
// zeros elsewhere keeps the owner's sum exact). A gradient split over a deferred axis has
// nothing to defer.
template <class T>
void accumulate_gradient(tshard::detail::MeshState& mesh, T* grad, const SpecDesc& gd, const Extents& shape, const T* c,
                         const SpecDesc& cd, std::uint32_t deferred, const char* op) {
  const auto layout = tshard::detail::shard_layout(gd, shape, mesh.shape(), mesh.coords());
  auto add = [&](const T* src) {
    tshard::detail::sampled("gradient sum", [&] {
      tshard::detail::for_each_valid_run(layout, [&](Index off, Index n) {
        for (Index i = off; i < off + n; ++i) grad[i] += src[i];
      });
    }, layout);
  };
  if (deferred && !(gd.split_axes() & deferred)) {
    const std::uint32_t kept = cd.partial == tshard::detail::PartialKind::Sum ? cd.partial_axes & deferred : 0u;
    SpecDesc want = gd;
    if (kept) {
      want.partial = tshard::detail::PartialKind::Sum;
      want.partial_axes = kept;
    }
    bool first = true;
    for (int a = 0; a < mesh.shape().axes(); ++a)
      if ((deferred & ~kept & (1u << a)) && mesh.coords()[a] != 0) first = false;
    if (cd == want) {
      if (first) add(c);
      return;
    }
    const auto aligned = tshard::detail::implicit_reshard(mesh, cd, want, shape, c, op);
    if (first) add(aligned.data);
    return;
  }
  const auto aligned = tshard::detail::implicit_reshard(mesh, cd, gd, shape, c, op);
  add(aligned.data);
}

}  // namespace tshard::parallel::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::parallel::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void accumulate_gradient<T>(tshard::detail::MeshState&, T*, \
    const SpecDesc&, const Extents&, const T*, const SpecDesc&, std::uint32_t, const char*))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::parallel::detail
