// Shape operators: transpose permutes dims and the spec with them (no communication); slice,
// pad and concat move only what lands on other ranks; reshape is free where every rank already
// holds its new block.
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>

#include <tuple>

#include "tshard/comm/failure.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/layout_cache.hpp"
#include "tshard/core/spec_algebra.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/reshard/redistribute.hpp"
#include "tshard/tensor/factories.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {
namespace detail::grad {  // the tags of shape operators on the tape; their rules are in ad/
template <int... Perm>
struct Transpose {};
struct Slice {
  Extents offset;
};
struct Pad {
  Extents before;
};
template <int Dim>
struct Concat {};
struct Reshape {};
}  // namespace detail::grad

// Output dim i is input dim Perm[i]; the spec permutes alike, a partial stays partial.
template <int... Perm, ShardedTensorType X>
auto transpose(const X& x) {
  static_assert(int(sizeof...(Perm)) == X::rank, "tshard: transpose takes one dim index per tensor dim");
  static_assert(detail::dims_valid<X::rank, Perm...>(), "tshard: transpose's dims must be a permutation of the tensor's");
  using T = typename X::Scalar;
  using OutSpec = typename detail::permute_dims<typename X::SpecType, Perm...>::type;
  using Out = ShardedTensor<T, typename X::MeshT, OutSpec, typename X::PartialType>;
  constexpr std::array<int, sizeof...(Perm)> perm{Perm...};
  std::array<Eigen::Index, X::rank> shape{};
  for (int d = 0; d < X::rank; ++d) shape[d] = detail::extents_of(x)[perm[d]];
  Out out(x.mesh(), shape);
  if (out.padded_size()) out.local() = x.local().shuffle(perm);
  if (detail::recording(x)) detail::record(out, detail::grad::Transpose<Perm...>{}, detail::tape_shape(x));
  return out;
}

namespace detail {
template <int Rank, std::size_t N>
Extents extents_argument(const Eigen::Index (&v)[N]) {
  static_assert(N == std::size_t(Rank), "tshard: the shape has a different number of entries than the tensor has dims");
  Extents e{};
  for (int d = 0; d < Rank; ++d) e[d] = v[d];
  return e;
}
}  // namespace detail

// The window [offsets, offsets + extents) of x, with x's spec; data moves only where the
// window's shards fall on other ranks than the source's (point to point).
template <ShardedTensorType X, std::size_t N>
auto slice(const X& x, const Eigen::Index (&offsets)[N], const Eigen::Index (&extents)[N]) {
  constexpr int Rank = X::rank;
  const detail::Extents off = detail::extents_argument<Rank>(offsets), ext = detail::extents_argument<Rank>(extents);
  for (int d = 0; d < Rank; ++d)
    if (off[d] < 0 || ext[d] < 0 || off[d] + ext[d] > detail::extents_of(x)[d])
      throw ShapeError("tshard::slice: the window at " + detail::shape_to_string(off, Rank) + " of extent " +
                       detail::shape_to_string(ext, Rank) + " does not fit x " + x.describe());
  using Out = ShardedTensor<typename X::Scalar, typename X::MeshT, typename X::SpecType, typename X::PartialType>;
  detail::OperatorScope scope("slice");
  Out out(x.mesh(), detail::to_array<Rank>(ext));
  // Partial values move like plain ones: their partial axes are split by neither layout.
  detail::implicit_redistribute(*detail::state_of(x.mesh()), x.spec_desc.without_partial(), detail::extents_of(x),
                                x.data(), Out::spec_desc.without_partial(), detail::extents_of(out), out.data(), off,
                                "slice");
  if (detail::recording(x)) detail::record(out, detail::grad::Slice{off}, detail::tape_shape(x));
  return out;
}

// x padded with `before` and `after` elements of `value` along every dim, with x's spec.
template <ShardedTensorType X, std::size_t N>
auto pad(const X& xin, const Eigen::Index (&before)[N], const Eigen::Index (&after)[N],
         typename X::Scalar value = typename X::Scalar(0)) {
  constexpr int Rank = X::rank;
  detail::OperatorScope scope("pad");
  const auto& x = detail::resolved(xin, "pad");
  const detail::Extents lo = detail::extents_argument<Rank>(before), hi = detail::extents_argument<Rank>(after);
  detail::Extents shape{}, shift{};
  for (int d = 0; d < Rank; ++d) {
    if (lo[d] < 0 || hi[d] < 0)
      throw ShapeError("tshard::pad: negative widths " + detail::shape_to_string(lo, Rank) + " / " +
                       detail::shape_to_string(hi, Rank) + " for x " + x.describe());
    shape[d] = detail::extents_of(x)[d] + lo[d] + hi[d];
    shift[d] = -lo[d];
  }
  using Out = ShardedTensor<typename X::Scalar, typename X::MeshT, typename X::SpecType>;
  Out out(x.mesh(), detail::to_array<Rank>(shape));
  std::fill(out.data(), out.data() + out.padded_size(), value);
  detail::implicit_redistribute(*detail::state_of(x.mesh()), x.spec_desc, detail::extents_of(x), x.data(),
                                Out::spec_desc, detail::extents_of(out), out.data(), shift, "pad");
  if (detail::recording(x)) detail::record(out, detail::grad::Pad{lo}, detail::tape_shape(x));
  return out;
}

// a and b joined along Dim, with a's spec; b moves straight into place from whatever spec it has.
template <int Dim, ShardedTensorType A, ShardedTensorType B>
auto concat(const A& ain, const B& bin) {
  static_assert(A::rank == B::rank, "tshard: concat joins tensors of the same rank");
  static_assert(detail::dims_valid<A::rank, Dim>(), "tshard: the concat dim must be less than the tensors' rank");
  static_assert(std::is_same_v<typename A::Scalar, typename B::Scalar>, "tshard: concat joins tensors of one element type");
  constexpr int Rank = A::rank;
  detail::OperatorScope scope("concat");
  const auto& a = detail::resolved(ain, "concat");
  const auto& b = detail::resolved(bin, "concat");
  detail::require_same_mesh(a, b, "concat");
  detail::Extents shape = detail::extents_of(a), shift{};
  for (int d = 0; d < Rank; ++d)
    if (d != Dim && detail::extents_of(a)[d] != detail::extents_of(b)[d])
      throw ShapeError("tshard::concat: the shapes differ off the concat dim " + std::to_string(Dim) + ": a is " +
                       a.describe() + ", b is " + b.describe());
  shape[Dim] += detail::extents_of(b)[Dim];
  shift[Dim] = -detail::extents_of(a)[Dim];
  using Out = ShardedTensor<typename A::Scalar, typename A::MeshT, typename A::SpecType>;
  Out out(a.mesh(), detail::to_array<Rank>(shape));
  auto& mesh = *detail::state_of(a.mesh());
  detail::implicit_redistribute(mesh, a.spec_desc, detail::extents_of(a), a.data(), Out::spec_desc,
                                detail::extents_of(out), out.data(), detail::Extents{}, "concat");
  detail::implicit_redistribute(mesh, b.spec_desc, detail::extents_of(b), b.data(), Out::spec_desc,
                                detail::extents_of(out), out.data(), shift, "concat");
  if (detail::recording(a, b))
    detail::record(out, detail::grad::Concat<Dim>{}, detail::tape_shape(a), detail::tape_shape(b));
  return out;
}

namespace detail {

// Whether every rank already holds its block of the reshaped tensor: each contiguous run of
// the new block (in column-major order) must lie inside the rank's old block. Decided from
// shapes, specs and the mesh alone, alike on every rank, and cached: no communication.
bool find_reshape_is_local(const SpecDesc& from, const Extents& from_shape, const SpecDesc& to,
                           const Extents& to_shape, const MeshShape& m);
bool reshape_is_local(const SpecDesc& from, const Extents& from_shape, const SpecDesc& to,
                      const Extents& to_shape, const MeshShape& m);

// out's valid block (new shape, layout ol) from a source block src (old shape, layout sl)
// that holds every element it needs.
template <class T>
void reshape_copy(const T* src, const ShardLayout& sl, const Extents& from_shape, int from_rank, T* out,
                  const ShardLayout& ol, const Extents& to_shape) {
  for_each_local<kMaxRank>(ol, [&](const auto& g, Index lin) {
    Index linear = 0, stride = 1;
    for (int d = 0; d < ol.rank; ++d) {
      linear += g[d] * stride;
      stride *= to_shape[d];
    }
    Index at = 0, astride = 1;
    for (int d = 0; d < from_rank; ++d) {
      at += (linear % from_shape[d] - sl.offset[d]) * astride;
      linear /= from_shape[d];
      astride *= sl.padded[d];
    }
    out[lin] = src[at];
  });
}

}  // namespace detail

// x with a new shape of the same size, in Eigen's column-major element order, laid out as
// NewSpec. Free (a local copy) where every rank already holds its new block, as when the
// split dim is the slowest of its merged group and sizes divide, decided without
// communicating; otherwise x is first gathered (counted under "reshape/auto", so the cost shows).
template <class NewSpec, ShardedTensorType X, std::size_t N>
auto reshape(const X& xin, const Eigen::Index (&new_shape)[N]) {
  static_assert(detail::is_spec<NewSpec>::value, "tshard: reshape<Spec>(x, shape) takes a tshard::Spec<...>");
  constexpr int Rank = NewSpec::rank;
  using T = typename X::Scalar;
  using Out = ShardedTensor<T, typename X::MeshT, NewSpec>;
  detail::OperatorScope scope("reshape");
  const auto& x = detail::resolved(xin, "reshape");
  const detail::Extents shape = detail::extents_argument<Rank>(new_shape);
  detail::Index old_n = detail::volume(detail::extents_of(x), X::rank), new_n = 1;
  for (int d = 0; d < Rank; ++d) new_n *= shape[d];
  if (old_n != new_n)
    throw ShapeError("tshard::reshape: " + x.describe() + " has " + std::to_string(old_n) + " elements, the new shape " +
                     detail::shape_to_string(shape, Rank) + " has " + std::to_string(new_n));
  Out out(x.mesh(), detail::to_array<Rank>(shape));
  const auto& m = x.mesh().shape();
  if (detail::reshape_is_local(x.spec_desc, detail::extents_of(x), Out::spec_desc, shape, m)) {
    detail::reshape_copy(x.data(), detail::layout_of(x), detail::extents_of(x), X::rank, out.data(),
                         detail::layout_of(out), shape);
  } else {
    const auto whole = detail::implicit_reshard<Replicated<X::rank>>(x, "reshape");
    detail::reshape_copy(whole.data(), detail::layout_of(whole), detail::extents_of(x), X::rank, out.data(),
                         detail::layout_of(out), shape);
  }
  if (detail::recording(x)) detail::record(out, detail::grad::Reshape{}, detail::tape_shape(x));
  return out;
}

}  // namespace tshard

#if TSHARD_HEADER_BODIES
#include "tshard/ops/shape-inl.hpp"
#endif
