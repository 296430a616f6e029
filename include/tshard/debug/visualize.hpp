// visualize(t): which rank holds which block of a rank-1 or rank-2 tensor, as a text grid
// printed on mesh rank 0 (like jax.debug.visualize_array_sharding).
#pragma once
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {

namespace detail {
inline std::string sharding_picture(const SpecDesc& spec, const Extents& shape, const MeshShape& mesh) {
  const int rank = spec.rank;
  const Index rows = rank >= 1 ? split_parts(spec.dims[0], mesh) : 1;
  const Index cols = rank == 2 ? split_parts(spec.dims[1], mesh) : 1;
  std::vector<std::string> cell(static_cast<std::size_t>(rows * cols));
  for (int r = 0; r < mesh.size(); ++r) {
    auto c = mesh.coords_of(r);
    Index i = rank >= 1 ? split_coord(spec.dims[0], mesh, c) : 0;
    Index j = rank == 2 ? split_coord(spec.dims[1], mesh, c) : 0;
    std::string& s = cell[static_cast<std::size_t>(i * cols + j)];
    s += (s.empty() ? "" : ",") + std::to_string(r);
  }
  auto range = [&](int d, Index c, Index parts) {
    Index off = shard_offset(shape[d], parts, c), n = shard_valid(shape[d], parts, c);
    return n == 0 ? std::string("empty") : std::to_string(off) + ".." + std::to_string(off + n - 1);
  };
  std::vector<std::string> row_label(static_cast<std::size_t>(rows)), col_label(static_cast<std::size_t>(cols));
  for (Index i = 0; i < rows; ++i) row_label[i] = rank >= 1 ? "[" + range(0, i, rows) + "]" : "";
  for (Index j = 0; j < cols; ++j) col_label[j] = rank == 2 ? "[" + range(1, j, cols) + "]" : "";
  std::size_t w = 0, lw = 0;
  for (auto& s : cell) w = std::max(w, s.size() + 6);
  for (auto& s : col_label) w = std::max(w, s.size());
  for (auto& s : row_label) lw = std::max(lw, s.size());
  auto pad = [](std::string s, std::size_t n) {
    std::size_t left = (n - std::min(n, s.size())) / 2;
    return std::string(left, ' ') + s + std::string(n - std::min(n, s.size()) - left, ' ');
  };
  std::string out = "tensor " + shape_to_string(shape, rank) + " " + spec.to_string(mesh) + " on mesh " +
                    mesh.describe() + "\n";
  if (spec.partial != PartialKind::None) out += "(partial: each cell's ranks hold values still to be combined)\n";
  std::string rule = std::string(lw, ' ') + "+";
  for (Index j = 0; j < cols; ++j) rule += std::string(w, '-') + "+";
  if (rank == 2) {
    out += std::string(lw + 1, ' ');
    for (Index j = 0; j < cols; ++j) out += pad(col_label[j], w) + " ";
    out += "\n";
  }
  out += rule + "\n";
  for (Index i = 0; i < rows; ++i) {
    out += std::string(lw, ' ') + "|";
    for (Index j = 0; j < cols; ++j) out += pad("", w) + "|";
    out += "\n" + pad(row_label[i], lw) + "|";
    for (Index j = 0; j < cols; ++j) out += pad("ranks " + cell[static_cast<std::size_t>(i * cols + j)], w) + "|";
    out += "\n" + rule + "\n";
  }
  return out;
}
}  // namespace detail

// Prints the picture on mesh rank 0 and returns it on every rank.
template <class T, class M, class S, class P>
std::string visualize(const ShardedTensor<T, M, S, P>& t, std::ostream& os = std::cout) {
  static_assert(S::rank == 1 || S::rank == 2, "tshard: visualize draws rank-1 and rank-2 tensors");
  std::string pic = detail::sharding_picture(t.spec_desc, t.extents(), t.mesh().shape());
  if (t.mesh().rank() == 0) os << pic << std::flush;
  return pic;
}

}  // namespace tshard
