// Ways to make a ShardedTensor: from a global tensor every rank has (distribute), from shards a
// code already has (from_local), from a root's tensor (scatter), from a function of the global
// index (from_function), zeros, and reproducible random values (random).
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tshard/comm/collectives.hpp"
#include "tshard/comm/failure.hpp"
#include "tshard/core/box_copy.hpp"
#include "tshard/core/random_bits.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {

namespace detail {

template <class G>
concept EigenTensorLike = requires(const G& g) {
  typename G::Scalar;
  { G::NumDimensions };
  { G::Layout };
  g.data();
  g.dimensions();
};

// The shape argument of a factory: a braced list with exactly one entry per dim.
template <int Rank, std::size_t N>
std::array<Eigen::Index, Rank> shape_argument(const Eigen::Index (&shape)[N]) {
  static_assert(N == static_cast<std::size_t>(Rank), "tshard: the shape has a different number of entries than the tensor has dims");
  std::array<Eigen::Index, Rank> a{};
  for (int d = 0; d < Rank; ++d) a[d] = shape[d];
  return a;
}

template <class M, class Shape>
void check_shape_nonnegative(const M& mesh, const Shape& shape, const char* op, const std::string& spec) {
  for (auto n : shape)
    if (n < 0) {
      detail::Extents e{};
      for (std::size_t d = 0; d < shape.size(); ++d) e[d] = shape[d];
      throw ShapeError(std::string("tshard::") + op + ": negative extent in shape " +
                       shape_to_string(e, int(shape.size())) + " " + spec + " on mesh " + mesh.shape().describe());
    }
}

// One all-reduce: every rank's shape (and a rank-local flag) agree. Throws E on every rank.
template <class M, std::size_t N>
void check_shape_agrees(const M& mesh, const std::array<Eigen::Index, N>& shape, bool local_ok,
                        const char* op, const std::string& spec, const std::string& local_problem = "") {
  std::array<std::int64_t, 2 * N + 1> v{};
  for (std::size_t d = 0; d < N; ++d) {
    v[d] = shape[d];
    v[N + d] = -shape[d];
  }
  v[2 * N] = local_ok ? 0 : 1;
  std::array<std::int64_t, 2 * N + 1> r{};
  all_reduce(mesh.comm(), v.data(), r.data(), Index(v.size()), ReduceOp::Max);
  Extents mine{}, hi{}, lo{};
  bool differ = false;
  for (std::size_t d = 0; d < N; ++d) {
    mine[d] = shape[d];
    hi[d] = r[d];
    lo[d] = -r[N + d];
    differ |= hi[d] != lo[d];
  }
  if (differ)
    throw ShapeError(std::string("tshard::") + op + ": the global shape differs between ranks: " +
                     shape_to_string(mine, int(N)) + " here, per-dim max " + shape_to_string(hi, int(N)) + ", min " +
                     shape_to_string(lo, int(N)) + ", spec " + spec);
  if (r[2 * N])
    throw ShapeError(std::string("tshard::") + op + ": " +
                     (local_ok ? std::string("a local block on another rank does not fit") : local_problem) +
                     " (global shape " + shape_to_string(mine, int(N)) + " " + spec + ")");
}

// The generator behind random(): core/random_bits.hpp's random_bits of seed and index.
template <class T>
T random_value(std::uint64_t seed, std::uint64_t linear) {
  if constexpr (std::is_same_v<T, float>) {
    return float(random_bits(seed, linear) >> 40) * 0x1.0p-24f;
  } else if constexpr (std::is_same_v<T, double>) {
    return double(random_bits(seed, linear) >> 11) * 0x1.0p-53;
  } else if constexpr (is_complex_v<T>) {
    using V = typename T::value_type;
    return T(random_value<V>(seed, 2 * linear), random_value<V>(seed, 2 * linear + 1));
  } else {
    return T(std::int64_t(random_bits(seed, linear) % 2001) - 1000);
  }
}

// Calls f(global index, offset in the padded buffer) for every valid local element.
template <int Rank, class F>
void for_each_local(const ShardLayout& l, F&& f) {
  if (l.valid_size() == 0) return;
  // Rank may exceed the layout's rank (kMaxRank: one instantiation for every rank).
  const Extents stride = strides_of(l.padded, l.rank);
  std::array<Eigen::Index, Rank> g{};
  for_each_index(l.valid, 0, l.rank, [&](const Extents& i) {
    for (int d = 0; d < l.rank; ++d) g[d] = l.offset[d] + i[d];
    f(static_cast<const std::array<Eigen::Index, Rank>&>(g), offset_of(i, stride, 0, l.rank));
  });
}

}  // namespace detail

// Each rank keeps its block of `global`, which every rank holds alike. One small all-reduce
// checks that the shapes agree (ShapeError on every rank where they do not).
template <class SpecT, MeshType M, detail::EigenTensorLike G>
auto distribute(const M& mesh, const G& global) {
  using T = std::remove_const_t<typename G::Scalar>;
  constexpr int Rank = int(G::NumDimensions);
  static_assert(int(G::Layout) == int(Eigen::ColMajor), "tshard: tensors are column-major: RowMajor inputs are not supported");
  static_assert(detail::is_spec<SpecT>::value, "tshard: distribute<Spec>(mesh, tensor) takes a tshard::Spec<...>");
  static_assert(SpecT::rank == Rank, "tshard: the spec's rank differs from the tensor's rank");
  using Out = ShardedTensor<T, M, SpecT>;
  if constexpr (SpecT::rank != Rank || int(G::Layout) != int(Eigen::ColMajor)) {
    return detail::refused<Out>();
  } else {
    detail::OperatorScope scope("distribute");
    std::array<Eigen::Index, Rank> shape{};
    for (int d = 0; d < Rank; ++d) shape[d] = global.dimensions()[d];
    detail::check_shape_agrees(mesh, shape, true, "distribute",
                               Out::spec_desc.to_string(mesh.shape()));
    Out out(mesh, shape);
    const detail::ShardLayout& l = detail::layout_of(out);
    const detail::Extents zero{};
    detail::copy_box(global.data(), detail::extents_of(out), l.offset, out.data(), l.padded, zero, l.valid, Rank);
    return out;
  }
}

// Wraps a shard this rank already has, without copying. `local` must hold the padded local
// extents (padded_local_shape(mesh, shape), column-major) and outlive the tensor and its
// moves; nothing can check a raw pointer's size: the overloads below take it and check it.
template <class SpecT, class P = NoPartial, class T, MeshType M, std::size_t N>
auto from_local(const M& mesh, const Eigen::Index (&global_shape)[N], T* local) {
  using Out = ShardedTensor<T, M, SpecT, P>;
  auto shape = detail::shape_argument<SpecT::rank>(global_shape);
  detail::OperatorScope scope("from_local");
  detail::check_shape_nonnegative(mesh, shape, "from_local", Out::spec_desc.to_string(mesh.shape()));
  detail::check_shape_agrees(mesh, shape, true, "from_local", Out::spec_desc.to_string(mesh.shape()));
  return Out(detail::AdoptStorage{}, mesh, shape, std::shared_ptr<T>(local, [](T*) {}));
}

// The same with the buffer's size in elements: one smaller than the padded local block
// (padded_local_shape) is a ShapeError on every rank instead of a read past its end.
template <class SpecT, class P = NoPartial, class T, MeshType M, std::size_t N>
auto from_local(const M& mesh, const Eigen::Index (&global_shape)[N], T* local, std::size_t count) {
  using Out = ShardedTensor<T, M, SpecT, P>;
  auto shape = detail::shape_argument<SpecT::rank>(global_shape);
  detail::OperatorScope scope("from_local");
  const std::string spec = Out::spec_desc.to_string(mesh.shape());
  detail::check_shape_nonnegative(mesh, shape, "from_local", spec);
  const detail::ShardLayout l =
      detail::shard_layout(Out::spec_desc, detail::to_extents(shape), mesh.shape(), detail::state_of(mesh)->coords());
  const auto need = static_cast<std::size_t>(l.padded_size());
  detail::check_shape_agrees(mesh, shape, count >= need && (local != nullptr || need == 0), "from_local", spec,
                             "the local buffer holds " + std::to_string(count) + " elements on rank " +
                                 std::to_string(mesh.rank()) + ", the padded local block " +
                                 detail::shape_to_string(l.padded, SpecT::rank) + " needs " + std::to_string(need));
  return Out(detail::AdoptStorage{}, mesh, shape, std::shared_ptr<T>(local, [](T*) {}));
}

// The same over a std::span (std::span(vector) for a std::vector).
template <class SpecT, class P = NoPartial, class T, std::size_t Extent, MeshType M, std::size_t N>
auto from_local(const M& mesh, const Eigen::Index (&global_shape)[N], std::span<T, Extent> local) {
  return from_local<SpecT, P>(mesh, global_shape, local.data(), local.size());
}

// Takes ownership of a local block (moved in, not copied); its extents must be the padded
// local extents or the valid ones (then it is copied once into a padded buffer).
template <class SpecT, class P = NoPartial, class T, int Rank, MeshType M, std::size_t N>
auto from_local(const M& mesh, const Eigen::Index (&global_shape)[N], Eigen::Tensor<T, Rank>&& local) {
  static_assert(SpecT::rank == Rank, "tshard: the spec's rank differs from the tensor's rank");
  using Out = ShardedTensor<T, M, SpecT, P>;
  auto shape = detail::shape_argument<Rank>(global_shape);
  detail::OperatorScope scope("from_local");
  const std::string spec = Out::spec_desc.to_string(mesh.shape());
  detail::check_shape_nonnegative(mesh, shape, "from_local", spec);
  const detail::ShardLayout l =
      detail::shard_layout(Out::spec_desc, detail::to_extents(shape), mesh.shape(), detail::state_of(mesh)->coords());
  detail::Extents have{};
  for (int d = 0; d < Rank; ++d) have[d] = local.dimension(d);
  const bool padded = have == l.padded, valid = have == l.valid;
  detail::check_shape_agrees(mesh, shape, padded || valid, "from_local", spec,
                             "the local block is " + detail::shape_to_string(have, Rank) + " on rank " +
                                 std::to_string(mesh.rank()) + ", expected " + detail::shape_to_string(l.padded, Rank) +
                                 " (padded) or " + detail::shape_to_string(l.valid, Rank) + " (valid)");
  if (padded) {
    auto holder = std::make_shared<Eigen::Tensor<T, Rank>>(std::move(local));
    return Out(detail::AdoptStorage{}, mesh, shape, std::shared_ptr<T>(holder, holder->data()));
  }
  Out out(mesh, shape);
  const detail::Extents zero{};
  detail::copy_box(local.data(), l.valid, zero, out.data(), l.padded, zero, l.valid, Rank);
  return out;
}

// Each rank gets its block of `global`, which only mesh rank `root` needs to hold.
template <class SpecT, MeshType M, detail::EigenTensorLike G>
auto scatter(const M& mesh, const G& global, int root = 0) {
  using T = std::remove_const_t<typename G::Scalar>;
  constexpr int Rank = int(G::NumDimensions);
  static_assert(int(G::Layout) == int(Eigen::ColMajor), "tshard: tensors are column-major: RowMajor inputs are not supported");
  static_assert(SpecT::rank == Rank, "tshard: the spec's rank differs from the tensor's rank");
  using Out = ShardedTensor<T, M, SpecT>;
  detail::OperatorScope scope("scatter");
  std::array<std::int64_t, Rank> dims{};
  for (int d = 0; d < Rank; ++d) dims[d] = mesh.rank() == root ? global.dimensions()[d] : 0;
  detail::broadcast(mesh.comm(), dims.data(), Rank, root);
  std::array<Eigen::Index, Rank> shape{};
  for (int d = 0; d < Rank; ++d) shape[d] = dims[d];
  Out out(mesh, shape);
  const detail::Extents zero{};
  const detail::ShardLayout& mine = detail::layout_of(out);
  std::vector<detail::Message<const T>> sends;
  std::vector<detail::Message<T>> recvs;
  detail::Scratch<T> incoming(static_cast<std::size_t>(mine.valid_size()));
  recvs.push_back({root, incoming.data(), mine.valid_size()});
  std::vector<Eigen::Index> offsets;
  Eigen::Index total = 0;
  if (mesh.rank() == root)
    for (int r = 0; r < mesh.size(); ++r) {
      offsets.push_back(total);
      total += detail::shard_layout_of_rank(Out::spec_desc, detail::extents_of(out), mesh.shape(), r).valid_size();
    }
  detail::Scratch<T> packed(static_cast<std::size_t>(total));
  if (mesh.rank() == root)
    for (int r = 0; r < mesh.size(); ++r) {
      auto l = detail::shard_layout_of_rank(Out::spec_desc, detail::extents_of(out), mesh.shape(), r);
      detail::copy_box(global.data(), detail::extents_of(out), l.offset, packed.data() + offsets[r], l.valid, zero,
                       l.valid, Rank);
      sends.push_back({r, packed.data() + offsets[r], l.valid_size()});
    }
  detail::exchange<T>(mesh.comm(), sends, recvs, "scatter_v");
  detail::copy_box(incoming.data(), mine.valid, zero, out.data(), mine.padded, zero, mine.valid, Rank);
  return out;
}

// Element i is f(i), i the global index as std::array<Eigen::Index, rank>. f is never called
// on padding and must depend only on the index (every rank computes its own elements).
template <class T, class SpecT, MeshType M, std::size_t N, class F>
auto from_function(const M& mesh, const Eigen::Index (&global_shape)[N], F&& f) {
  using Out = ShardedTensor<T, M, SpecT>;
  auto shape = detail::shape_argument<SpecT::rank>(global_shape);
  detail::check_shape_nonnegative(mesh, shape, "from_function", Out::spec_desc.to_string(mesh.shape()));
  Out out(mesh, shape);
  T* data = out.data();
  detail::for_each_local<SpecT::rank>(detail::layout_of(out),
                                      [&](const auto& g, detail::Index lin) { data[lin] = T(f(g)); });
  return out;
}

template <class T, class SpecT, MeshType M, std::size_t N>
auto zeros(const M& mesh, const Eigen::Index (&global_shape)[N]) {
  using Out = ShardedTensor<T, M, SpecT>;
  auto shape = detail::shape_argument<SpecT::rank>(global_shape);
  detail::check_shape_nonnegative(mesh, shape, "zeros", Out::spec_desc.to_string(mesh.shape()));
  Out out(mesh, shape);
  std::fill(out.data(), out.data() + out.padded_size(), T(0));
  return out;
}

// Zeros with x's shape, mesh and spec (never partial): state laid out like a parameter.
template <class X>
  requires detail::is_sharded_tensor<X>::value
auto zeros_like(const X& x) {
  ShardedTensor<typename X::Scalar, typename X::MeshT, typename X::SpecType> out(x.mesh(), x.global_shape());
  std::fill(out.data(), out.data() + out.padded_size(), typename X::Scalar(0));
  return out;
}

// Reproducible random values that depend only on (seed, global index), whatever the mesh and
// spec: element with column-major linear global index i is derived from SplitMix64 of seed
// and i; floats are uniform in [0, 1) (24 or 53 random bits), complex numbers take real and
// imaginary parts from indices 2i and 2i+1, integers are uniform in [-1000, 1000].
template <class T, class SpecT, MeshType M, std::size_t N>
auto random(const M& mesh, const Eigen::Index (&global_shape)[N], std::uint64_t seed) {
  using Out = ShardedTensor<T, M, SpecT>;
  auto shape = detail::shape_argument<SpecT::rank>(global_shape);
  detail::check_shape_nonnegative(mesh, shape, "random", Out::spec_desc.to_string(mesh.shape()));
  Out out(mesh, shape);
  T* data = out.data();
  detail::for_each_local<SpecT::rank>(detail::layout_of(out), [&](const auto& g, detail::Index lin) {
    std::uint64_t linear = 0, stride = 1;
    for (int d = 0; d < SpecT::rank; ++d) {
      linear += std::uint64_t(g[d]) * stride;
      stride *= std::uint64_t(shape[d]);
    }
    data[lin] = detail::random_value<T>(seed, linear);
  });
  return out;
}

// The numbers behind random(): random_bits is SplitMix64 of (seed, index); random_value<T> is the
// value random() gives the element with linear index `index`, for data made on the host the same
// way on every rank.
inline std::uint64_t random_bits(std::uint64_t seed, std::uint64_t index) { return detail::random_bits(seed, index); }
template <class T>
T random_value(std::uint64_t seed, std::uint64_t index) {
  return detail::random_value<T>(seed, index);
}

// The extents of every rank's local buffer for a spec and global shape (for from_local).
template <class SpecT, MeshType M, std::size_t N>
std::array<Eigen::Index, SpecT::rank> padded_local_shape(const M& mesh, const Eigen::Index (&global_shape)[N]) {
  auto shape = detail::shape_argument<SpecT::rank>(global_shape);
  constexpr auto desc = detail::make_desc<SpecT, NoPartial>(M::axis_names);
  auto l = detail::shard_layout(desc, detail::to_extents(shape), mesh.shape(), detail::state_of(mesh)->coords());
  return detail::to_array<SpecT::rank>(l.padded);
}

}  // namespace tshard
