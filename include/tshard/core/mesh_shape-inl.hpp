// The definitions of mesh_shape.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "tshard/core/mesh_shape.hpp"

namespace tshard::detail {

TSHARD_FUNC std::string MeshShape::describe() const {
  std::string s = "(";
  for (int a = 0; a < axes(); ++a) {
    if (a) s += ", ";
    s += names[a] + "=" + std::to_string(sizes[a]);
  }
  return s + ")";
}

TSHARD_FUNC std::vector<int> balanced_factors(int n, int k) {
  // Depth-first over non-increasing factors, keeping the lexicographically least: the largest
  // factor as small as it can be, then the next. This is the MPI standard's "as close to each
  // other as possible"; Open MPI's greedy MPI_Dims_create gives the same up to 71 ranks, and a
  // less even grid for some larger counts (72 over 2: 12 x 6, where this gives 9 x 8).
  std::vector<int> best, current;
  auto better = [](const std::vector<int>& a, const std::vector<int>& b) { return b.empty() || a < b; };
  auto search = [&](auto&& self, int left, int slots, int cap) -> void {
    if (slots == 1) {
      if (left > cap) return;
      current.push_back(left);
      if (better(current, best)) best = current;
      current.pop_back();
      return;
    }
    for (int f = std::min(cap, left); f >= 1; --f) {
      if (left % f != 0) continue;
      long power = 1;  // f^slots < left: the rest cannot stay at or under f
      for (int s = 0; s < slots && power < left; ++s) power *= f;
      if (power < left) break;
      if (!best.empty() && f > best.front()) continue;
      current.push_back(f);
      self(self, left / f, slots - 1, f);
      current.pop_back();
    }
  };
  search(search, n, k, n);
  return best;
}

TSHARD_FUNC std::vector<int> infer_mesh_sizes(std::vector<int> sizes, int ranks,
                                              const std::vector<std::string>& names) {
  auto describe = [&] {
    std::string s = "{";
    for (std::size_t a = 0; a < sizes.size(); ++a)
      s += (a ? ", " : "") + names[a] + "=" + std::to_string(sizes[a]);
    return s + "}";
  };
  std::vector<std::size_t> free;
  long known = 1;
  for (std::size_t a = 0; a < sizes.size(); ++a) {
    if (sizes[a] == -1) {
      free.push_back(a);
    } else if (sizes[a] <= 0) {
      throw MeshError("tshard::Mesh: axis sizes must be positive (-1 to infer them), got " + describe());
    } else {
      known *= sizes[a];
    }
  }
  if (!free.empty()) {
    if (ranks % known != 0)
      throw MeshError("tshard::Mesh: cannot infer the -1 axes of " + describe() + " for " + std::to_string(ranks) +
                      " ranks: the other axes multiply to " + std::to_string(known) + ", which does not divide it");
    const std::vector<int> balanced = balanced_factors(int(ranks / known), int(free.size()));
    for (std::size_t i = 0; i < free.size(); ++i) sizes[free[i]] = balanced[i];
    known = ranks;
  }
  if (known != ranks)
    throw MeshError("tshard::Mesh: the axis sizes " + describe() + " multiply to " +
                    std::to_string(known) + ", but the communicator has " +
                    std::to_string(ranks) + " ranks");
  return sizes;
}

}  // namespace tshard::detail
