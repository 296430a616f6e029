// visualize(t): which rank holds which block of a rank-1 or rank-2 tensor, as a text grid
// printed on mesh rank 0 (like jax.debug.visualize_array_sharding); visualize_svg(t) draws the
// same as an SVG picture, blocks to scale, one colour per rank set.
#pragma once
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {

namespace detail {
std::string sharding_picture(const SpecDesc& spec, const Extents& shape, const MeshShape& mesh);
// The SVG picture: one rectangle per block, sized by its valid extent, filled by the hue of its
// first rank, labelled with its ranks and index ranges. Empty blocks are listed below.
std::string sharding_svg(const SpecDesc& spec, const Extents& shape, const MeshShape& mesh);
}  // namespace detail

// The picture as SVG on every rank; with a path, mesh rank 0 also writes it there.
template <class T, class M, class S, class P>
std::string visualize_svg(const ShardedTensor<T, M, S, P>& t, const std::string& path = "") {
  static_assert(S::rank == 1 || S::rank == 2, "tshard: visualize_svg draws rank-1 and rank-2 tensors");
  std::string svg = detail::sharding_svg(t.spec_desc, detail::extents_of(t), t.mesh().shape());
  if (!path.empty() && t.mesh().rank() == 0) std::ofstream(path) << svg;
  return svg;
}

// Prints the picture on mesh rank 0 and returns it on every rank.
template <class T, class M, class S, class P>
std::string visualize(const ShardedTensor<T, M, S, P>& t, std::ostream& os = std::cout) {
  static_assert(S::rank == 1 || S::rank == 2, "tshard: visualize draws rank-1 and rank-2 tensors");
  std::string pic = detail::sharding_picture(t.spec_desc, detail::extents_of(t), t.mesh().shape());
  if (t.mesh().rank() == 0) os << pic << std::flush;
  return pic;
}

// The same under a title line "<title>:".
template <class T, class M, class S, class P>
std::string visualize(const ShardedTensor<T, M, S, P>& t, const std::string& title, std::ostream& os = std::cout) {
  if (t.mesh().rank() == 0) os << title << ":\n";
  return visualize(t, os);
}

}  // namespace tshard

#if TSHARD_HEADER_BODIES
#include "tshard/debug/visualize-inl.hpp"
#endif
