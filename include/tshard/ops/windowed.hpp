// Windowed operators: with_halo, HaloPlan, stencils, convolve and conv2d. Each rank works on
// its shard widened by a halo that comm/halo.hpp exchanges point to point (GSPMD section 3.3's
// halo exchange for spatially partitioned convolutions; the ghost cells of stencil codes).
//
// Halo semantics (DESIGN.md): element i of a rank's extended block is the global element
// local_offset[d] + i_d - before_d in every dim d; outside [0, N_d) it is 0 (Boundary::Zero) or
// wraps modulo N_d (Boundary::Periodic). Replicated dims take their halo from the rank's own
// data; corners are included. A rank whose shard is empty gets an empty block.
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>
#include <Eigen/Core>

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tshard/comm/halo.hpp"
#include "tshard/comm/stats.hpp"
#include "tshard/core/box_copy.hpp"
#include "tshard/core/error.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {

namespace detail {

// Tag of HaloPlan's constructor from a std::array of widths.
struct HaloWidths {};

// Widths as a std::array of the tensor's rank (the public functions static_assert N == Rank
// first; copying min(N, Rank) entries keeps that message the only error).
template <int Rank, std::size_t N>
std::array<Halo, Rank> symmetric_halo(const Eigen::Index (&widths)[N]) {
  std::array<Halo, Rank> h{};
  for (std::size_t d = 0; d < N && d < std::size_t(Rank); ++d) h[d] = Halo{widths[d], widths[d]};
  return h;
}
template <int Rank, std::size_t N>
std::array<Halo, Rank> halo_array(const Halo (&widths)[N]) {
  std::array<Halo, Rank> h{};
  for (std::size_t d = 0; d < N && d < std::size_t(Rank); ++d) h[d] = widths[d];
  return h;
}

template <std::size_t N>
std::string halo_to_string(const std::array<Halo, N>& h) {
  std::string s = "[";
  for (std::size_t d = 0; d < N; ++d) {
    if (d) s += ", ";
    if (h[d].before == h[d].after)
      s += std::to_string(h[d].before);
    else
      s += "(" + std::to_string(h[d].before) + ", " + std::to_string(h[d].after) + ")";
  }
  return s + "]";
}

// Negative widths are a ShapeError, thrown on every rank alike (widths are global facts).
template <std::size_t N>
void check_halo_widths(const std::array<Halo, N>& h, const char* op, const std::string& tensor) {
  for (auto& w : h)
    if (w.before < 0 || w.after < 0)
      throw ShapeError(std::string("tshard::") + op + ": halo widths must not be negative: widths " +
                       halo_to_string(h) + " for " + tensor);
}

template <class X>
std::string describe_eigen(const X& t) {
  Extents e{};
  for (int d = 0; d < int(X::NumDimensions); ++d) e[d] = t.dimension(d);
  return shape_to_string(e, int(X::NumDimensions));
}

// Column-major strides of a buffer.
inline Extents strides_of(const Extents& dims, int rank) {
  Extents s{};
  Index t = 1;
  for (int d = 0; d < rank; ++d) {
    s[d] = t;
    t *= dims[d];
  }
  return s;
}

}  // namespace detail

// The window around one point of a stencil: v(o0, o1, ...) is the input element at the point's
// index plus the offsets, which must lie within the halo widths.
template <class T, int Rank>
class StencilView {
 public:
  StencilView(const T* center, const std::array<Eigen::Index, Rank>& strides) : center_(center), strides_(strides) {}
  template <class... I>
  const T& operator()(I... offsets) const {
    static_assert(sizeof...(I) == std::size_t(Rank), "tshard: a stencil view takes one offset per tensor dim");
    const Eigen::Index o[] = {Eigen::Index(offsets)...};
    Eigen::Index lin = o[0];  // dim 0 is contiguous (column-major)
    for (int d = 1; d < Rank; ++d) lin += o[d] * strides_[d];
    return center_[lin];
  }
  const T& at(const std::array<Eigen::Index, Rank>& offsets) const {
    Eigen::Index lin = 0;
    for (int d = 0; d < Rank; ++d) lin += offsets[d] * strides_[d];
    return center_[lin];
  }
  // The point itself and the strides of the extended block, for kernels that precompute
  // linear offsets (convolve does).
  const T* center() const { return center_; }
  const std::array<Eigen::Index, Rank>& strides() const { return strides_; }

 private:
  const T* center_;
  std::array<Eigen::Index, Rank> strides_;
};

namespace detail {

// out[at out_shift + i] = f(view at window[window_shift + i]) for i in the box [lo, hi) of a
// rank's valid block; f may also take the global index as a second argument.
template <class T, int Rank, class F>
void stencil_box(const T* window, const Extents& window_dims, const Extents& window_shift, T* out,
                 const Extents& out_dims, const Extents& out_shift, const Extents& offset, const Extents& lo,
                 const Extents& hi, F& f) {
  for (int d = 0; d < Rank; ++d)
    if (hi[d] <= lo[d]) return;
  const Extents ws = strides_of(window_dims, Rank), os = strides_of(out_dims, Rank);
  std::array<Eigen::Index, Rank> wstrides{};
  for (int d = 0; d < Rank; ++d) wstrides[d] = ws[d];
  Extents idx = lo;
  for (;;) {
    Index wbase = 0, obase = 0;
    for (int d = 1; d < Rank; ++d) {
      wbase += (idx[d] + window_shift[d]) * ws[d];
      obase += (idx[d] + out_shift[d]) * os[d];
    }
    const T* w = window + wbase + window_shift[0];
    T* o = out + obase + out_shift[0];
    if constexpr (std::is_invocable_v<F&, const StencilView<T, Rank>&, const std::array<Eigen::Index, Rank>&>) {
      std::array<Eigen::Index, Rank> g{};
      for (int d = 1; d < Rank; ++d) g[d] = offset[d] + idx[d];
      for (Index i = lo[0]; i < hi[0]; ++i) {
        g[0] = offset[0] + i;
        o[i] = T(f(StencilView<T, Rank>(w + i, wstrides), g));
      }
    } else {
      for (Index i = lo[0]; i < hi[0]; ++i) o[i] = T(f(StencilView<T, Rank>(w + i, wstrides)));
    }
    int d = 1;
    for (; d < Rank; ++d) {
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
    }
    if (d >= Rank) return;
  }
}

}  // namespace detail

// A reusable halo exchange for one tensor layout (mesh, spec, global shape) and halo widths:
// the exchange pattern is computed once and its buffers are taken from the pool once, so
// repeated exchanges allocate nothing. start() / finish() bracket work that overlaps the
// messages: apply_inner() touches only points whose window holds nothing that arrives in a
// message, apply_outer() the rest, after finish().
//
// An extended block is an Eigen::Tensor of extended_shape(): the valid block widened by the
// halo widths; its interior (offset `before` in every dim) is the block itself. Stencil codes
// keep their fields in extended blocks and exchange in place (start(ext)), as hand-written
// codes keep ghost cells, so no step copies a whole block. As with ghost cells, the halos
// beyond a Zero boundary are zeroed once, by make_extended() or load_interior(), and in-place
// exchanges leave them alone: write only the interior of an extended block.
template <class T, int Rank>
class HaloPlan {
  static_assert(Rank >= 1, "tshard: halos need a tensor of rank 1 or more");

 public:
  using Shape = std::array<Eigen::Index, Rank>;
  using Extended = Eigen::Tensor<T, Rank>;

  // Halos of the same width on both sides of each dim.
  template <class M, class S, class P, std::size_t N>
  HaloPlan(const ShardedTensor<T, M, S, P>& like, const Eigen::Index (&widths)[N], Boundary boundary)
      : HaloPlan(detail::HaloWidths{}, like, detail::symmetric_halo<Rank>(widths), boundary) {
    static_assert(N == std::size_t(Rank), "tshard: give one halo width per tensor dim");
  }
  // Halos of widths Halo{before, after} per dim.
  template <class M, class S, class P, std::size_t N>
  HaloPlan(const ShardedTensor<T, M, S, P>& like, const Halo (&widths)[N], Boundary boundary)
      : HaloPlan(detail::HaloWidths{}, like, detail::halo_array<Rank>(widths), boundary) {
    static_assert(N == std::size_t(Rank), "tshard: give one halo width per tensor dim");
  }
  // Widths from a run-time array (the tag keeps braced lists unambiguous).
  template <class M, class S, class P>
  HaloPlan(detail::HaloWidths, const ShardedTensor<T, M, S, P>& like, const std::array<Halo, Rank>& widths,
           Boundary boundary, const char* op = "HaloPlan")
      : mesh_(like.mesh().state()),
        spec_(like.spec_desc.without_partial()),
        shape_(like.extents()),
        layout_(like.layout()),
        widths_(widths),
        boundary_(boundary) {
    static_assert(S::rank == Rank, "tshard: the plan's rank differs from the tensor's rank");
    detail::check_halo_widths(widths, op, like.describe());
    detail::Extents before{}, after{};
    for (int d = 0; d < Rank; ++d) {
      before[d] = widths[d].before;
      after[d] = widths[d].after;
    }
    exchange_ = detail::HaloExchange<T>(
        mesh_, detail::plan_halo(spec_, shape_, mesh_->shape(), mesh_->rank(), before, after, boundary));
    mark_remote_sides();
  }

  HaloPlan(HaloPlan&&) = default;
  HaloPlan& operator=(HaloPlan&&) = default;

  // The valid block widened by the widths; all zeros on a rank whose shard is empty.
  Shape extended_shape() const { return detail::to_array<Rank>(exchange_.layout().window); }
  Shape local_shape() const { return detail::to_array<Rank>(layout_.valid); }
  Shape local_offset() const { return detail::to_array<Rank>(layout_.offset); }
  const std::array<Halo, Rank>& widths() const { return widths_; }
  Boundary boundary() const { return boundary_; }
  bool empty() const { return layout_.valid_size() == 0; }
  bool in_flight() const { return exchange_.in_flight(); }

  // An extended block of zeros.
  Extended make_extended() const {
    Extended e(extended_shape());
    e.setZero();
    return e;
  }
  // An extended block holding x's shard in its interior and the halos filled (blocking).
  template <class M, class S>
  Extended make_extended(const ShardedTensor<T, M, S>& x) {
    Extended e(extended_shape());
    start(x, e);
    finish();
    return e;
  }

  // Copies x's shard into the interior of ext (resized to extended_shape() if its shape
  // differs) and starts the halo exchange into ext. Leave ext alone until finish().
  template <class M, class S>
  void start(const ShardedTensor<T, M, S>& x, Extended& ext) {
    check_tensor(x, "HaloPlan::start");
    if (detail::to_extents(std::array<Eigen::Index, Rank>(ext.dimensions())) != exchange_.layout().window)
      ext.resize(extended_shape());
    const detail::Extents zero{};
    exchange_.start(x.data(), layout_.padded, zero, ext.data());
  }
  // Starts filling the halos of ext, whose interior already holds the block (no block copy);
  // its zero halos are taken as they are (see above).
  void start(Extended& ext) {
    check_extended(ext, "HaloPlan::start");
    exchange_.start(ext.data(), exchange_.layout().window, before(), ext.data(), false);
  }
  // Waits for the halo messages and writes them into the block given to start().
  void finish() { exchange_.finish(); }
  template <class M, class S>
  void exchange(const ShardedTensor<T, M, S>& x, Extended& ext) {
    start(x, ext);
    finish();
  }
  void exchange(Extended& ext) {
    start(ext);
    finish();
  }

  // Copies x's shard into the interior of ext and zeroes its halos beyond a Zero boundary; the
  // other halos are left for the next exchange.
  template <class M, class S>
  void load_interior(const ShardedTensor<T, M, S>& x, Extended& ext) const {
    check_tensor(x, "HaloPlan::load_interior");
    check_extended(ext, "HaloPlan::load_interior");
    const detail::Extents zero{};
    detail::copy_box(x.data(), layout_.padded, zero, ext.data(), exchange_.layout().window, before(), layout_.valid,
                     Rank);
    exchange_.fill_zeros(ext.data());
  }
  // Copies the interior of ext into x's shard.
  template <class M, class S>
  void store_interior(const Extended& ext, ShardedTensor<T, M, S>& x) const {
    check_tensor(x, "HaloPlan::store_interior");
    check_extended(ext, "HaloPlan::store_interior");
    const detail::Extents zero{};
    detail::copy_box(ext.data(), exchange_.layout().window, before(), x.data(), layout_.padded, zero, layout_.valid,
                     Rank);
  }

  // out(i) = f(view around i) for the points of the valid block whose window holds no halo
  // element that comes in a message (safe while the exchange is in flight), or for all the
  // others (after finish()). f takes a StencilView<T, Rank> (and optionally the global index as
  // std::array<Eigen::Index, Rank>) and returns the new value; out is an extended block (its
  // interior is written, never its halos) or a tensor of the plan's layout (its shard).
  template <class F>
  void apply_inner(const Extended& in, Extended& out, F&& f) const {
    check_extended(in, "HaloPlan::apply_inner");
    check_extended(out, "HaloPlan::apply_inner");
    apply_region(true, in, out.data(), exchange_.layout().window, before(), f);
  }
  template <class F>
  void apply_outer(const Extended& in, Extended& out, F&& f) const {
    check_extended(in, "HaloPlan::apply_outer");
    check_extended(out, "HaloPlan::apply_outer");
    apply_region(false, in, out.data(), exchange_.layout().window, before(), f);
  }
  template <class M, class S, class F>
  void apply_inner(const Extended& in, ShardedTensor<T, M, S>& out, F&& f) const {
    check_extended(in, "HaloPlan::apply_inner");
    check_tensor(out, "HaloPlan::apply_inner");
    apply_region(true, in, out.data(), layout_.padded, detail::Extents{}, f);
  }
  template <class M, class S, class F>
  void apply_outer(const Extended& in, ShardedTensor<T, M, S>& out, F&& f) const {
    check_extended(in, "HaloPlan::apply_outer");
    check_tensor(out, "HaloPlan::apply_outer");
    apply_region(false, in, out.data(), layout_.padded, detail::Extents{}, f);
  }

  // One stencil step on extended blocks, overlapping the exchange of in's halos with the
  // inner points: start(in), apply_inner, finish(), apply_outer. out's halos are not written.
  template <class F>
  void stencil(Extended& in, Extended& out, F&& f) {
    start(in);
    apply_inner(in, out, f);
    finish();
    apply_outer(in, out, f);
  }
  // The same from a tensor into a tensor of this layout, through an extended block the plan
  // keeps (one copy of the shard per step).
  template <class M, class S, class F>
  void stencil(const ShardedTensor<T, M, S>& in, ShardedTensor<T, M, S>& out, F&& f) {
    start(in, scratch_);
    apply_inner(scratch_, out, f);
    finish();
    apply_outer(scratch_, out, f);
  }

 private:
  detail::Extents before() const {
    detail::Extents b{};
    for (int d = 0; d < Rank; ++d) b[d] = widths_[d].before;
    return b;
  }

  template <class X>
  void check_tensor(const X& x, const char* op) const {
    if (x.mesh().state() != mesh_)
      throw MeshError(std::string("tshard::") + op + ": the tensor " + x.describe() + " lives on mesh " +
                      x.mesh().shape().describe() + ", not on the plan's mesh " + mesh_->shape().describe());
    if (!(x.spec_desc.without_partial() == spec_) || x.extents() != shape_)
      throw ShapeError(std::string("tshard::") + op + ": the tensor " + x.describe() +
                       " differs from the plan's layout " + detail::shape_to_string(shape_, Rank) + " " +
                       spec_.to_string(mesh_->shape()));
  }
  // A rank-local misuse (the caller sized a block wrongly); thrown on this rank only.
  void check_extended(const Extended& e, const char* op) const {
    if (detail::to_extents(std::array<Eigen::Index, Rank>(e.dimensions())) != exchange_.layout().window)
      throw ShapeError(std::string("tshard::") + op + ": the extended block is " + detail::describe_eigen(e) +
                       " on rank " + std::to_string(mesh_->rank()) + ", the plan's is " +
                       detail::shape_to_string(exchange_.layout().window, Rank) + " (widths " +
                       detail::halo_to_string(widths_) + " around " + detail::shape_to_string(shape_, Rank) + " " +
                       spec_.to_string(mesh_->shape()) + ")");
  }

  // Which sides of which dims have halo boxes that arrive in messages. Every halo box lies
  // wholly before, inside or after the interior in each dim, and outside it in at least one;
  // marking one such side per received box (one already marked where possible) makes the
  // inner box below the largest that no received box can reach. Halos filled by start() itself
  // (zeros, wrap onto this rank's own data, replicated dims) do not shrink it.
  void mark_remote_sides() {
    const detail::HaloLayout& h = exchange_.layout();
    std::vector<std::pair<int, bool>> sides;  // (dim, after?) where one received box lies outside
    for (int pass = 0; pass < 2; ++pass)
      for (auto& m : h.recvs)
        for (auto& b : m.boxes) {
          sides.clear();
          for (int d = 0; d < Rank; ++d) {
            if (b.dst[d] + b.extent[d] <= widths_[d].before) sides.push_back({d, false});
            if (b.dst[d] >= widths_[d].before + layout_.valid[d]) sides.push_back({d, true});
          }
          // Pass 0 marks the sides that boxes outside in one dim only force; pass 1 covers the
          // rest (corners), reusing a marked side if there is one.
          if (sides.empty() || (pass == 0 && sides.size() > 1)) continue;
          bool covered = false;
          for (auto [d, after] : sides) covered |= after ? remote_after_[d] : remote_before_[d];
          if (!covered) (sides[0].second ? remote_after_ : remote_before_)[sides[0].first] = true;
        }
  }

  // The inner box (points whose window holds no received element) or its complement in the
  // valid block, the latter as disjoint slabs: slab d is inner in dims < d, outside inner in
  // dim d, whole in dims > d.
  template <class F>
  void apply_region(bool inner, const Extended& in, T* out, const detail::Extents& out_dims,
                    const detail::Extents& out_shift, F& f) const {
    if (empty()) return;
    detail::Extents lo{}, hi{};
    for (int d = 0; d < Rank; ++d) {
      lo[d] = remote_before_[d] ? std::min<detail::Index>(widths_[d].before, layout_.valid[d]) : 0;
      hi[d] = remote_after_[d] ? std::max<detail::Index>(lo[d], layout_.valid[d] - widths_[d].after) : layout_.valid[d];
    }
    const detail::Extents& wdims = exchange_.layout().window;
    const detail::Extents shift = before();
    if (inner) {
      detail::stencil_box<T, Rank>(in.data(), wdims, shift, out, out_dims, out_shift, layout_.offset, lo, hi, f);
      return;
    }
    for (int d = 0; d < Rank; ++d) {
      detail::Extents a{}, b{};
      for (int k = 0; k < Rank; ++k) {
        a[k] = k < d ? lo[k] : 0;
        b[k] = k < d ? hi[k] : layout_.valid[k];
      }
      detail::Extents a1 = a, b1 = b, a2 = a, b2 = b;
      b1[d] = lo[d];
      a2[d] = hi[d];
      detail::stencil_box<T, Rank>(in.data(), wdims, shift, out, out_dims, out_shift, layout_.offset, a1, b1, f);
      detail::stencil_box<T, Rank>(in.data(), wdims, shift, out, out_dims, out_shift, layout_.offset, a2, b2, f);
    }
  }

  std::shared_ptr<detail::MeshState> mesh_;
  detail::SpecDesc spec_;
  detail::Extents shape_{};
  detail::ShardLayout layout_;
  std::array<Halo, Rank> widths_{};
  Boundary boundary_ = Boundary::Zero;
  detail::HaloExchange<T> exchange_;
  std::array<bool, Rank> remote_before_{}, remote_after_{};
  Extended scratch_;
};

// ---- with_halo ----

namespace detail {
template <class T, class M, class S, class P>
auto with_halo_impl(const ShardedTensor<T, M, S, P>& t, const std::array<Halo, S::rank>& widths, Boundary boundary) {
  if constexpr (P::is_partial) {
    return with_halo_impl(implicit_reshard<S>(t, "with_halo"), widths, boundary);
  } else {
    HaloPlan<T, S::rank> plan(HaloWidths{}, t, widths, boundary, "with_halo");
    Eigen::Tensor<T, S::rank> ext(plan.extended_shape());
    plan.start(t, ext);
    plan.finish();
    return ext;
  }
}
}  // namespace detail

// This rank's valid block widened by widths[d] elements on both sides of every dim d, with the
// halos from the ranks that hold them (see the top of this file for the exact semantics).
template <class T, class M, class S, class P, std::size_t N>
Eigen::Tensor<T, S::rank> with_halo(const ShardedTensor<T, M, S, P>& t, const Eigen::Index (&widths)[N],
                                    Boundary boundary) {
  static_assert(N == std::size_t(S::rank), "tshard: with_halo takes one halo width per tensor dim");
  detail::OperatorScope scope("with_halo");
  return detail::with_halo_impl(t, detail::symmetric_halo<S::rank>(widths), boundary);
}
// The same with widths Halo{before, after} per dim.
template <class T, class M, class S, class P, std::size_t N>
Eigen::Tensor<T, S::rank> with_halo(const ShardedTensor<T, M, S, P>& t, const Halo (&widths)[N], Boundary boundary) {
  static_assert(N == std::size_t(S::rank), "tshard: with_halo takes one Halo{before, after} per tensor dim");
  detail::OperatorScope scope("with_halo");
  return detail::with_halo_impl(t, detail::halo_array<S::rank>(widths), boundary);
}

// ---- stencil ----

namespace detail {
template <class T, class M, class S, class P, class F>
ShardedTensor<T, M, S> stencil_impl(const ShardedTensor<T, M, S, P>& x, const std::array<Halo, S::rank>& widths,
                                    Boundary boundary, F& f) {
  if constexpr (P::is_partial) {
    return stencil_impl(implicit_reshard<S>(x, "stencil"), widths, boundary, f);
  } else {
    HaloPlan<T, S::rank> plan(HaloWidths{}, x, widths, boundary, "stencil");
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
template <class T, class M, class S>
ShardedTensor<T, M, S> convolve_plain(const ShardedTensor<T, M, S>& x, const Eigen::Tensor<T, S::rank>& kernel,
                                      const std::array<Halo, S::rank>& widths, Boundary boundary) {
  constexpr int Rank = S::rank;
  HaloPlan<T, Rank> plan(HaloWidths{}, x, widths, boundary, "convolve");
  // Linear offsets of the kernel's taps in the extended block, taps in column-major order.
  const auto ext = plan.extended_shape();
  std::vector<Eigen::Index> taps;
  std::vector<T> weights;
  if (!plan.empty()) {
    taps.reserve(std::size_t(kernel.size()));
    weights.reserve(std::size_t(kernel.size()));
    std::array<Eigen::Index, Rank> j{};
    for (Eigen::Index n = 0; n < kernel.size(); ++n) {
      Eigen::Index lin = 0, stride = 1;
      for (int d = 0; d < Rank; ++d) {
        lin += (j[d] - widths[d].before) * stride;
        stride *= ext[d];
      }
      taps.push_back(lin);
      weights.push_back(kernel.data()[n]);
      for (int d = 0; d < Rank; ++d) {
        if (++j[d] < kernel.dimension(d)) break;
        j[d] = 0;
      }
    }
  }
  auto f = [&](const StencilView<T, Rank>& v) {
    const T* c = v.center();
    T s(0);
    for (std::size_t k = 0; k < taps.size(); ++k) s += weights[k] * c[taps[k]];
    return s;
  };
  ShardedTensor<T, M, S> out(x.mesh(), x.global_shape());
  plan.stencil(x, out, f);
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
// conv2d on input whose channels are whole on every rank (Spec<D0, R, D2, D3>, no partial).
template <class T, class M, class S>
ShardedTensor<T, M, S> conv2d_plain(const ShardedTensor<T, M, S>& x, const Eigen::Tensor<T, 4>& w, Padding padding) {
  using Out = ShardedTensor<T, M, S>;
  const auto shape = x.global_shape();
  const Eigen::Index N = shape[0], C = shape[1], H = shape[2], W = shape[3];
  const Eigen::Index O = w.dimension(0), kh = w.dimension(2), kw = w.dimension(3);
  const Eigen::Index ph = padding == Padding::Same ? (kh - 1) / 2 : 0;
  const Eigen::Index pw = padding == Padding::Same ? (kw - 1) / 2 : 0;
  Out out(x.mesh(), {N, O, H + 2 * ph - kh + 1, W + 2 * pw - kw + 1});
  const ShardLayout& ol = out.layout();
  const MeshShape& mesh = x.mesh().shape();
  // Each rank's window: the input rows and columns its output block reads. The output block
  // sits where the output's own shape puts it, so Valid padding needs no resharding after.
  auto request_of = [&](int r) {
    const ShardLayout l = shard_layout_of_rank(Out::spec_desc, out.extents(), mesh, r);
    WindowRequest q;
    q.empty = l.valid_size() == 0;
    q.lo = {l.offset[0], 0, l.offset[2] - ph, l.offset[3] - pw};
    q.hi = {l.offset[0] + l.valid[0], C, l.offset[2] + l.valid[2] + kh - 1 - ph, l.offset[3] + l.valid[3] + kw - 1 - pw};
    return q;
  };
  HaloExchange<T> exchange(x.mesh().state(),
                           plan_window(Out::spec_desc, x.extents(), mesh, x.mesh().rank(), request_of, Boundary::Zero));
  const Extents wd = exchange.layout().window;
  Scratch<T> window(static_cast<std::size_t>(volume(wd, 4)));
  exchange.start(x.data(), x.layout().padded, Extents{}, window.data());
  // Weights as kw matrices of (C*kh) x O, Wb(c + C*a, o) = w(o, c, a, b), so that the input
  // block x(:, :, i..i+kh-1, j+b), contiguous in column-major order, is one (n x C*kh) matrix.
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  std::vector<Mat> wb(std::size_t(kw), Mat(C * kh, O));
  for (Eigen::Index b = 0; b < kw; ++b)
    for (Eigen::Index a = 0; a < kh; ++a)
      for (Eigen::Index c = 0; c < C; ++c)
        for (Eigen::Index o = 0; o < O; ++o) wb[std::size_t(b)](c + C * a, o) = w(o, c, a, b);
  exchange.finish();
  if (ol.valid_size() == 0) return out;
  const Eigen::Index nv = ol.valid[0], np = ol.padded[0], hp = ol.padded[2];
  for (Eigen::Index j = 0; j < ol.valid[3]; ++j)
    for (Eigen::Index i = 0; i < ol.valid[2]; ++i) {
      Eigen::Map<Mat, 0, Eigen::OuterStride<>> y(out.data() + np * O * (i + hp * j), nv, O, Eigen::OuterStride<>(np));
      y.setZero();
      for (Eigen::Index b = 0; b < kw; ++b) {
        Eigen::Map<const Mat> xb(window.data() + nv * C * (i + wd[2] * (j + b)), nv, C * kh);
        y.noalias() += xb * wb[std::size_t(b)];
      }
    }
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
