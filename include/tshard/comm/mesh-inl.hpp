// The definitions of mesh.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include "tshard/comm/mpi.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tshard/comm/mesh.hpp"

namespace tshard::detail {

TSHARD_FUNC MeshState::MeshState(MPI_Comm parent, std::vector<std::string> names, std::vector<int> sizes) {
  int ranks = 0;
  MPI_Comm_size(parent, &ranks);
  // Checked before any collective: every rank sees the same sizes and throws alike.
  shape_.sizes = infer_mesh_sizes(std::move(sizes), ranks, names);
  shape_.names = std::move(names);
  MPI_Comm_dup(parent, &comm_);
  MPI_Comm_rank(comm_, &rank_);
  coords_ = shape_.coords_of(rank_);
  // Every subset of axes in mesh order, created up front (each is one MPI_Comm_split).
  const int n = shape_.axes();
  for (unsigned mask = 1; mask < (1u << n); ++mask) {
    std::vector<int> axes;
    for (int a = 0; a < n; ++a)
      if (mask & (1u << a)) axes.push_back(a);
    group(axes);
  }
}

TSHARD_FUNC MeshState::~MeshState() {
  int down = 0;
  MPI_Finalized(&down);
  if (down) return;
  for (auto& [axes, c] : groups_) MPI_Comm_free(&c);
  MPI_Comm_free(&comm_);
}

TSHARD_FUNC MPI_Comm MeshState::group(const std::vector<int>& axes) {
  if (axes.empty()) return MPI_COMM_SELF;
  auto it = groups_.find(axes);
  if (it != groups_.end()) return it->second;
  std::uint32_t in = 0;
  int key = 0;
  for (int a : axes) {
    in |= 1u << a;
    key = key * shape_.sizes[a] + coords_[a];
  }
  int color = 0;
  for (int a = 0; a < shape_.axes(); ++a)
    if (!(in & (1u << a))) color = color * shape_.sizes[a] + coords_[a];
  MPI_Comm c;
  MPI_Comm_split(comm_, color, key, &c);
  groups_.emplace(axes, c);
  return c;
}

TSHARD_FUNC MPI_Comm MeshState::group(const DimSplit& split, int first) {
  std::vector<int> axes;
  for (int i = first; i < split.count; ++i) axes.push_back(split[i]);
  return group(axes);
}

TSHARD_FUNC MPI_Comm MeshState::group_of_mask(std::uint32_t mask) {
  std::vector<int> axes;
  for (int a = 0; a < shape_.axes(); ++a)
    if (mask & (1u << a)) axes.push_back(a);
  return group(axes);
}

TSHARD_FUNC std::shared_ptr<const NodeGroups> MeshState::node_groups(std::uint32_t mask) {
  auto& g = node_groups_[mask];
  if (!g) g = split_by_node(group_of_mask(mask));
  return g;
}

}  // namespace tshard::detail
