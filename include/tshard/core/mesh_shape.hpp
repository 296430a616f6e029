// The run-time shape of a mesh: axis names and sizes, and rank <-> coordinate arithmetic
// (row-major, last axis fastest, as DESIGN fixes). No MPI here.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tshard/core/error.hpp"

namespace tshard::detail {

inline constexpr int kMaxAxes = 8;
inline constexpr int kMaxRank = 8;

struct MeshShape {
  std::vector<std::string> names;
  std::vector<int> sizes;

  int axes() const { return int(sizes.size()); }
  int size() const {
    int p = 1;
    for (int s : sizes) p *= s;
    return p;
  }
  // Coordinates of a rank: row-major, last axis fastest.
  std::array<int, kMaxAxes> coords_of(int rank) const {
    std::array<int, kMaxAxes> c{};
    for (int a = axes() - 1; a >= 0; --a) {
      c[a] = rank % sizes[a];
      rank /= sizes[a];
    }
    return c;
  }
  int rank_of(const std::array<int, kMaxAxes>& c) const {
    int r = 0;
    for (int a = 0; a < axes(); ++a) r = r * sizes[a] + c[a];
    return r;
  }
  std::string describe() const {
    std::string s = "(";
    for (int a = 0; a < axes(); ++a) {
      if (a) s += ", ";
      s += names[a] + "=" + std::to_string(sizes[a]);
    }
    return s + ")";
  }
};

// Resolve one -1 entry so that the product equals `ranks`; MeshError when impossible.
// Depends only on global facts, so every rank throws alike.
inline std::vector<int> infer_mesh_sizes(std::vector<int> sizes, int ranks,
                                         const std::vector<std::string>& names) {
  auto describe = [&] {
    std::string s = "{";
    for (std::size_t a = 0; a < sizes.size(); ++a)
      s += (a ? ", " : "") + names[a] + "=" + std::to_string(sizes[a]);
    return s + "}";
  };
  int infer = -1;
  long known = 1;
  for (std::size_t a = 0; a < sizes.size(); ++a) {
    if (sizes[a] == -1 && infer < 0) {
      infer = int(a);
    } else if (sizes[a] <= 0) {
      throw MeshError("tshard::Mesh: axis sizes must be positive (one may be -1 to infer it), got " +
                      describe());
    } else {
      known *= sizes[a];
    }
  }
  if (infer >= 0) {
    if (known == 0 || ranks % known != 0)
      throw MeshError("tshard::Mesh: cannot infer the -1 axis of " + describe() + " for " +
                      std::to_string(ranks) + " ranks");
    sizes[infer] = int(ranks / known);
    known = ranks;
  }
  if (known != ranks)
    throw MeshError("tshard::Mesh: the axis sizes " + describe() + " multiply to " +
                    std::to_string(known) + ", but the communicator has " +
                    std::to_string(ranks) + " ranks");
  return sizes;
}

}  // namespace tshard::detail
