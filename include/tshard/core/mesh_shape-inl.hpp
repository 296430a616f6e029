// The definitions of mesh_shape.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
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

TSHARD_FUNC std::vector<int> infer_mesh_sizes(std::vector<int> sizes, int ranks,
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
