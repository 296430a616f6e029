// Reductions over dims: sum, max, min, mean (lazy: reducing a split dim leaves a partial over
// its axes, resolved when something needs the value) and argmax (never partial: candidates
// are combined across the split at once). Padding is masked: only valid elements are read.
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>

#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "tshard/comm/collectives.hpp"
#include "tshard/core/spec_algebra.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/ops/reduce_kernel.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {
namespace detail {

namespace grad {  // the tags of reductions on the tape; their rules are in ad/
// Rules on descriptors, one per element type (see tensor/tape.hpp's any_output).
struct Extremum {  // max, min
  static constexpr bool any_output = true;
  ReduceOp op;
  std::array<bool, kMaxRank> reduced;
};
struct Sum {
  static constexpr bool any_output = true;
  std::array<bool, kMaxRank> reduced;
};
struct KeepDims {
  static constexpr bool any_output = true;
};
}  // namespace grad

template <ReduceOp Op, int... Dims, class T, class M, class S, class P>
auto reduce(const ShardedTensor<T, M, S, P>& x, const char* name) {
  static_assert(sizeof...(Dims) > 0, "tshard: name at least one dim to reduce");
  static_assert(dims_valid<S::rank, Dims...>(), "tshard: reduced dims must be distinct and less than the tensor's rank");
  static_assert(Op == ReduceOp::Sum || !is_complex_v<T>, "tshard: complex values have no max or min");
  static_assert(no_arithmetic_on_masks<T>, "tshard: masks (bool tensors) are not reduced: where(mask, 1, 0) gives numbers");
  // A partial of the same kind composes (sum of partial sums); any other kind resolves first.
  constexpr PartialKind kind = Op == ReduceOp::Sum ? PartialKind::Sum : Op == ReduceOp::Max ? PartialKind::Max : PartialKind::Min;
  constexpr bool compose = !P::is_partial || partial_kind<P>() == kind;
  if constexpr (!compose) {
    OperatorScope scope(name);
    return reduce<Op, Dims...>(resolved(x, name), name);
  } else {
    using Drop = drop_dims<S, Dims...>;
    using OutSpec = typename Drop::type;
    using Axes = typename concat_axes<typename partial_axes<P>::type, typename Drop::dropped_axes>::type;
    using Out = ShardedTensor<T, M, OutSpec, typename partial_of<Op, Axes>::type>;
    constexpr int OutRank = OutSpec::rank;
    std::array<bool, kMaxRank> reduced{};
    ((reduced[Dims] = true), ...);
    std::array<Eigen::Index, OutRank> shape{};
    for (int d = 0, k = 0; d < S::rank; ++d)
      if (!reduced[d]) shape[k++] = detail::extents_of(x)[d];
    Out out(x.mesh(), shape);
    reduce_kernel<T>(Op, x.data(), detail::layout_of(x), reduced, out.data(), detail::layout_of(out).padded, OutRank);
    if (recording(x)) {
      if constexpr (Op == ReduceOp::Sum)
        record(out, grad::Sum{reduced}, tape_block(x, false));
      else  // the gradient goes to the elements equal to the result
        record(out, grad::Extremum{Op, reduced}, tape_block(x), tape_output_block(out));
    }
    return out;
  }
}

// The spec with the listed dims replicated (the dims a keep_dims reduction leaves at extent 1).
template <class SpecT, int... Dims>
struct replicate_dims {
  static constexpr auto kept = [] {
    std::array<int, std::size_t(SpecT::rank)> k{};
    for (int d = 0; d < SpecT::rank; ++d) k[d] = ((d == Dims) || ...) ? -1 : d;
    return k;
  }();
  using type = typename select_dims<SpecT, kept>::type;
};

// The reduction `r` of x over Dims seen with those dims kept at extent 1: the same buffer, as
// a dim of extent 1 moves no element in column-major order.
template <int... Dims, class X, class Reduced>
auto with_kept_dims(const X& x, const Reduced& r) {
  using Out = ShardedTensor<typename X::Scalar, typename X::MeshT,
                            typename replicate_dims<typename X::SpecType, Dims...>::type, typename Reduced::PartialType>;
  auto shape = x.global_shape();
  ((shape[Dims] = 1), ...);
  Out out(AdoptStorage{}, x.mesh(), shape, TensorAccess::storage(r));
  if (recording(r)) record(out, grad::KeepDims{}, tape_block(r, false));
  return out;
}

}  // namespace detail

// Tag for reductions that keep the reduced dims at extent 1: ts::sum<1>(x, ts::keep_dims).
struct KeepDims {
  explicit constexpr KeepDims() = default;
};
inline constexpr KeepDims keep_dims{};

// Sum over dims; a split dim leaves a partial sum over its axes (resolved lazily).
template <int... Dims, ShardedTensorType X>
auto sum(const X& x) {
  return detail::reduce<ReduceOp::Sum, Dims...>(x, "sum");
}
template <int... Dims, ShardedTensorType X>
auto max(const X& x) {
  return detail::reduce<ReduceOp::Max, Dims...>(x, "max");
}
template <int... Dims, ShardedTensorType X>
auto min(const X& x) {
  return detail::reduce<ReduceOp::Min, Dims...>(x, "min");
}
// Mean over dims: the sum divided by the true global count (uneven shards included).
template <int... Dims, ShardedTensorType X>
auto mean(const X& x) {
  using T = typename X::Scalar;
  static_assert(!std::is_integral_v<T>, "tshard: mean needs a floating-point or complex element type");
  double count = 1;
  ((count *= double(detail::extents_of(x)[Dims])), ...);
  return detail::reduce<ReduceOp::Sum, Dims...>(x, "mean") * T(1.0 / count);
}

// The same with the reduced dims kept at extent 1 (replicated), for broadcasting back.
template <int... Dims, ShardedTensorType X>
auto sum(const X& x, KeepDims) {
  return detail::with_kept_dims<Dims...>(x, sum<Dims...>(x));
}
template <int... Dims, ShardedTensorType X>
auto max(const X& x, KeepDims) {
  return detail::with_kept_dims<Dims...>(x, max<Dims...>(x));
}
template <int... Dims, ShardedTensorType X>
auto min(const X& x, KeepDims) {
  return detail::with_kept_dims<Dims...>(x, min<Dims...>(x));
}
template <int... Dims, ShardedTensorType X>
auto mean(const X& x, KeepDims) {
  return detail::with_kept_dims<Dims...>(x, mean<Dims...>(x));
}

// Sum over every dim but the last (the rows of a [.., features] tensor): a per-feature total,
// partial where the rows are split. A rank-1 tensor is its own total.
template <ShardedTensorType X>
auto sum_leading_dims(const X& x) {
  if constexpr (X::rank == 1) {
    return x;
  } else {
    return [&]<int... I>(std::integer_sequence<int, I...>) { return sum<I...>(x); }(
        std::make_integer_sequence<int, X::rank - 1>{});
  }
}

namespace detail {
// argmax along `dim` on one rank, instantiated per element type: the best (value, global index)
// of this shard for every output element, then the candidates of the split's group gathered and
// combined, so every rank ends with the same answer; ties go to the lowest index, as in numpy.
template <class T>
void argmax_run(MeshState& mesh, const SpecDesc& spec, const ShardLayout& l, const T* x, int dim,
                const ShardLayout& ol, std::int64_t* out) {
  const Index n = ol.padded_size();
  std::vector<T> best(static_cast<std::size_t>(n), T(0));
  std::vector<std::int64_t> where(static_cast<std::size_t>(n), -1);
  auto better = [](T v, std::int64_t i, T b, std::int64_t j) {
    if (j < 0) return true;
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(b)) return std::isnan(v) && i < j;
      if (std::isnan(v)) return true;
    }
    return v > b || (v == b && i < j);
  };
  // Output strides over the input's dims (0 along dim).
  Extents ostride{};
  Index s = 1;
  for (int d = 0, k = 0; d < l.rank; ++d)
    if (d != dim) {
      ostride[d] = s;
      s *= ol.padded[k++];
    }
  const Extents istride = strides_of(l.padded, l.rank);
  if (l.valid_size() > 0)
    for_each_index(l.valid, 0, l.rank, [&](const Extents& i) {
      const Index o = offset_of(i, ostride, 0, l.rank);
      const T v = x[offset_of(i, istride, 0, l.rank)];
      const std::int64_t g = l.offset[dim] + i[dim];
      if (better(v, g, best[o], where[o])) {
        best[o] = v;
        where[o] = g;
      }
    });
  const DimSplit& split = spec.dims[dim];
  const int k = int(split_parts(split, mesh.shape()));
  std::vector<T> all_best(static_cast<std::size_t>(n * k));
  std::vector<std::int64_t> all_where(static_cast<std::size_t>(n * k));
  MPI_Comm group = mesh.group(split);
  all_gather(group, best.data(), n, all_best.data());
  all_gather(group, where.data(), n, all_where.data());
  for (Index o = 0; o < n; ++o) {
    T b = T(0);
    std::int64_t j = -1;
    for (int g = 0; g < k; ++g)
      if (all_where[g * n + o] >= 0 && better(all_best[g * n + o], all_where[g * n + o], b, j)) {
        b = all_best[g * n + o];
        j = all_where[g * n + o];
      }
    out[o] = j;
  }
}
}  // namespace detail

// Index of the largest element along Dim (int64, never partial): ties go to the lowest global
// index and NaN wins, as in numpy. A split Dim is combined across its axes with one all-gather
// of (value, index) candidates.
template <int Dim, ShardedTensorType X>
auto argmax(const X& xin) {
  using T = typename X::Scalar;
  static_assert(!is_complex_v<T>, "tshard: complex values have no order: argmax needs a real element type");
  static_assert(detail::dims_valid<X::rank, Dim>(), "tshard: the argmax dim must be less than the tensor's rank");
  detail::OperatorScope scope("argmax");
  const auto& x = detail::resolved(xin, "argmax");
  using S = typename X::SpecType;
  using OutSpec = typename detail::drop_dims<S, Dim>::type;
  using Out = ShardedTensor<std::int64_t, typename X::MeshT, OutSpec>;
  constexpr int OutRank = OutSpec::rank;
  std::array<Eigen::Index, OutRank> shape{};
  for (int d = 0, k = 0; d < X::rank; ++d)
    if (d != Dim) shape[k++] = detail::extents_of(x)[d];
  Out out(x.mesh(), shape);
  detail::argmax_run<T>(*detail::state_of(x.mesh()), X::spec_desc, detail::layout_of(x), x.data(), Dim,
                        detail::layout_of(out), out.data());
  return out;
}

}  // namespace tshard
