// Reshard plans cached per (mesh shape, global shape, specs, element size), so repeated
// reshards in a loop plan once, and the traffic of a move read from its cached plan.
#pragma once
#include <cstddef>
#include <memory>

#include "tshard/comm/mesh.hpp"
#include "tshard/core/layout_cache.hpp"
#include "tshard/reshard/plan.hpp"

namespace tshard::detail {

struct ReshardPlanQuestion;
inline std::shared_ptr<const ReshardPlan> cached_plan(const MeshShape& mesh, const SpecDesc& src, const SpecDesc& dst,
                                                      const Extents& shape, std::size_t element_bytes) {
  LayoutKey key(mesh);
  key.from = src;
  key.to = dst;
  key.from_shape = shape;
  key.element_bytes = element_bytes;
  return layout_cache<ReshardPlanQuestion, std::shared_ptr<const ReshardPlan>>().answer(
      key, [&] { return std::make_shared<const ReshardPlan>(plan_reshard(src, dst, shape, mesh, element_bytes)); });
}
inline std::shared_ptr<const ReshardPlan> cached_plan(MeshState& mesh, const SpecDesc& src, const SpecDesc& dst,
                                                      const Extents& shape, std::size_t element_bytes) {
  return cached_plan(mesh.shape(), src, dst, shape, element_bytes);
}

// The seconds and traffic of moving a tensor between two layouts by its cached plan (nothing
// where they are one).
inline Traffic reshard_traffic(const MeshShape& mesh, const SpecDesc& src, const SpecDesc& dst, const Extents& shape,
                               std::size_t element_bytes, int rank = -1) {
  if (src == dst) return {};
  const auto plan = cached_plan(mesh, src, dst, shape, element_bytes);
  return rank < 0 ? plan->traffic : predicted_traffic(*plan, shape, mesh, element_bytes, rank);
}

}  // namespace tshard::detail
