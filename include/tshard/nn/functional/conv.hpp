// ts::nn::conv2d and conv3d: 2-D and 3-D convolution (correlation, as PyTorch's) of NCHW
// (NCDHW) input split over N and the spatial dims, with weights [O, C, kh, kw] ([O, C, kd, kh,
// kw]) that are a ShardedTensor (replicated, or O split over an axis the input does not use),
// stride 1 or more, Same, Valid or explicit zero padding, and its gradient (a custom VJP):
//  - each rank reads the input window its output block needs through the halo path
//    (core/halo_geometry.hpp's plan_window), GSPMD's halo exchange for windowed operators;
//  - the input gradient is the transposed convolution into that window, whose halo parts go
//    back to their owners and are added there (HaloTransfer::add_back); summed over the
//    output-channel axis where the weights split O;
//  - the weight gradient is a partial sum over the axes that split N and the spatial dims,
//    reduced once.
#pragma once
#include <Eigen/Core>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tshard/ad/custom_vjp.hpp"
#include "tshard/comm/collectives.hpp"
#include "tshard/core/dispatch.hpp"
#include "tshard/core/halo_geometry.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/nn/functional/window_gather.hpp"
#include "tshard/reshard/reshard.hpp"

namespace tshard {
// How a convolution treats the edges: Same keeps H x W (zero padding of (k - 1) / 2, odd kernels
// only), Valid keeps only the positions where the kernel fits: (H - kh + 1) x (W - kw + 1).
enum class Padding { Same, Valid };
}  // namespace tshard

namespace tshard::nn {

// A convolution's settings (stride, then padding; more may follow). pad_h / pad_w (and
// pad_d, conv3d's depth) >= 0 give explicit zero padding on both sides instead of `padding`; a
// spatial dim whose pad is left at -1 then has none. Same pads (k - 1) / 2 (odd kernels):
// H' = ceil(H / stride); in general H' = floor((H + 2 pad - kh) / stride) + 1.
struct Conv {
  Eigen::Index stride = 1;
  Padding padding = Padding::Same;
  Eigen::Index pad_h = -1, pad_w = -1, pad_d = -1;
};

namespace detail {

using tshard::detail::Extents;
using tshard::detail::Index;

// Specs of x (channels whole) and y (channels split as the weights' O), for K spatial dims.
template <class XSpec, class WSpec>
struct conv_out_spec;
template <class D0, class D1, class... Ds, class W0, class W1, class... Ws>
struct conv_out_spec<Spec<D0, D1, Ds...>, Spec<W0, W1, Ws...>> {
  static_assert(std::is_same_v<W1, R> && (std::is_same_v<Ws, R> && ...),
                "tshard: a convolution's weights [O, C, k...] may split O only: C and the kernel dims are replicated");
  using input = Spec<D0, R, Ds...>;    // channels whole on every rank
  using output = Spec<D0, W0, Ds...>;  // output channels split as the weights' O
};

// The geometry of one convolution with K spatial dims (dims 2 ... K + 1 of x, y and w).
template <int K>
struct ConvGeometry {
  Index N = 0, C = 0, O = 0, s = 1;
  std::array<Index, K> in{}, k{}, p{}, out{};
  // The kernel positions past the first spatial dim: the contiguous runs of (C, k[0]) columns.
  Index trailing() const {
    Index t = 1;
    for (int d = 1; d < K; ++d) t *= k[std::size_t(d)];
    return t;
  }
};

template <int K>
ConvGeometry<K> conv_geometry(const Extents& x, const Extents& w, const Conv& c, const char* op, tshard::detail::Text what) {
  auto name = [op] { return std::string("tshard::nn::") + op; };
  ConvGeometry<K> g;
  g.N = x[0], g.C = x[1], g.O = w[0], g.s = c.stride;
  if (w[1] != g.C) throw ShapeError(name() + ": the weights' input channels (dim 1) differ from x's channels: " + what.str());
  if (g.s < 1) throw ShapeError(name() + ": the stride must be at least 1: " + what.str());
  if (K == 2 && c.pad_d >= 0) throw ShapeError(name() + ": pad_d is conv3d's depth padding; conv2d takes pad_h and pad_w: " + what.str());
  // The pads in the order of the spatial dims: (h, w) for conv2d, (d, h, w) for conv3d.
  const std::array<Index, 3> explicit_pads = K == 3 ? std::array<Index, 3>{c.pad_d, c.pad_h, c.pad_w}
                                                    : std::array<Index, 3>{c.pad_h, c.pad_w, -1};
  bool any_explicit = false;
  for (int d = 0; d < K; ++d) any_explicit |= explicit_pads[std::size_t(d)] >= 0;
  for (int d = 0; d < K; ++d) {
    const auto i = std::size_t(d);
    g.in[i] = x[2 + d];
    g.k[i] = w[2 + d];
    if (g.k[i] < 1) throw ShapeError(name() + ": the kernel must not be empty: " + what.str());
    if (any_explicit) {
      g.p[i] = std::max<Index>(explicit_pads[i], 0);
    } else if (c.padding == Padding::Same) {
      if (g.k[i] % 2 == 0) throw ShapeError(name() + ": Same padding needs odd kernel extents: " + what.str());
      g.p[i] = (g.k[i] - 1) / 2;
    }
    if (g.in[i] + 2 * g.p[i] < g.k[i]) throw ShapeError(name() + ": the kernel does not fit in the padded input: " + what.str());
    g.out[i] = (g.in[i] + 2 * g.p[i] - g.k[i]) / g.s + 1;
  }
  return g;
}

// The rank's window request: the input points its output block reads, all channels.
template <int K>
tshard::detail::WindowRequest conv_window(const tshard::detail::ShardLayout& ol, const ConvGeometry<K>& g) {
  tshard::detail::WindowRequest q;
  q.empty = ol.valid_size() == 0;
  if (q.empty) return q;
  q.lo[0] = ol.offset[0];
  q.hi[0] = ol.offset[0] + ol.valid[0];
  q.lo[1] = 0;
  q.hi[1] = g.C;
  for (int d = 0; d < K; ++d) {
    const auto i = std::size_t(d);
    q.lo[2 + d] = g.s * ol.offset[2 + d] - g.p[i];
    q.hi[2 + d] = g.s * (ol.offset[2 + d] + ol.valid[2 + d] - 1) - g.p[i] + g.k[i];
  }
  return q;
}

// The local weights as trailing() matrices of (C k0) x O_local, one per kernel position t past
// the first spatial dim: Wt(c + C a, o) = w(o, c, a, t).
template <class T, int K>
std::vector<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>> weight_columns(const T* w, const tshard::detail::ShardLayout& wl,
                                                                             const ConvGeometry<K>& g) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  const Index Ol = wl.valid[0], Op = wl.padded[0], rows = g.C * g.k[0];
  std::vector<Mat> wb(std::size_t(g.trailing()), Mat(rows, Ol));
  for (Index t = 0; t < g.trailing(); ++t)
    for (Index r = 0; r < rows; ++r)
      for (Index o = 0; o < Ol; ++o) wb[std::size_t(t)](r, o) = w[o + Op * (r + rows * t)];
  return wb;
}
// The inverse of weight_columns, into a tensor laid out like the weights.
template <class T, int K>
void store_weight_columns(const std::vector<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>>& wb, T* w,
                          const tshard::detail::ShardLayout& wl, const ConvGeometry<K>& g) {
  const Index rows = g.C * g.k[0];
  for (Index t = 0; t < g.trailing(); ++t)
    for (Index r = 0; r < rows; ++r)
      for (Index o = 0; o < wl.valid[0]; ++o) w[o + wl.padded[0] * (r + rows * t)] = wb[std::size_t(t)](r, o);
}

// Calls f(y_offset, {window_offset per t}) for every point of the output block: y_offset is the
// point's first element in y's padded block (an nv x O_local matrix, leading dim padded[0]),
// window_offset[t] the first element of the nv x (C k0) matrix it multiplies by weight column t.
template <int K, class F>
void for_each_conv_point(const tshard::detail::ShardLayout& ol, const ConvGeometry<K>& g, const Extents& window_dims, F&& f) {
  const Index nv = ol.valid[0], np = ol.padded[0], Opad = ol.padded[1];
  Extents points{}, taps{};
  for (int d = 0; d < K; ++d) points[d] = ol.valid[2 + d];
  for (int d = 1; d < K; ++d) taps[d - 1] = g.k[std::size_t(d)];
  std::vector<Index> at(std::size_t(g.trailing()));
  tshard::detail::for_each_index(points, 0, K, [&](const Extents& i) {
    Index y = 0, ystride = np * Opad;
    for (int d = 0; d < K; ++d) y += i[d] * ystride, ystride *= ol.padded[2 + d];
    std::size_t t = 0;
    tshard::detail::for_each_index(taps, 0, K - 1, [&](const Extents& b) {
      Index w = g.s * i[0], wstride = window_dims[2];
      for (int d = 1; d < K; ++d) w += (g.s * i[d] + b[d - 1]) * wstride, wstride *= window_dims[2 + d];
      at[t++] = nv * g.C * w;
    });
    f(y, at);
  });
}

// The local products, per element type and rank (compiled in tshard::kernels, and per
// instruction-set level: core/dispatch.hpp): out's valid points from the gathered window and the
// weights,
template <class T, int K>
void conv_forward_local(T* out, const tshard::detail::ShardLayout& ol, const T* w, const tshard::detail::ShardLayout& wl,
                        const ConvGeometry<K>& g, const T* win, const Extents& window_dims) {
  TSHARD_DISPATCH((conv_forward_local<T, K>), out, ol, w, wl, g, win, window_dims);
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  const auto wb = weight_columns(w, wl, g);
  if (ol.valid_size() == 0) return;
  const Index nv = ol.valid[0], np = ol.padded[0], Ol = ol.valid[1], rows = g.C * g.k[0];
  for_each_conv_point(ol, g, window_dims, [&](Index at_y, const std::vector<Index>& at) {
    Eigen::Map<Mat, 0, Eigen::OuterStride<>> y(out + at_y, nv, Ol, Eigen::OuterStride<>(np));
    y.setZero();
    for (std::size_t t = 0; t < at.size(); ++t) y.noalias() += Eigen::Map<const Mat>(win + at[t], nv, rows) * wb[t];
  });
}
// and, for dy laid out as the output, the window's gradient (into dwin, zeroed) and this rank's
// part of the weights' (into dw, zeroed, laid out as w).
template <class T, int K>
void conv_backward_local(const T* dy, const tshard::detail::ShardLayout& ol, const T* w,
                         const tshard::detail::ShardLayout& wl, const ConvGeometry<K>& g, const T* win,
                         const Extents& window_dims, T* dwin, T* dw) {
  TSHARD_DISPATCH((conv_backward_local<T, K>), dy, ol, w, wl, g, win, window_dims, dwin, dw);
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  const auto wb = weight_columns(w, wl, g);
  const Index rows = g.C * g.k[0];
  std::vector<Mat> dwb(std::size_t(g.trailing()), Mat::Zero(rows, wl.valid[0]));
  if (ol.valid_size() > 0) {
    const Index nv = ol.valid[0], np = ol.padded[0], Ol = ol.valid[1];
    for_each_conv_point(ol, g, window_dims, [&](Index at_y, const std::vector<Index>& at) {
      Eigen::Map<const Mat, 0, Eigen::OuterStride<>> d(dy + at_y, nv, Ol, Eigen::OuterStride<>(np));
      for (std::size_t t = 0; t < at.size(); ++t) {
        Eigen::Map<Mat>(dwin + at[t], nv, rows).noalias() += d * wb[t].transpose();
        dwb[t].noalias() += Eigen::Map<const Mat>(win + at[t], nv, rows).transpose() * d;
      }
    });
  }
  store_weight_columns(dwb, dw, wl, g);
}

template <class X, class Wt, class Out, int K>
Out conv_forward(const X& x, const Wt& w, const ConvGeometry<K>& g, WindowGather<typename X::Scalar>& saved) {
  auto mesh = tshard::detail::state_of(x.mesh());
  std::array<Index, std::size_t(K + 2)> shape{g.N, g.O};
  for (int d = 0; d < K; ++d) shape[std::size_t(2 + d)] = g.out[std::size_t(d)];
  Out out(x.mesh(), shape);
  const Extents out_extents = tshard::detail::extents_of(out);
  saved.gather(x, [&](int r) {
    return conv_window(tshard::detail::shard_layout_of_rank(Out::spec_desc, out_extents, mesh->shape(), r), g);
  });
  conv_forward_local<typename X::Scalar, K>(out.data(), tshard::detail::layout_of(out), w.data(),
                                            tshard::detail::layout_of(w), g, saved.window.get(), saved.dims);
  return out;
}

// dx and dw for dy (laid out as the output), from what the forward kept.
template <class X, class Wt, class DY, int K>
std::pair<X, Wt> conv_backward(const X& x, const Wt& w, const DY& dy, const ConvGeometry<K>& g,
                               WindowGather<typename X::Scalar>& saved) {
  using T = typename X::Scalar;
  auto mesh = tshard::detail::state_of(x.mesh());
  auto dwin = saved.zeroed_window();
  Wt dw(w.mesh(), w.global_shape());
  std::fill(dw.data(), dw.data() + dw.padded_size(), T(0));
  conv_backward_local<T, K>(dy.data(), tshard::detail::layout_of(dy), w.data(), tshard::detail::layout_of(w), g,
                            saved.window.get(), saved.dims, dwin.get(), dw.data());
  // dx: the window's gradient back to the blocks it was read from; summed over O's axes.
  X dx = saved.template add_back<X>(dwin.get(), x);
  if (const std::uint32_t o_axes = Wt::spec_desc.dims[0].count ? Wt::spec_desc.split_axes() : 0u)
    tshard::detail::all_reduce(mesh->group_of_mask(o_axes), dx.data(), dx.data(), dx.padded_size(), ReduceOp::Sum);
  // dw: this rank's partial over the axes splitting N and the spatial dims, reduced once.
  if (const std::uint32_t spatial = X::spec_desc.split_axes())
    tshard::detail::all_reduce(mesh->group_of_mask(spatial), dw.data(), dw.data(), dw.padded_size(), ReduceOp::Sum);
  return {std::move(dx), std::move(dw)};
}

// The convolution with K spatial dims, as a custom VJP (conv2d and conv3d below).
template <int K, class XT, class WT>
auto convolution(const XT& x_in, const WT& w, const Conv& conv, const char* op) {
  using T = typename XT::Scalar;
  using Specs = conv_out_spec<typename XT::SpecType, typename WT::SpecType>;
  using In = ShardedTensor<T, typename XT::MeshT, typename Specs::input>;
  using Out = ShardedTensor<T, typename XT::MeshT, typename Specs::output>;
  using Wt = ShardedTensor<T, typename WT::MeshT, typename WT::SpecType>;
  static_assert((Wt::spec_desc.split_axes() & In::spec_desc.split_axes()) == 0,
                "tshard: a convolution's weights split O over an axis that also splits the input");
  tshard::detail::OperatorScope scope(op);
  const auto& w_plain = tshard::detail::resolved(w, op);
  tshard::detail::require_same_mesh(x_in, w_plain, op);
  const auto g = conv_geometry<K>(tshard::detail::extents_of(x_in), tshard::detail::extents_of(w_plain), conv, op,
                                  [&] { return "x " + x_in.describe() + ", w " + w_plain.describe(); });
  auto saved = std::make_shared<WindowGather<T>>();
  auto forward = [g, saved, op](const auto& xv, const auto& wv) {
    return conv_forward<In, Wt, Out>(tshard::detail::implicit_reshard<typename Specs::input>(xv, op), wv, g, *saved);
  };
  auto backward = [g, saved, op](const auto& dy, const auto&, const auto& xv, const auto& wv) {
    const In x = tshard::detail::implicit_reshard<typename Specs::input>(xv, op);
    auto [dx, dw] = conv_backward(x, wv, dy, g, *saved);
    return std::tuple{std::move(dx), std::move(dw)};
  };
  return ad::custom_vjp(forward, backward, x_in, w_plain);
}

}  // namespace detail

// y [N, O, H', W'] = conv2d(x [N, C, H, W], w [O, C, kh, kw]): y(n, o, i, j) = sum over c, a, b of
// w(o, c, a, b) x(n, c, s i + a - ph, s j + b - pw), zero outside x. x may be split over N, H
// and W (split channels are gathered first, a partial resolved); w replicated or its O split
// over an axis x does not split; y is split like x with its channels split like w's O.
// Differentiable under ts::ad (custom VJP: see the top of this file). A bias is added by
// broadcasting: y + b with b [O, 1, 1].
template <class XT, class WT>
auto conv2d(const XT& x, const WT& w, const Conv& conv = {}) {
  static_assert(XT::rank == 4, "tshard: conv2d takes NCHW input: a rank-4 tensor (batch, channels, height, width)");
  static_assert(WT::rank == 4, "tshard: conv2d's weights are [O, C, kh, kw]: a rank-4 ShardedTensor");
  static_assert(std::is_same_v<typename XT::Scalar, typename WT::Scalar>, "tshard: conv2d's input and weights have one element type");
  static_assert(std::is_floating_point_v<typename XT::Scalar>, "tshard: conv2d computes in float or double");
  return detail::convolution<2>(x, w, conv, "conv2d");
}

// y [N, O, D', H', W'] = conv3d(x [N, C, D, H, W], w [O, C, kd, kh, kw]), for volumes: conv2d's
// contract with a depth dim (split like H and W, padded by pad_d). A bias is added by
// broadcasting: y + b with b [O, 1, 1, 1].
template <class XT, class WT>
auto conv3d(const XT& x, const WT& w, const Conv& conv = {}) {
  static_assert(XT::rank == 5, "tshard: conv3d takes NCDHW input: a rank-5 tensor (batch, channels, depth, height, width)");
  static_assert(WT::rank == 5, "tshard: conv3d's weights are [O, C, kd, kh, kw]: a rank-5 ShardedTensor");
  static_assert(std::is_same_v<typename XT::Scalar, typename WT::Scalar>, "tshard: conv3d's input and weights have one element type");
  static_assert(std::is_floating_point_v<typename XT::Scalar>, "tshard: conv3d computes in float or double");
  return detail::convolution<3>(x, w, conv, "conv3d");
}

}  // namespace tshard::nn

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp), and per
// instruction-set level (core/dispatch.hpp).
namespace tshard::nn::detail {
#define TSHARD_INSTANCE(T, K)                                                                                   \
  TSHARD_DISPATCHED_KERNEL(void, (conv_forward_local<T, K>), T*, const tshard::detail::ShardLayout&, const T*,     \
                           const tshard::detail::ShardLayout&, const ConvGeometry<K>&, const T*, const Extents&)  \
  TSHARD_DISPATCHED_KERNEL(void, (conv_backward_local<T, K>), const T*, const tshard::detail::ShardLayout&, const T*, \
                           const tshard::detail::ShardLayout&, const ConvGeometry<K>&, const T*, const Extents&, T*, T*)
TSHARD_INSTANCE(float, 2)
TSHARD_INSTANCE(double, 2)
TSHARD_INSTANCE(float, 3)
TSHARD_INSTANCE(double, 3)
#undef TSHARD_INSTANCE
}  // namespace tshard::nn::detail
