// Halos of a sharded tensor: with_halo (a rank's block widened by its neighbours' elements) and
// HaloExchange, the reusable exchange that stencil codes keep (start / finish around interior
// work), with StencilView and the stencil loop that ops/stencil.hpp builds on. The geometry is
// core/halo_geometry.hpp's, the messages comm/halo_transfer.hpp's (GSPMD section 3.3's halo
// exchange; the ghost cells of stencil codes).
//
// Halo semantics: element i of a rank's extended block is the global element
// local_offset[d] + i_d - before_d in every dim d; outside [0, N_d) it is 0 (Boundary::Zero) or
// wraps modulo N_d (Boundary::Periodic). Replicated dims take their halo from the rank's own
// data; corners are included. A rank whose shard is empty gets an empty block.
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tshard/comm/halo_transfer.hpp"
#include "tshard/comm/stats.hpp"
#include "tshard/tensor/tape.hpp"
#include "tshard/core/box_copy.hpp"
#include "tshard/core/box_iterator.hpp"
#include "tshard/core/error.hpp"
#include "tshard/core/halo_geometry.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {

namespace detail {
inline constexpr const char* kHaloInstead =
    "its blocks leave the tape: use ts::convolve, ts::nn::conv2d or pooling, or give a stencil a gradient with "
    "ts::ad::custom_vjp and ts::stencil_backward";

// Tag of HaloExchange's constructor from a std::array of widths.
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
void check_halo_widths(const std::array<Halo, N>& h, const char* op, Text tensor) {
  for (auto& w : h)
    if (w.before < 0 || w.after < 0)
      throw ShapeError(std::string("tshard::") + op + ": halo widths must not be negative: widths " +
                       halo_to_string(h) + " for " + tensor.str());
}

template <class X>
std::string describe_eigen(const X& t) {
  Extents e{};
  for (int d = 0; d < int(X::NumDimensions); ++d) e[d] = t.dimension(d);
  return shape_to_string(e, int(X::NumDimensions));
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
  // The point itself and the strides of the buffer it lies in, for kernels that make offsets
  // linear themselves. That buffer is the shard for points deep inside it and a ghosted frame
  // for points near its faces, so the strides change between points: recompute the offsets
  // when strides() changes (convolve does).
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
  Extents extent{};
  for (int d = 0; d < Rank; ++d) extent[d] = hi[d] - lo[d];
  if (empty_box(extent, Rank)) return;
  const Extents ws = strides_of(window_dims, Rank), os = strides_of(out_dims, Rank);
  std::array<Eigen::Index, Rank> wstrides{};
  for (int d = 0; d < Rank; ++d) wstrides[d] = ws[d];
  for_each_index(extent, 1, Rank, [&](const Extents& i) {
    Index wbase = window_shift[0], obase = out_shift[0];
    for (int d = 1; d < Rank; ++d) {
      wbase += (lo[d] + i[d] + window_shift[d]) * ws[d];
      obase += (lo[d] + i[d] + out_shift[d]) * os[d];
    }
    const T* w = window + wbase;
    T* o = out + obase;
    const Index x0 = lo[0], x1 = hi[0];  // (locals: a store through o cannot change them, so the row vectorizes)
    if constexpr (std::is_invocable_v<F&, const StencilView<T, Rank>&, const std::array<Eigen::Index, Rank>&>) {
      std::array<Eigen::Index, Rank> g{};
      for (int d = 1; d < Rank; ++d) g[d] = offset[d] + lo[d] + i[d];
      for (Index x = x0; x < x1; ++x) {
        g[0] = offset[0] + x;
        o[x] = T(f(StencilView<T, Rank>(w + x, wstrides), g));
      }
    } else {
      for (Index x = x0; x < x1; ++x) o[x] = T(f(StencilView<T, Rank>(w + x, wstrides)));
    }
  });
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
class HaloExchange {
  static_assert(Rank >= 1, "tshard: halos need a tensor of rank 1 or more");

 public:
  using Shape = std::array<Eigen::Index, Rank>;
  using Extended = Eigen::Tensor<T, Rank>;

  // Halos of the same width on both sides of each dim.
  template <class M, class S, class P, std::size_t N>
  HaloExchange(const ShardedTensor<T, M, S, P>& like, const Eigen::Index (&widths)[N], Boundary boundary)
      : HaloExchange(detail::HaloWidths{}, like, detail::symmetric_halo<Rank>(widths), boundary) {
    static_assert(N == std::size_t(Rank), "tshard: give one halo width per tensor dim");
  }
  // Halos of widths Halo{before, after} per dim.
  template <class M, class S, class P, std::size_t N>
  HaloExchange(const ShardedTensor<T, M, S, P>& like, const Halo (&widths)[N], Boundary boundary)
      : HaloExchange(detail::HaloWidths{}, like, detail::halo_array<Rank>(widths), boundary) {
    static_assert(N == std::size_t(Rank), "tshard: give one halo width per tensor dim");
  }
  // Widths from a run-time array (the tag keeps braced lists unambiguous).
  template <class M, class S, class P>
  HaloExchange(detail::HaloWidths, const ShardedTensor<T, M, S, P>& like, const std::array<Halo, Rank>& widths,
               Boundary boundary, const char* op = "HaloExchange")
      : mesh_(detail::state_of(like.mesh())),
        spec_(like.spec_desc.without_partial()),
        shape_(detail::extents_of(like)),
        layout_(detail::layout_of(like)),
        widths_(widths),
        boundary_(boundary) {
    static_assert(S::rank == Rank, "tshard: the plan's rank differs from the tensor's rank");
    detail::check_halo_widths(widths, op, [&] { return like.describe(); });
    detail::Extents before{}, after{};
    for (int d = 0; d < Rank; ++d) {
      before[d] = widths[d].before;
      after[d] = widths[d].after;
    }
    exchange_ = detail::HaloTransfer<T>(
        mesh_, detail::plan_halo(spec_, shape_, mesh_->shape(), mesh_->rank(), before, after, boundary));
    mark_remote_sides();
  }

  HaloExchange(HaloExchange&&) = default;
  HaloExchange& operator=(HaloExchange&&) = default;

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
    check_tensor(x, "HaloExchange::start");
    start_from_shard(x.data(), ext);
  }
  // Starts filling the halos of ext, whose interior already holds the block (no block copy);
  // its zero halos are taken as they are (see above).
  void start(Extended& ext) {
    check_extended(ext, "HaloExchange::start");
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

  // The transpose of the exchange (its adjoint, for gradients): `ext` is a gradient with respect
  // to the extended block; every element of it is added into the element of x it was read from:
  // the interior into this rank's block of dx, each halo into its owner's (wrapping around a
  // Periodic boundary; halos beyond a Zero boundary are dropped). Collective; dx (x's shape and
  // spec) is added into.
  template <class M, class S>
  void add_back(const Extended& ext, ShardedTensor<T, M, S>& dx) {
    check_tensor(dx, "HaloExchange::add_back");
    check_extended(ext, "HaloExchange::add_back");
    exchange_.add_back(ext.data(), dx.data(), detail::layout_of(dx).padded, detail::Extents{});
  }

  // Copies x's shard into the interior of ext and zeroes its halos beyond a Zero boundary; the
  // other halos are left for the next exchange.
  template <class M, class S>
  void load_interior(const ShardedTensor<T, M, S>& x, Extended& ext) const {
    check_tensor(x, "HaloExchange::load_interior");
    check_extended(ext, "HaloExchange::load_interior");
    const detail::Extents zero{};
    detail::copy_box(x.data(), layout_.padded, zero, ext.data(), exchange_.layout().window, before(), layout_.valid,
                     Rank);
    exchange_.fill_zeros(ext.data());
  }
  // Copies the interior of ext into x's shard.
  template <class M, class S>
  void store_interior(const Extended& ext, ShardedTensor<T, M, S>& x) const {
    check_tensor(x, "HaloExchange::store_interior");
    check_extended(ext, "HaloExchange::store_interior");
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
    check_extended(in, "HaloExchange::apply_inner");
    check_extended(out, "HaloExchange::apply_inner");
    apply_region(true, in, out.data(), exchange_.layout().window, before(), f);
  }
  template <class F>
  void apply_outer(const Extended& in, Extended& out, F&& f) const {
    check_extended(in, "HaloExchange::apply_outer");
    check_extended(out, "HaloExchange::apply_outer");
    apply_region(false, in, out.data(), exchange_.layout().window, before(), f);
  }
  template <class M, class S, class F>
  void apply_inner(const Extended& in, ShardedTensor<T, M, S>& out, F&& f) const {
    check_extended(in, "HaloExchange::apply_inner");
    check_tensor(out, "HaloExchange::apply_inner");
    apply_region(true, in, out.data(), layout_.padded, detail::Extents{}, f);
  }
  template <class M, class S, class F>
  void apply_outer(const Extended& in, ShardedTensor<T, M, S>& out, F&& f) const {
    check_extended(in, "HaloExchange::apply_outer");
    check_tensor(out, "HaloExchange::apply_outer");
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
  // The same from a tensor into a tensor of this layout (in may be out: then the whole block is
  // copied into the plan's ghosted buffer first, and every point read from there).
  template <class M, class S, class F>
  void stencil(const ShardedTensor<T, M, S>& in, ShardedTensor<T, M, S>& out, F&& f) {
    check_tensor(in, "HaloExchange::stencil");
    check_tensor(out, "HaloExchange::stencil");
    stencil_shards(in.data(), out.data(), f);
  }

  // The same on the padded shard buffers of two tensors of this layout: the entry for operators
  // that are instantiated per (element type, rank) rather than per spec (convolve). The shard is
  // not copied: the points whose whole window lies in it read it where it is, while the halos
  // travel; only the frame that the other points read (the block's outer before + after layers)
  // goes into a ghosted buffer from the pool, kept by the plan.
  template <class F>
  void stencil_shards(const T* in, T* out, F& f) {
    if (empty()) return;
    const detail::Extents& window = exchange_.layout().window;
    if (!scratch_) {
      scratch_ = detail::pooled_array<T>(std::size_t(detail::volume(window, Rank)));
      exchange_.fill_zeros(scratch_.get());  // (zeros beyond a Zero boundary: written once)
    }
    detail::Extents lo{}, hi{};  // the points whose window lies in the shard (none in place)
    std::pair<detail::Extents, detail::Extents> core{};  // what those alone read, in window coordinates
    const bool in_place = in == out;
    for (int d = 0; d < Rank && !in_place; ++d) {
      const detail::Index b = widths_[d].before, a = widths_[d].after, v = layout_.valid[d];
      lo[d] = std::min(b, v);
      hi[d] = std::max(lo[d], v - a);
      core.first[d] = b + b + a;
      core.second[d] = b + v - a - b;
    }
    exchange_.start(in, layout_.padded, detail::Extents{}, scratch_.get(), false, in_place ? nullptr : &core);
    detail::stencil_box<T, Rank>(in, layout_.padded, detail::Extents{}, out, layout_.padded, detail::Extents{},
                                 layout_.offset, lo, hi, f);
    finish();
    for_each_slab_outside(lo, hi, [&](const detail::Extents& a, const detail::Extents& b) {
      detail::stencil_box<T, Rank>(scratch_.get(), window, before(), out, layout_.padded, detail::Extents{},
                                   layout_.offset, a, b, f);
    });
  }

 private:
  void start_from_shard(const T* shard, Extended& ext) {
    if (detail::to_extents(std::array<Eigen::Index, Rank>(ext.dimensions())) != exchange_.layout().window)
      ext.resize(extended_shape());
    exchange_.start(shard, layout_.padded, detail::Extents{}, ext.data());
  }
  detail::Extents before() const {
    detail::Extents b{};
    for (int d = 0; d < Rank; ++d) b[d] = widths_[d].before;
    return b;
  }

  template <class X>
  void check_tensor(const X& x, const char* op) const {
    detail::refuse_tracked(op, detail::kHaloInstead, x);  // (raw blocks: nothing would reach the tape)
    if (detail::state_of(x.mesh()) != mesh_)
      throw MeshError(std::string("tshard::") + op + ": the tensor " + x.describe() + " lives on mesh " +
                      x.mesh().shape().describe() + ", not on the plan's mesh " + mesh_->shape().describe());
    if (!(x.spec_desc.without_partial() == spec_) || detail::extents_of(x) != shape_)
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
    for_each_slab_outside(lo, hi, [&](const detail::Extents& a, const detail::Extents& b) {
      detail::stencil_box<T, Rank>(in.data(), wdims, shift, out, out_dims, out_shift, layout_.offset, a, b, f);
    });
  }

  // g(lo, hi) for the valid block outside the box [lo, hi), as disjoint slabs: slab d is inside
  // in dims < d, outside in dim d, whole in dims > d.
  template <class G>
  void for_each_slab_outside(const detail::Extents& lo, const detail::Extents& hi, G&& g) const {
    for (int d = 0; d < Rank; ++d) {
      detail::Extents a{}, b{};
      for (int k = 0; k < Rank; ++k) {
        a[k] = k < d ? lo[k] : 0;
        b[k] = k < d ? hi[k] : layout_.valid[k];
      }
      detail::Extents a1 = a, b1 = b, a2 = a, b2 = b;
      b1[d] = lo[d];
      a2[d] = hi[d];
      g(a1, b1);
      g(a2, b2);
    }
  }

  std::shared_ptr<detail::MeshState> mesh_;
  detail::SpecDesc spec_;
  detail::Extents shape_{};
  detail::ShardLayout layout_;
  std::array<Halo, Rank> widths_{};
  Boundary boundary_ = Boundary::Zero;
  detail::HaloTransfer<T> exchange_;
  std::array<bool, Rank> remote_before_{}, remote_after_{};
  std::shared_ptr<T> scratch_;  // stencil_shards' ghosted frame, from the pool
};

// ---- with_halo ----

namespace detail {
template <class T, class M, class S, class P>
auto with_halo_impl(const ShardedTensor<T, M, S, P>& t, const std::array<Halo, S::rank>& widths, Boundary boundary) {
  if constexpr (P::is_partial) {
    return with_halo_impl(implicit_reshard<S>(t, "with_halo"), widths, boundary);
  } else {
    HaloExchange<T, S::rank> plan(HaloWidths{}, t, widths, boundary, "with_halo");
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
  detail::refuse_tracked("with_halo", detail::kHaloInstead, t);
  return detail::with_halo_impl(t, detail::symmetric_halo<S::rank>(widths), boundary);
}
// The same with widths Halo{before, after} per dim.
template <class T, class M, class S, class P, std::size_t N>
Eigen::Tensor<T, S::rank> with_halo(const ShardedTensor<T, M, S, P>& t, const Halo (&widths)[N], Boundary boundary) {
  static_assert(N == std::size_t(S::rank), "tshard: with_halo takes one Halo{before, after} per tensor dim");
  detail::OperatorScope scope("with_halo");
  detail::refuse_tracked("with_halo", detail::kHaloInstead, t);
  return detail::with_halo_impl(t, detail::halo_array<S::rank>(widths), boundary);
}

// ---- the transpose of with_halo ----

namespace detail {
template <class T, class M, class S, class P>
ShardedTensor<T, M, S> with_halo_transpose_impl(const ShardedTensor<T, M, S, P>& like, const Eigen::Tensor<T, S::rank>& ext,
                                                const std::array<Halo, S::rank>& widths, Boundary boundary) {
  ShardedTensor<T, M, S> dx(like.mesh(), like.global_shape());
  std::fill(dx.data(), dx.data() + dx.padded_size(), T(0));
  HaloExchange<T, S::rank> plan(HaloWidths{}, dx, widths, boundary, "with_halo_transpose");
  plan.add_back(ext, dx);
  return dx;
}
}  // namespace detail

// The transpose (adjoint) of with_halo, for gradients: given on every rank a block `ext` of
// with_halo(x, widths, boundary)'s shape (a gradient with respect to it), the tensor of x's
// shape and spec whose every element is the sum of the elements of every rank's `ext` that
// with_halo read from it: its owner's interior plus the halos other ranks hold of it (around a
// Periodic boundary too; halos beyond a Zero boundary are dropped). Replicas of a replicated dim
// each add their own blocks. Collective over x's mesh; x gives the shape, spec and mesh only.
template <class T, class M, class S, class P, std::size_t N>
ShardedTensor<T, M, S> with_halo_transpose(const ShardedTensor<T, M, S, P>& like, const Eigen::Tensor<T, S::rank>& ext,
                                           const Eigen::Index (&widths)[N], Boundary boundary) {
  static_assert(N == std::size_t(S::rank), "tshard: with_halo_transpose takes one halo width per tensor dim");
  detail::OperatorScope scope("with_halo_transpose");
  return detail::with_halo_transpose_impl(like, ext, detail::symmetric_halo<S::rank>(widths), boundary);
}
template <class T, class M, class S, class P, std::size_t N>
ShardedTensor<T, M, S> with_halo_transpose(const ShardedTensor<T, M, S, P>& like, const Eigen::Tensor<T, S::rank>& ext,
                                           const Halo (&widths)[N], Boundary boundary) {
  static_assert(N == std::size_t(S::rank), "tshard: with_halo_transpose takes one Halo{before, after} per tensor dim");
  detail::OperatorScope scope("with_halo_transpose");
  return detail::with_halo_transpose_impl(like, ext, detail::halo_array<S::rank>(widths), boundary);
}

}  // namespace tshard
