// Stencils and convolutions of a sharded tensor: every point's window is read from the shard
// widened by a halo (ops/halo.hpp's HaloExchange), with the exchange overlapping the points that
// need no halo. Their gradients: convolve is recorded on the ts::ad tape (its rule, in ad/, is
// the correlation with the flipped kernel); a stencil's user function has no derivative we can
// see, so stencil_backward takes the user's own per-point derivative and sends the window
// gradients back to their owners through the exchange's transpose.
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
#include "tshard/tensor/tape.hpp"

namespace tshard {

namespace detail::grad {  // the tag of convolve on the tape; its rule is in ad/
template <class T, int Rank>
struct Convolve {
  Eigen::Tensor<T, Rank> kernel;
  Boundary boundary;
};
}  // namespace detail::grad

// ---- stencil ----

namespace detail {
inline constexpr const char* kStencilInstead =
    "a user's function has no derivative: give it one with ts::ad::custom_vjp and ts::stencil_backward, or write a "
    "linear stencil as ts::convolve";
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
  detail::refuse_tracked("stencil", detail::kStencilInstead, x);
  return detail::stencil_impl(x, detail::symmetric_halo<S::rank>(widths), boundary, f);
}
template <class T, class M, class S, class P, std::size_t N, class F>
ShardedTensor<T, M, S> stencil(const ShardedTensor<T, M, S, P>& x, const Halo (&widths)[N], Boundary boundary, F&& f) {
  static_assert(N == std::size_t(S::rank), "tshard: stencil takes one Halo{before, after} per tensor dim");
  detail::OperatorScope scope("stencil");
  detail::refuse_tracked("stencil", detail::kStencilInstead, x);
  return detail::stencil_impl(x, detail::halo_array<S::rank>(widths), boundary, f);
}

// ---- convolve ----

namespace detail {
// The convolution proper, instantiated per (element type, rank): the kernel's nonzero taps (a
// 7-point Laplacian in its 3 x 3 x 3 box reads 7 points, not 27) as offsets, made linear in the
// strides of the block a point is read from (the shard itself deep inside it, the ghosted frame
// near its edges), then one stencil pass over the shard.
template <class T, int Rank>
void convolve_shards(HaloExchange<T, Rank>& exchange, const T* x, T* out, const Eigen::Tensor<T, Rank>& kernel) {
  std::vector<std::array<Eigen::Index, Rank>> offsets;
  std::vector<T> weights;
  Extents kdims{};
  for (int d = 0; d < Rank; ++d) kdims[d] = kernel.dimension(d);
  Eigen::Index k = 0;
  for_each_index(kdims, 0, Rank, [&](const Extents& j) {
    const T w = kernel.data()[k++];
    if (w == T(0)) return;
    std::array<Eigen::Index, Rank> o{};
    for (int d = 0; d < Rank; ++d) o[d] = j[d] - exchange.widths()[d].before;
    offsets.push_back(o);
    weights.push_back(w);
  });
  std::vector<Eigen::Index> taps(offsets.size());
  std::array<Eigen::Index, Rank> strides{};  // what taps are linear in (none yet)
  auto f = [&](const StencilView<T, Rank>& v) {
    if (v.strides() != strides) {
      strides = v.strides();
      for (std::size_t t = 0; t < taps.size(); ++t) {
        taps[t] = 0;
        for (int d = 0; d < Rank; ++d) taps[t] += offsets[t][d] * strides[d];
      }
    }
    const T* c = v.center();
    T s(0);
    for (std::size_t t = 0; t < taps.size(); ++t) s += weights[t] * c[taps[t]];
    return s;
  };
  exchange.stencil_shards(x, out, f);
}

template <class T, class M, class S>
ShardedTensor<T, M, S> convolve_plain(const ShardedTensor<T, M, S>& x, const Eigen::Tensor<T, S::rank>& kernel,
                                      const std::array<Halo, S::rank>& widths, Boundary boundary) {
  PauseRecording untracked;  // (convolve records its own node once the values are computed)
  HaloExchange<T, S::rank> exchange(HaloWidths{}, x, widths, boundary, "convolve");
  ShardedTensor<T, M, S> out(x.mesh(), x.global_shape());
  convolve_shards(exchange, x.data(), out.data(), kernel);
  return out;
}
}  // namespace detail

// "Same"-size correlation with a replicated kernel of odd extents:
// out(i) = sum over j of kernel(j) * x(i + j - (extent - 1) / 2), x beyond the edges being zero
// or wrapped as boundary says. The sum runs over the kernel's nonzero taps in column-major order
// (a zero tap reads nothing, so an Inf or NaN under it does not spread). Output
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
  ShardedTensor<T, M, S> out = [&] {
    if constexpr (P::is_partial)
      return detail::convolve_plain(detail::implicit_reshard<S>(x, "convolve"), kernel, widths, boundary);
    else
      return detail::convolve_plain(x, kernel, widths, boundary);
  }();
  if (detail::recording(x)) detail::record(out, detail::grad::Convolve<T, Rank>{kernel, boundary}, detail::tape_shape(x));
  return out;
}

// ---- the transpose of a stencil ----

// Where a stencil's derivative at one point goes: d(o0, o1, ...) += ... adds into the gradient
// of the input element at the point's index plus the offsets (within the halo widths).
template <class T, int Rank>
class StencilGradient {
 public:
  StencilGradient(T* center, const std::array<Eigen::Index, Rank>& strides) : center_(center), strides_(strides) {}
  template <class... I>
  T& operator()(I... offsets) const {
    static_assert(sizeof...(I) == std::size_t(Rank), "tshard: a stencil gradient takes one offset per tensor dim");
    const Eigen::Index o[] = {Eigen::Index(offsets)...};
    Eigen::Index lin = o[0];
    for (int d = 1; d < Rank; ++d) lin += o[d] * strides_[d];
    return center_[lin];
  }

 private:
  T* center_;
  std::array<Eigen::Index, Rank> strides_;
};

namespace detail {
template <class G, class T, int Rank>
constexpr void require_stencil_derivative() {
  static_assert(std::is_invocable_v<G&, const StencilView<T, Rank>&, T, const StencilGradient<T, Rank>&>,
                "tshard: stencil_backward's function takes (StencilView view, T dy, StencilGradient dview) and adds "
                "into dview(offsets...)");
}

template <class T, class M, class S, class G>
ShardedTensor<T, M, S> stencil_backward_impl(const ShardedTensor<T, M, S>& x, const ShardedTensor<T, M, S>& dy,
                                             const std::array<Halo, S::rank>& widths, Boundary boundary, G& g) {
  constexpr int Rank = S::rank;
  require_same_mesh(x, dy, "stencil_backward");
  if (extents_of(x) != extents_of(dy))
    throw ShapeError("tshard::stencil_backward: dy " + dy.describe() + " differs from x " + x.describe() +
                     " (a stencil's output has its input's shape)");
  HaloExchange<T, Rank> exchange(HaloWidths{}, x, widths, boundary, "stencil_backward");
  auto in = exchange.make_extended(x);     // x's windows, as the forward read them
  auto grad = exchange.make_extended();    // their gradients, zero
  if (!exchange.empty()) {
    const Extents window = to_extents(exchange.extended_shape()), ws = strides_of(window, Rank);
    const ShardLayout& l = layout_of(dy);
    std::array<Eigen::Index, Rank> strides{};
    for (int d = 0; d < Rank; ++d) strides[d] = ws[d];
    const Extents ds = strides_of(l.padded, Rank);
    for_each_index(l.valid, 0, Rank, [&](const Extents& i) {
      Index at = 0, at_dy = 0;
      for (int d = 0; d < Rank; ++d) at += (i[d] + widths[d].before) * ws[d], at_dy += i[d] * ds[d];
      g(StencilView<T, Rank>(in.data() + at, strides), dy.data()[at_dy], StencilGradient<T, Rank>(grad.data() + at, strides));
    });
  }
  ShardedTensor<T, M, S> dx(x.mesh(), x.global_shape());
  std::fill(dx.data(), dx.data() + dx.padded_size(), T(0));
  exchange.add_back(grad, dx);
  return dx;
}
}  // namespace detail

// The gradient of out = stencil(x, widths, boundary, f), given dy = d loss / d out: the user
// gives f's derivative per point as g(view, dy_i, dview), which adds into dview(o...) the
// derivative of f(view) with respect to view(o...) times dy_i (for a linear stencil, the
// weights times dy_i). Every point's window gradient goes back to the ranks that own its
// elements and is added there: the transpose of the halo exchange (HaloExchange::add_back), so
// the result is the exact adjoint on every mesh, beyond Zero boundaries nothing, around
// Periodic ones wrapped. Pair it with stencil in ts::ad::custom_vjp to make a stencil
// differentiable. Collective; dx has x's spec.
template <class T, class M, class S, class P, std::size_t N, class G>
ShardedTensor<T, M, S> stencil_backward(const ShardedTensor<T, M, S, P>& x, const ShardedTensor<T, M, S>& dy,
                                        const Eigen::Index (&widths)[N], Boundary boundary, G&& g) {
  static_assert(N == std::size_t(S::rank), "tshard: stencil_backward takes one halo width per tensor dim");
  detail::require_stencil_derivative<G, T, S::rank>();
  detail::OperatorScope scope("stencil_backward");
  detail::refuse_tracked("stencil_backward", detail::kNoSecondOrder, x, dy);
  return detail::stencil_backward_impl(detail::implicit_reshard<S>(x, "stencil_backward"), dy,
                                       detail::symmetric_halo<S::rank>(widths), boundary, g);
}
template <class T, class M, class S, class P, std::size_t N, class G>
ShardedTensor<T, M, S> stencil_backward(const ShardedTensor<T, M, S, P>& x, const ShardedTensor<T, M, S>& dy,
                                        const Halo (&widths)[N], Boundary boundary, G&& g) {
  static_assert(N == std::size_t(S::rank), "tshard: stencil_backward takes one Halo{before, after} per tensor dim");
  detail::require_stencil_derivative<G, T, S::rank>();
  detail::OperatorScope scope("stencil_backward");
  detail::refuse_tracked("stencil_backward", detail::kNoSecondOrder, x, dy);
  return detail::stencil_backward_impl(detail::implicit_reshard<S>(x, "stencil_backward"), dy,
                                       detail::halo_array<S::rank>(widths), boundary, g);
}

}  // namespace tshard
