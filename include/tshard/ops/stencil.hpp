// Stencils and convolutions of a sharded tensor: every point's window is read from the shard
// widened by a halo (ops/halo.hpp's HaloExchange), with the exchange overlapping the points that
// need no halo.
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>

#include <array>
#include <cstddef>
#include <vector>

#include "tshard/core/box_iterator.hpp"
#include "tshard/core/error.hpp"
#include "tshard/ops/halo.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {

// ---- stencil ----

namespace detail {
template <class T, class M, class S, class P, class F>
ShardedTensor<T, M, S> stencil_impl(const ShardedTensor<T, M, S, P>& x, const std::array<Halo, S::rank>& widths,
                                    Boundary boundary, F& f) {
  if constexpr (P::is_partial) {
    return stencil_impl(implicit_reshard<S>(x, "stencil"), widths, boundary, f);
  } else {
    HaloExchange<T, S::rank> plan(HaloWidths{}, x, widths, boundary, "stencil");
    ShardedTensor<T, M, S> out(x.mesh(), x.global_shape());
    plan.stencil(x, out, f);
    return out;
  }
}
}  // namespace detail

// out(i) = f(view around i) at every point, where view(o0, o1, ...) reads x at i + o within the
// halo widths (zeros or wrap beyond the edges, as boundary says); f may also take the global
// index (std::array<Eigen::Index, rank>). Output spec = input spec. The halo exchange overlaps
// the points that need no halo.
template <class T, class M, class S, class P, std::size_t N, class F>
ShardedTensor<T, M, S> stencil(const ShardedTensor<T, M, S, P>& x, const Eigen::Index (&widths)[N], Boundary boundary,
                               F&& f) {
  static_assert(N == std::size_t(S::rank), "tshard: stencil takes one halo width per tensor dim");
  detail::OperatorScope scope("stencil");
  return detail::stencil_impl(x, detail::symmetric_halo<S::rank>(widths), boundary, f);
}
template <class T, class M, class S, class P, std::size_t N, class F>
ShardedTensor<T, M, S> stencil(const ShardedTensor<T, M, S, P>& x, const Halo (&widths)[N], Boundary boundary, F&& f) {
  static_assert(N == std::size_t(S::rank), "tshard: stencil takes one Halo{before, after} per tensor dim");
  detail::OperatorScope scope("stencil");
  return detail::stencil_impl(x, detail::halo_array<S::rank>(widths), boundary, f);
}

// ---- convolve ----

namespace detail {
// The convolution proper, instantiated per (element type, rank): the kernel's taps as linear
// offsets in the extended block (column-major order), then one stencil pass over the shard.
template <class T, int Rank>
void convolve_shards(HaloExchange<T, Rank>& exchange, const T* x, T* out, const Eigen::Tensor<T, Rank>& kernel) {
  std::vector<Eigen::Index> taps;
  std::vector<T> weights;
  if (!exchange.empty()) {
    const Extents ext_strides = strides_of(to_extents(exchange.extended_shape()), Rank);
    Extents kdims{};
    for (int d = 0; d < Rank; ++d) kdims[d] = kernel.dimension(d);
    taps.reserve(std::size_t(kernel.size()));
    weights.reserve(std::size_t(kernel.size()));
    for_each_index(kdims, 0, Rank, [&](const Extents& j) {
      Eigen::Index lin = 0;
      for (int d = 0; d < Rank; ++d) lin += (j[d] - exchange.widths()[d].before) * ext_strides[d];
      taps.push_back(lin);
      weights.push_back(kernel.data()[weights.size()]);
    });
  }
  auto f = [&](const StencilView<T, Rank>& v) {
    const T* c = v.center();
    T s(0);
    for (std::size_t k = 0; k < taps.size(); ++k) s += weights[k] * c[taps[k]];
    return s;
  };
  exchange.stencil_shards(x, out, f);
}

template <class T, class M, class S>
ShardedTensor<T, M, S> convolve_plain(const ShardedTensor<T, M, S>& x, const Eigen::Tensor<T, S::rank>& kernel,
                                      const std::array<Halo, S::rank>& widths, Boundary boundary) {
  HaloExchange<T, S::rank> exchange(HaloWidths{}, x, widths, boundary, "convolve");
  ShardedTensor<T, M, S> out(x.mesh(), x.global_shape());
  convolve_shards(exchange, x.data(), out.data(), kernel);
  return out;
}
}  // namespace detail

// "Same"-size correlation with a replicated kernel of odd extents:
// out(i) = sum over j of kernel(j) * x(i + j - (extent - 1) / 2), x beyond the edges being zero
// or wrapped as boundary says. The sum runs over the kernel in column-major order. Output
// spec = input spec; a partial x is resolved first.
template <class T, class M, class S, class P>
ShardedTensor<T, M, S> convolve(const ShardedTensor<T, M, S, P>& x, const Eigen::Tensor<T, S::rank>& kernel,
                                Boundary boundary) {
  constexpr int Rank = S::rank;
  static_assert(Rank >= 1, "tshard: convolve needs a tensor of rank 1 or more");
  detail::OperatorScope scope("convolve");
  std::array<Halo, Rank> widths{};
  bool odd = true;
  for (int d = 0; d < Rank; ++d) {
    odd &= kernel.dimension(d) % 2 == 1;
    widths[d] = Halo{kernel.dimension(d) / 2, kernel.dimension(d) / 2};
  }
  if (!odd)
    throw ShapeError("tshard::convolve: the kernel's extents must be odd (a centred window): kernel " +
                     detail::describe_eigen(kernel) + ", x " + x.describe());
  if constexpr (P::is_partial)
    return detail::convolve_plain(detail::implicit_reshard<S>(x, "convolve"), kernel, widths, boundary);
  else
    return detail::convolve_plain(x, kernel, widths, boundary);
}

}  // namespace tshard
