// Reshard plans cached per (mesh shape, global shape, specs, element size), so repeated
// reshards in a loop plan once, and the traffic of a move read from its cached plan.
#pragma once
#include <cstddef>
#include <memory>

#include "tshard/comm/mesh.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/reshard/plan.hpp"

namespace tshard::detail {

std::shared_ptr<const ReshardPlan> cached_plan(const MeshShape& mesh, const SpecDesc& src, const SpecDesc& dst,
                                               const Extents& shape, std::size_t element_bytes);
std::shared_ptr<const ReshardPlan> cached_plan(MeshState& mesh, const SpecDesc& src, const SpecDesc& dst,
                                               const Extents& shape, std::size_t element_bytes);

// The seconds and traffic of moving a tensor between two layouts by its cached plan (nothing
// where they are one).
Traffic reshard_traffic(const MeshShape& mesh, const SpecDesc& src, const SpecDesc& dst, const Extents& shape,
                        std::size_t element_bytes, int rank = -1);

}  // namespace tshard::detail

#if TSHARD_HEADER_BODIES
#include "tshard/reshard/plan_cache-inl.hpp"
#endif
