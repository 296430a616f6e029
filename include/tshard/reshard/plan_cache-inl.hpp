// The definitions of plan_cache.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <memory>

#include "tshard/reshard/plan_cache.hpp"
#include "tshard/core/layout_cache.hpp"

namespace tshard::detail {

struct ReshardPlanQuestion;

TSHARD_FUNC std::shared_ptr<const ReshardPlan> cached_plan(const MeshShape& mesh, const SpecDesc& src,
                                                           const SpecDesc& dst, const Extents& shape,
                                                           std::size_t element_bytes) {
  LayoutKey key(mesh);
  key.from = src;
  key.to = dst;
  key.from_shape = shape;
  key.element_bytes = element_bytes;
  return layout_cache<ReshardPlanQuestion, std::shared_ptr<const ReshardPlan>>().answer(
      key, [&] { return std::make_shared<const ReshardPlan>(plan_reshard(src, dst, shape, mesh, element_bytes)); });
}
TSHARD_FUNC std::shared_ptr<const ReshardPlan> cached_plan(MeshState& mesh, const SpecDesc& src, const SpecDesc& dst,
                                                           const Extents& shape, std::size_t element_bytes) {
  return cached_plan(mesh.shape(), src, dst, shape, element_bytes);
}

TSHARD_FUNC Traffic reshard_traffic(const MeshShape& mesh, const SpecDesc& src, const SpecDesc& dst,
                                    const Extents& shape, std::size_t element_bytes, int rank) {
  if (src == dst) return {};
  const auto plan = cached_plan(mesh, src, dst, shape, element_bytes);
  return rank < 0 ? plan->traffic : predicted_traffic(*plan, shape, mesh, element_bytes, rank);
}

}  // namespace tshard::detail
