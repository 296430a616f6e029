// Reshard plans cached per (mesh shape, global shape, specs, element size), so repeated
// reshards in a loop plan once, and the traffic of a move read from its cached plan.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "tshard/comm/mesh.hpp"
#include "tshard/reshard/plan.hpp"

namespace tshard::detail {

inline std::shared_ptr<const ReshardPlan> cached_plan(const MeshShape& mesh, const SpecDesc& src, const SpecDesc& dst,
                                                      const Extents& shape, std::size_t element_bytes) {
  using Key = std::tuple<std::string, std::string, std::string, Extents, std::size_t>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const ReshardPlan>> cache;
  Key key{mesh.describe(), src.to_string(mesh), dst.to_string(mesh), shape, element_bytes};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end() && it->second) return it->second;
  if (cache.size() > 4096) cache.clear();
  auto p = std::make_shared<const ReshardPlan>(plan_reshard(src, dst, shape, mesh, element_bytes));
  cache[key] = p;
  return p;
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
