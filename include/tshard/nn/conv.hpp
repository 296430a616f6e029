// ts::nn::conv2d: 2-D convolution (correlation, as PyTorch's) of NCHW input split over N, H and
// W, with weights [O, C, kh, kw] that are a ShardedTensor (replicated, or O split over an axis
// the input does not use), stride 1 or more, Same, Valid or explicit zero padding, and its
// gradient (a custom VJP under ts::ad):
//  - each rank reads the input window its output block needs through the halo path
//    (core/halo_geometry.hpp's plan_window), GSPMD's halo exchange for windowed operators;
//  - the input gradient is the transposed convolution into that window, whose halo parts go
//    back to their owners and are added there (HaloTransfer::add_back); summed over the
//    output-channel axis where the weights split O;
//  - the weight gradient is a partial sum over the axes that split N, H and W, reduced once.
#pragma once
#include <Eigen/Core>

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tshard/ad/custom_vjp.hpp"
#include "tshard/comm/collectives.hpp"
#include "tshard/core/halo_geometry.hpp"
#include "tshard/ops/conv2d.hpp"
#include "tshard/nn/window_gather.hpp"
#include "tshard/reshard/reshard.hpp"

namespace tshard::nn {

// A convolution's settings (DESIGN: stride, then padding; more may follow). pad_h / pad_w >= 0
// give explicit zero padding on both sides instead of `padding`. Same pads (k - 1) / 2 (odd
// kernels): H' = ceil(H / stride); in general H' = floor((H + 2 pad - kh) / stride) + 1.
struct Conv {
  Eigen::Index stride = 1;
  Padding padding = Padding::Same;
  Eigen::Index pad_h = -1, pad_w = -1;
};

namespace detail {

using tshard::detail::Extents;
using tshard::detail::Index;

template <class XSpec, class WSpec>
struct conv_out_spec;
template <class D0, class D1, class D2, class D3, class W0, class W1, class W2, class W3>
struct conv_out_spec<Spec<D0, D1, D2, D3>, Spec<W0, W1, W2, W3>> {
  static_assert(std::is_same_v<W1, R> && std::is_same_v<W2, R> && std::is_same_v<W3, R>,
                "tshard: conv2d's weights [O, C, kh, kw] may split O only: C, kh and kw are replicated");
  using input = Spec<D0, R, D2, D3>;    // channels whole on every rank
  using output = Spec<D0, W0, D2, D3>;  // output channels split as the weights' O
};

// The geometry of one conv2d on one mesh: sizes, padding, and this rank's window plan.
struct ConvGeometry {
  Index N = 0, C = 0, H = 0, W = 0, O = 0, kh = 0, kw = 0, s = 1, ph = 0, pw = 0, Ho = 0, Wo = 0;
};

inline ConvGeometry conv_geometry(const Extents& x, const Extents& w, const Conv& c, const std::string& what) {
  ConvGeometry g;
  g.N = x[0], g.C = x[1], g.H = x[2], g.W = x[3], g.O = w[0], g.kh = w[2], g.kw = w[3], g.s = c.stride;
  if (w[1] != g.C) throw ShapeError("tshard::nn::conv2d: the weights' input channels (dim 1) differ from x's channels: " + what);
  if (g.kh < 1 || g.kw < 1) throw ShapeError("tshard::nn::conv2d: the kernel must not be empty: " + what);
  if (g.s < 1) throw ShapeError("tshard::nn::conv2d: the stride must be at least 1: " + what);
  if (c.pad_h >= 0 || c.pad_w >= 0) {
    g.ph = std::max<Index>(c.pad_h, 0);
    g.pw = std::max<Index>(c.pad_w, 0);
  } else if (c.padding == Padding::Same) {
    if (g.kh % 2 == 0 || g.kw % 2 == 0) throw ShapeError("tshard::nn::conv2d: Same padding needs odd kernel extents: " + what);
    g.ph = (g.kh - 1) / 2;
    g.pw = (g.kw - 1) / 2;
  }
  if (g.H + 2 * g.ph < g.kh || g.W + 2 * g.pw < g.kw)
    throw ShapeError("tshard::nn::conv2d: the kernel does not fit in the padded input: " + what);
  g.Ho = (g.H + 2 * g.ph - g.kh) / g.s + 1;
  g.Wo = (g.W + 2 * g.pw - g.kw) / g.s + 1;
  return g;
}

// The rank's window request: the input rows and columns its output block reads, all channels.
inline tshard::detail::WindowRequest conv_window(const tshard::detail::ShardLayout& ol, const ConvGeometry& g) {
  tshard::detail::WindowRequest q;
  q.empty = ol.valid_size() == 0;
  if (q.empty) return q;
  q.lo[0] = ol.offset[0];
  q.hi[0] = ol.offset[0] + ol.valid[0];
  q.lo[1] = 0;
  q.hi[1] = g.C;
  const Index k[2] = {g.kh, g.kw}, p[2] = {g.ph, g.pw};
  for (int d = 2; d < 4; ++d) {
    q.lo[d] = g.s * ol.offset[d] - p[d - 2];
    q.hi[d] = g.s * (ol.offset[d] + ol.valid[d] - 1) - p[d - 2] + k[d - 2];
  }
  return q;
}

// The local weights as kw matrices of (C kh) x O_local: Wb(c + C a, o) = w(o, c, a, b).
template <class T>
std::vector<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>> weight_columns(const T* w, const tshard::detail::ShardLayout& wl,
                                                                             const ConvGeometry& g) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  const Index Ol = wl.valid[0], Op = wl.padded[0];
  std::vector<Mat> wb(std::size_t(g.kw), Mat(g.C * g.kh, Ol));
  for (Index b = 0; b < g.kw; ++b)
    for (Index a = 0; a < g.kh; ++a)
      for (Index c = 0; c < g.C; ++c)
        for (Index o = 0; o < Ol; ++o) wb[std::size_t(b)](c + g.C * a, o) = w[o + Op * (c + g.C * (a + g.kh * b))];
  return wb;
}

template <class X, class Wt, class Out>
Out conv_forward(const X& x, const Wt& w, const ConvGeometry& g, WindowGather<typename X::Scalar>& saved) {
  using T = typename X::Scalar;
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  auto mesh = tshard::detail::state_of(x.mesh());
  Out out(x.mesh(), {g.N, g.O, g.Ho, g.Wo});
  const auto& ol = tshard::detail::layout_of(out);
  const Extents out_shape = tshard::detail::extents_of(out);
  saved.gather(x, [&](int r) {
    return conv_window(tshard::detail::shard_layout_of_rank(Out::spec_desc, out_shape, mesh->shape(), r), g);
  });
  const auto wb = weight_columns(w.data(), tshard::detail::layout_of(w), g);
  if (ol.valid_size() == 0) return out;
  const Index nv = ol.valid[0], np = ol.padded[0], Ol = ol.valid[1], Opad = ol.padded[1], hp = ol.padded[2];
  const Index wh = saved.dims[2];
  const T* win = saved.window.get();
  for (Index j = 0; j < ol.valid[3]; ++j)
    for (Index i = 0; i < ol.valid[2]; ++i) {
      Eigen::Map<Mat, 0, Eigen::OuterStride<>> y(out.data() + np * Opad * (i + hp * j), nv, Ol, Eigen::OuterStride<>(np));
      y.setZero();
      for (Index b = 0; b < g.kw; ++b) {
        Eigen::Map<const Mat> xb(win + nv * g.C * (g.s * i + wh * (g.s * j + b)), nv, g.C * g.kh);
        y.noalias() += xb * wb[std::size_t(b)];
      }
    }
  return out;
}

// dx and dw for dy (laid out as the output), from what the forward kept.
template <class X, class Wt, class DY>
std::pair<X, Wt> conv_backward(const X& x, const Wt& w, const DY& dy, const ConvGeometry& g, WindowGather<typename X::Scalar>& saved) {
  using T = typename X::Scalar;
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  auto mesh = tshard::detail::state_of(x.mesh());
  const auto& ol = tshard::detail::layout_of(dy);
  const auto& wl = tshard::detail::layout_of(w);
  auto dwin = saved.zeroed_window();
  const auto wb = weight_columns(w.data(), wl, g);
  std::vector<Mat> dwb(std::size_t(g.kw), Mat::Zero(g.C * g.kh, wl.valid[0]));
  if (ol.valid_size() > 0) {
    const Index nv = ol.valid[0], np = ol.padded[0], Ol = ol.valid[1], Opad = ol.padded[1], hp = ol.padded[2];
    const Index wh = saved.dims[2];
    const T* win = saved.window.get();
    for (Index j = 0; j < ol.valid[3]; ++j)
      for (Index i = 0; i < ol.valid[2]; ++i) {
        Eigen::Map<const Mat, 0, Eigen::OuterStride<>> d(dy.data() + np * Opad * (i + hp * j), nv, Ol, Eigen::OuterStride<>(np));
        for (Index b = 0; b < g.kw; ++b) {
          const Index at = nv * g.C * (g.s * i + wh * (g.s * j + b));
          Eigen::Map<Mat>(dwin.get() + at, nv, g.C * g.kh).noalias() += d * wb[std::size_t(b)].transpose();
          dwb[std::size_t(b)].noalias() += Eigen::Map<const Mat>(win + at, nv, g.C * g.kh).transpose() * d;
        }
      }
  }
  // dx: the window's gradient back to the blocks it was read from; summed over O's axes.
  X dx = saved.template add_back<X>(dwin.get(), x);
  if (const std::uint32_t o_axes = Wt::spec_desc.dims[0].count ? Wt::spec_desc.split_axes() : 0u)
    tshard::detail::all_reduce(mesh->group_of_mask(o_axes), dx.data(), dx.data(), dx.padded_size(), ReduceOp::Sum);
  // dw: this rank's partial over the axes splitting N, H and W, reduced once.
  Wt dw(w.mesh(), w.global_shape());
  std::fill(dw.data(), dw.data() + dw.padded_size(), T(0));
  for (Index b = 0; b < g.kw; ++b)
    for (Index a = 0; a < g.kh; ++a)
      for (Index c = 0; c < g.C; ++c)
        for (Index o = 0; o < wl.valid[0]; ++o) dw.data()[o + wl.padded[0] * (c + g.C * (a + g.kh * b))] = dwb[std::size_t(b)](c + g.C * a, o);
  if (const std::uint32_t nhw = X::spec_desc.split_axes())
    tshard::detail::all_reduce(mesh->group_of_mask(nhw), dw.data(), dw.data(), dw.padded_size(), ReduceOp::Sum);
  return {std::move(dx), std::move(dw)};
}

}  // namespace detail

// y [N, O, H', W'] = conv2d(x [N, C, H, W], w [O, C, kh, kw]): y(n, o, i, j) = sum over c, a, b of
// w(o, c, a, b) x(n, c, s i + a - ph, s j + b - pw), zero outside x. x may be split over N, H
// and W (split channels are gathered first, a partial resolved); w replicated or its O split
// over an axis x does not split; y is split like x with its channels split like w's O.
// Differentiable under ts::ad (custom VJP: see the top of this file). A bias is added by
// broadcasting: y + b with b [O, 1, 1].
template <class XT, class WT>
auto conv2d(const XT& x_in, const WT& w, const Conv& conv = {}) {
  static_assert(XT::rank == 4, "tshard: conv2d takes NCHW input: a rank-4 tensor (batch, channels, height, width)");
  static_assert(WT::rank == 4, "tshard: conv2d's weights are [O, C, kh, kw]: a rank-4 ShardedTensor");
  static_assert(std::is_same_v<typename XT::Scalar, typename WT::Scalar>, "tshard: conv2d's input and weights have one element type");
  static_assert(std::is_floating_point_v<typename XT::Scalar>, "tshard: conv2d computes in float or double");
  using T = typename XT::Scalar;
  using Specs = detail::conv_out_spec<typename XT::SpecType, typename WT::SpecType>;
  using In = ShardedTensor<T, typename XT::MeshT, typename Specs::input>;
  using Out = ShardedTensor<T, typename XT::MeshT, typename Specs::output>;
  using Wt = ShardedTensor<T, typename WT::MeshT, typename WT::SpecType>;
  static_assert((Wt::spec_desc.split_axes() & In::spec_desc.split_axes()) == 0,
                "tshard: conv2d's weights split O over an axis that also splits the input");
  tshard::detail::OperatorScope scope("conv2d");
  const auto& w_plain = tshard::detail::resolved(w, "conv2d");
  tshard::detail::require_same_mesh(x_in, w_plain, "conv2d");
  const auto g = detail::conv_geometry(tshard::detail::extents_of(x_in), tshard::detail::extents_of(w_plain), conv,
                                       "x " + x_in.describe() + ", w " + w_plain.describe());
  auto saved = std::make_shared<detail::WindowGather<T>>();
  auto forward = [g, saved](const auto& xv, const auto& wv) {
    return detail::conv_forward<In, Wt, Out>(tshard::detail::implicit_reshard<typename Specs::input>(xv, "conv2d"), wv, g, *saved);
  };
  auto backward = [g, saved](const auto& dy, const auto&, const auto& xv, const auto& wv) {
    const In x = tshard::detail::implicit_reshard<typename Specs::input>(xv, "conv2d_backward");
    auto [dx, dw] = detail::conv_backward(x, wv, dy, g, *saved);
    return std::tuple{std::move(dx), std::move(dw)};
  };
  return ad::custom_vjp(forward, backward, x_in, w_plain);
}

}  // namespace tshard::nn
