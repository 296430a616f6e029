// conv2d: 2-D convolution of NCHW input split on batch and spatial dims, each rank reading the
// input window its output block needs through the halo path (core/halo_geometry.hpp,
// comm/halo_transfer.hpp), then kw GEMMs per output row.
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>
#include <Eigen/Core>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/halo_transfer.hpp"
#include "tshard/core/error.hpp"
#include "tshard/core/halo_geometry.hpp"
#include "tshard/ops/halo.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {

// ---- conv2d ----

// How conv2d treats the edges: Same keeps H x W (zero padding of (k - 1) / 2, odd kernels
// only), Valid keeps only the positions where the kernel fits: (H - kh + 1) x (W - kw + 1).
enum class Padding { Same, Valid };

namespace detail {
template <class SpecT>
struct conv2d_spec;
template <class D0, class D1, class D2, class D3>
struct conv2d_spec<Spec<D0, D1, D2, D3>> {
  using type = Spec<D0, R, D2, D3>;  // channels whole on every rank
};
}  // namespace detail

namespace detail {
// conv2d on one rank, instantiated per element type: x's shard (channels whole, no partial) to
// the output's shard `out` (layout ol), with the input window each output block reads brought
// by the halo path (core/halo_geometry.hpp's plan_window, comm/halo_transfer.hpp).
template <class T>
void conv2d_shards(const std::shared_ptr<MeshState>& mesh, const SpecDesc& spec, const Extents& x_shape,
                   const ShardLayout& xl, const T* x, const Eigen::Tensor<T, 4>& w, Padding padding,
                   const Extents& out_shape, const ShardLayout& ol, T* out) {
  const Index C = x_shape[1];
  const Index O = w.dimension(0), kh = w.dimension(2), kw = w.dimension(3);
  const Index ph = padding == Padding::Same ? (kh - 1) / 2 : 0;
  const Index pw = padding == Padding::Same ? (kw - 1) / 2 : 0;
  // Each rank's window: the input rows and columns its output block reads, every channel. The
  // output block sits where the output's own shape puts it, so Valid padding needs no
  // resharding after.
  auto request_of = [&](int r) {
    WindowRequest q = window_around(shard_layout_of_rank(spec, out_shape, mesh->shape(), r), Extents{0, 0, ph, pw},
                                    Extents{0, 0, kh - 1 - ph, kw - 1 - pw});
    q.lo[1] = 0;
    q.hi[1] = C;
    return q;
  };
  HaloTransfer<T> transfer(mesh, plan_window(spec, x_shape, mesh->shape(), mesh->rank(), request_of, Boundary::Zero));
  const Extents wd = transfer.layout().window;
  Scratch<T> window(static_cast<std::size_t>(volume(wd, 4)));
  transfer.start(x, xl.padded, Extents{}, window.data());
  // Weights as kw matrices of (C*kh) x O, Wb(c + C*a, o) = w(o, c, a, b), so that the input
  // block x(:, :, i..i+kh-1, j+b), contiguous in column-major order, is one (n x C*kh) matrix.
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  std::vector<Mat> wb(std::size_t(kw), Mat(C * kh, O));
  for (Index b = 0; b < kw; ++b)
    for (Index a = 0; a < kh; ++a)
      for (Index c = 0; c < C; ++c)
        for (Index o = 0; o < O; ++o) wb[std::size_t(b)](c + C * a, o) = w(o, c, a, b);
  transfer.finish();
  if (ol.valid_size() == 0) return;
  const Index nv = ol.valid[0], np = ol.padded[0], hp = ol.padded[2];
  for (Index j = 0; j < ol.valid[3]; ++j)
    for (Index i = 0; i < ol.valid[2]; ++i) {
      Eigen::Map<Mat, 0, Eigen::OuterStride<>> y(out + np * O * (i + hp * j), nv, O, Eigen::OuterStride<>(np));
      y.setZero();
      for (Index b = 0; b < kw; ++b) {
        Eigen::Map<const Mat> xb(window.data() + nv * C * (i + wd[2] * (j + b)), nv, C * kh);
        y.noalias() += xb * wb[std::size_t(b)];
      }
    }
}

template <class T, class M, class S>
ShardedTensor<T, M, S> conv2d_plain(const ShardedTensor<T, M, S>& x, const Eigen::Tensor<T, 4>& w, Padding padding) {
  const auto shape = x.global_shape();
  const Eigen::Index kh = w.dimension(2), kw = w.dimension(3);
  const Eigen::Index ph = padding == Padding::Same ? (kh - 1) / 2 : 0;
  const Eigen::Index pw = padding == Padding::Same ? (kw - 1) / 2 : 0;
  ShardedTensor<T, M, S> out(x.mesh(), {shape[0], w.dimension(0), shape[2] + 2 * ph - kh + 1, shape[3] + 2 * pw - kw + 1});
  conv2d_shards<T>(detail::state_of(x.mesh()), ShardedTensor<T, M, S>::spec_desc, detail::extents_of(x),
                   detail::layout_of(x), x.data(), w, padding, detail::extents_of(out), detail::layout_of(out),
                   out.data());
  return out;
}
}  // namespace detail

// 2-D convolution (correlation, as in ML frameworks) of NCHW input x with weights (O, I, kh, kw)
// replicated on every rank, stride 1: out(n, o, i, j) = sum over c, a, b of
// w(o, c, a, b) * x(n, c, i + a - ph, j + b - pw), ph = (kh - 1) / 2 for Same, 0 for Valid.
// x may be split on batch (dim 0) and spatial dims (2, 3); split channels are gathered first
// and a partial x is resolved first. The output, (N, O, H', W'), is split like x with its
// channel dim replicated.
template <class T, class M, class S, class P>
ShardedTensor<T, M, typename detail::conv2d_spec<S>::type> conv2d(const ShardedTensor<T, M, S, P>& x,
                                                                  const Eigen::Tensor<T, 4>& w,
                                                                  Padding padding = Padding::Same) {
  static_assert(S::rank == 4, "tshard: conv2d takes NCHW input: a rank-4 tensor (batch, channels, height, width)");
  using OutSpec = typename detail::conv2d_spec<S>::type;
  detail::OperatorScope scope("conv2d");
  const auto shape = x.global_shape();
  const Eigen::Index C = shape[1], H = shape[2], W = shape[3];
  const Eigen::Index kh = w.dimension(2), kw = w.dimension(3);
  const std::string what = "x " + x.describe() + ", weights " + detail::describe_eigen(w);
  if (w.dimension(1) != C)
    throw ShapeError("tshard::conv2d: the weights' input channels (dim 1) differ from x's channels (dim 1): " + what);
  if (kh < 1 || kw < 1) throw ShapeError("tshard::conv2d: the kernel must not be empty: " + what);
  if (padding == Padding::Same && (kh % 2 == 0 || kw % 2 == 0))
    throw ShapeError("tshard::conv2d: Same padding needs odd kernel extents: " + what);
  if (padding == Padding::Valid && (kh > H || kw > W))
    throw ShapeError("tshard::conv2d: with Valid padding the kernel must fit in the input: " + what);
  if constexpr (P::is_partial || !std::is_same_v<S, OutSpec>)
    return detail::conv2d_plain(detail::implicit_reshard<OutSpec>(x, "conv2d"), w, padding);
  else
    return detail::conv2d_plain(x, w, padding);
}

}  // namespace tshard
