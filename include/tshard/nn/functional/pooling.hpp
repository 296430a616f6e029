// Pooling and upsampling of NCHW tensors split over any of N, C, H and W, with their gradients:
// max_pool2d and avg_pool2d (k x k windows, stride s, no padding: H' = floor((H - k) / s) + 1,
// PyTorch's default) and upsample2d (nearest, by an integer factor). Each rank reads the input
// window its output block needs through the halo path (a pooling window that crosses a shard
// border takes a halo); the gradient goes into that window and back to the owners through the
// exchange's transpose (HaloTransfer::add_back). Custom VJPs under ts::ad.
#pragma once
#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tshard/ad/custom_vjp.hpp"
#include "tshard/core/dispatch.hpp"
#include "tshard/core/halo_geometry.hpp"
#include "tshard/nn/functional/window_gather.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::nn {
namespace detail {

using tshard::detail::Extents;
using tshard::detail::Index;

enum class WindowKind { Max, Average, Nearest };

struct WindowOp {
  WindowKind kind;
  Index k = 1, s = 1;  // pooling: kernel and stride; nearest: k = s = the factor
  // The first input row read by output row o, and how many rows it reads.
  Index first(Index o) const { return kind == WindowKind::Nearest ? o / k : s * o; }
  Index out_extent(Index n) const { return kind == WindowKind::Nearest ? n * k : (n - k) / s + 1; }
};

template <class T>
struct WindowSaved : WindowGather<T> {
  std::vector<Index> argmax;  // max pooling: the window offset each output element took
};

// f(n, c, i, j, h0, w0, k) for every output element of the block ol, in order (k counts them):
// the element reads window rows and columns from (h0, w0) on (the window starts at global lo).
template <class F>
void for_each_output(const WindowOp& op, const tshard::detail::ShardLayout& ol, const Extents& lo, F&& f) {
  std::size_t k = 0;
  for (Index j = 0; j < ol.valid[3]; ++j)
    for (Index i = 0; i < ol.valid[2]; ++i) {
      const Index h0 = op.first(ol.offset[2] + i) - lo[2], w0 = op.first(ol.offset[3] + j) - lo[3];
      for (Index c = 0; c < ol.valid[1]; ++c)
        for (Index n = 0; n < ol.valid[0]; ++n) f(n, c, i, j, h0, w0, k++);
    }
}

// Output element (n, c, i, j) of the block ol reads the window win (extents wd, from global lo)
// at rows first(o0 + i) - lo; max pooling writes the offset each element took into argmax (one
// per valid output element). Dispatched (core/dispatch.hpp).
template <class T>
void window_forward_kernel(const WindowOp& op, const tshard::detail::ShardLayout& ol, const T* win, const Extents& wd,
                           const Extents& lo, T* out, Index* argmax) {
  TSHARD_DISPATCH((window_forward_kernel<T>), op, ol, win, wd, lo, out, argmax);
  const Index np = ol.padded[0], cp = ol.padded[1], hp = ol.padded[2];
  const Index reach = op.kind == WindowKind::Nearest ? 1 : op.k;
  for_each_output(op, ol, lo, [&](Index n, Index c, Index i, Index j, Index h0, Index w0, std::size_t k) {
    T acc = op.kind == WindowKind::Max ? -std::numeric_limits<T>::infinity() : T(0);
    Index best = 0;
    for (Index b = 0; b < reach; ++b)
      for (Index a = 0; a < reach; ++a) {
        const Index at = n + wd[0] * (c + wd[1] * ((h0 + a) + wd[2] * (w0 + b)));
        if (op.kind != WindowKind::Max) acc += win[at];
        else if (win[at] > acc || (a == 0 && b == 0)) acc = win[at], best = at;
      }
    if (op.kind == WindowKind::Max) argmax[k] = best;
    if (op.kind == WindowKind::Average) acc /= T(op.k * op.k);
    out[n + np * (c + cp * (i + hp * j))] = acc;
  });
}
template <class T>
void window_forward(const WindowOp& op, const tshard::detail::ShardLayout& ol, WindowSaved<T>& sv, T* out) {
  if (op.kind == WindowKind::Max) sv.argmax.assign(std::size_t(ol.valid_size()), 0);
  window_forward_kernel<T>(op, ol, sv.window.get(), sv.dims, sv.lo, out, sv.argmax.data());
}

// The window's gradient: each output element's cotangent to what it read. Dispatched.
template <class T>
void window_backward_kernel(const WindowOp& op, const tshard::detail::ShardLayout& ol, const Extents& wd,
                            const Extents& lo, const Index* argmax, const T* dy, T* dwin) {
  TSHARD_DISPATCH((window_backward_kernel<T>), op, ol, wd, lo, argmax, dy, dwin);
  const Index np = ol.padded[0], cp = ol.padded[1], hp = ol.padded[2];
  const Index reach = op.kind == WindowKind::Nearest ? 1 : op.k;
  for_each_output(op, ol, lo, [&](Index n, Index c, Index i, Index j, Index h0, Index w0, std::size_t k) {
    const T g = dy[n + np * (c + cp * (i + hp * j))];
    if (op.kind == WindowKind::Max) {
      dwin[argmax[k]] += g;
      return;
    }
    const T share = op.kind == WindowKind::Average ? g / T(op.k * op.k) : g;
    for (Index b = 0; b < reach; ++b)
      for (Index a = 0; a < reach; ++a) dwin[n + wd[0] * (c + wd[1] * ((h0 + a) + wd[2] * (w0 + b)))] += share;
  });
}
template <class T>
void window_backward(const WindowOp& op, const tshard::detail::ShardLayout& ol, const WindowSaved<T>& sv, const T* dy, T* dwin) {
  window_backward_kernel<T>(op, ol, sv.dims, sv.lo, sv.argmax.data(), dy, dwin);
}

template <class X>
auto window_op(const X& x_in, const WindowOp op, const char* name) {
  static_assert(X::rank == 4, "tshard: pooling and upsampling take NCHW input: a rank-4 tensor");
  static_assert(std::is_floating_point_v<typename X::Scalar>, "tshard: pooling and upsampling compute in float or double");
  using T = typename X::Scalar;
  using Plain = ShardedTensor<T, typename X::MeshT, typename X::SpecType>;
  tshard::detail::OperatorScope scope(name);
  const Extents in = tshard::detail::extents_of(x_in);
  if (op.k < 1 || op.s < 1 || (op.kind != WindowKind::Nearest && (op.k > in[2] || op.k > in[3])))
    throw ShapeError(std::string("tshard::nn::") + name + ": kernel " + std::to_string(op.k) + " and stride " +
                     std::to_string(op.s) + " do not fit x " + x_in.describe());
  auto saved = std::make_shared<WindowSaved<T>>();
  auto forward = [op, saved](const auto& xv) {
    const auto& x = tshard::detail::resolved(xv, "window");
    auto mesh = tshard::detail::state_of(x.mesh());
    const Extents shape = tshard::detail::extents_of(x);
    Plain out(x.mesh(), {shape[0], shape[1], op.out_extent(shape[2]), op.out_extent(shape[3])});
    const Extents out_shape = tshard::detail::extents_of(out);
    auto request = [&](int r) {
      const auto ol = tshard::detail::shard_layout_of_rank(Plain::spec_desc, out_shape, mesh->shape(), r);
      tshard::detail::WindowRequest q;
      q.empty = ol.valid_size() == 0;
      if (q.empty) return q;
      for (int d = 0; d < 2; ++d) q.lo[d] = ol.offset[d], q.hi[d] = ol.offset[d] + ol.valid[d];
      for (int d = 2; d < 4; ++d) {
        q.lo[d] = op.first(ol.offset[d]);
        q.hi[d] = op.first(ol.offset[d] + ol.valid[d] - 1) + (op.kind == WindowKind::Nearest ? 1 : op.k);
      }
      return q;
    };
    saved->gather(x, request);
    if (tshard::detail::layout_of(out).valid_size() > 0) window_forward(op, tshard::detail::layout_of(out), *saved, out.data());
    return out;
  };
  auto backward = [op, saved](const auto& dy, const auto&, const auto& xv) {
    auto dwin = saved->zeroed_window();
    if (tshard::detail::layout_of(dy).valid_size() > 0) window_backward(op, tshard::detail::layout_of(dy), *saved, dy.data(), dwin.get());
    return saved->template add_back<Plain>(dwin.get(), xv);
  };
  return ad::custom_vjp(forward, backward, x_in);
}

}  // namespace detail

// Max over k x k windows with stride s (default k): [N, C, floor((H - k) / s) + 1, ...].
template <class X>
auto max_pool2d(const X& x, Eigen::Index kernel, Eigen::Index stride = 0) {
  return detail::window_op(x, detail::WindowOp{detail::WindowKind::Max, kernel, stride > 0 ? stride : kernel}, "max_pool2d");
}
// The mean over k x k windows with stride s (default k).
template <class X>
auto avg_pool2d(const X& x, Eigen::Index kernel, Eigen::Index stride = 0) {
  return detail::window_op(x, detail::WindowOp{detail::WindowKind::Average, kernel, stride > 0 ? stride : kernel}, "avg_pool2d");
}
// Nearest upsampling by an integer factor: y(n, c, i, j) = x(n, c, i / f, j / f), [N, C, f H, f W].
template <class X>
auto upsample2d(const X& x, Eigen::Index factor) {
  return detail::window_op(x, detail::WindowOp{detail::WindowKind::Nearest, factor, factor}, "upsample2d");
}

}  // namespace tshard::nn

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp), and per
// instruction-set level (core/dispatch.hpp).
namespace tshard::nn::detail {
#define TSHARD_INSTANCE(T)                                                                                         \
  TSHARD_DISPATCHED_KERNEL(void, (window_forward_kernel<T>), const WindowOp&, const tshard::detail::ShardLayout&, \
                           const T*, const Extents&, const Extents&, T*, Index*)                                  \
  TSHARD_DISPATCHED_KERNEL(void, (window_backward_kernel<T>), const WindowOp&, const tshard::detail::ShardLayout&, \
                           const Extents&, const Extents&, const Index*, const T*, T*)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::nn::detail
