// Fused blockwise attention (FlashAttention-2's algorithm, Dao 2023) on the layout of the Llama's
// grouped-query attention: queries [B, T, Dh, G, KV] (the G query heads of a group share
// key-value head v; [B, T, Dh, H] is plain multi-head attention), keys and values [B, S, Dh, KV].
// softmax(q k^T * scale + mask) v is computed block by block with a running maximum and sum, so
// no T x S tensor exists at any point: memory is O(T * Dh) per head, and the keys and values are
// read in place by every query head of their group (no copies per query head). The backward
// recomputes each block's probabilities from the saved log-sum-exp (a custom VJP). Blocks the
// mask removes entirely are skipped. Batch and key-value heads split over any mesh axes: each
// rank attends its own heads and nothing moves. A sequence (or head dim) split over an axis, as
// context parallelism lays activations out, is resharded so that the sequence is whole and the
// key-value heads are split over that axis too, and the output back (DeepSpeed Ulysses'
// all-to-alls, by annotation; with fewer heads than ranks some ranks idle, never an error).
//
//   auto o = ts::nn::scaled_dot_product_attention(q, k, v);                    // causal
//   auto e = ts::nn::scaled_dot_product_attention(q, k, v, {.causal = false}); // a ViT's, BERT's
//   auto w = ts::nn::scaled_dot_product_attention(q, k, v, {.window = 256});   // sliding window
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include <Eigen/Core>

#include "tshard/ad/custom_vjp.hpp"
#include "tshard/core/spec_algebra.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {

// Which keys a query sees, and the scale of the scores. causal: the keys at or before its own
// position; with fewer queries than keys (S > T, a KV cache's decoding step) the queries are the
// last T positions (flash-attention's bottom-right alignment). window W > 0: only the W nearest
// (causal: p - W < s <= p for a query at position p; bidirectional: |t - s| < W), as Mistral's
// sliding window. scale 0 means 1 / sqrt(Dh).
struct AttentionOptions {
  bool causal = true;
  Eigen::Index window = 0;
  double scale = 0;
};

namespace detail {

using tshard::detail::Index;

// The mask as geometry: what a query row sees, and which blocks need no element mask.
struct AttentionGeometry {
  Index T = 0, S = 0;
  bool causal = true;
  Index window = 0;
  Index offset = 0;  // query row t is at position t + offset (causal: S - T)

  bool visible(Index t, Index s) const {
    const Index p = t + offset;
    if (causal && s > p) return false;
    if (window > 0 && (p - s >= window || (!causal && s - p >= window))) return false;
    return true;
  }
  // The keys [lo, hi) that any of the query rows [t0, t1) sees: blocks outside are skipped.
  std::pair<Index, Index> keys(Index t0, Index t1) const {
    Index lo = 0, hi = S;
    if (causal) hi = std::min(S, t1 + offset);
    if (window > 0) {
      lo = std::max<Index>(0, t0 + offset - window + 1);
      if (!causal) hi = std::min(S, t1 + offset - 1 + window);
    }
    return {lo, std::max(lo, hi)};
  }
  // Whether every (t, s) of the block [t0, t1) x [s0, s1) is visible.
  bool all_visible(Index t0, Index t1, Index s0, Index s1) const {
    const Index p0 = t0 + offset, p1 = t1 + offset;
    if (causal && s1 - 1 > p0) return false;
    if (window > 0 && ((p1 - 1) - s0 >= window || (!causal && (s1 - 1) - p0 >= window))) return false;
    return true;
  }
};

// Offsets of element (b, t, d, g, h) in a local block [pB, T, D, pG, pH] (column-major); keys,
// values and the log-sum-exp have no d or no g (extent 1).
struct HeadLayout {
  Index pB = 1, T = 1, D = 1, pG = 1;
  Index at(Index b, Index t, Index d, Index g, Index h) const { return b + pB * (t + T * (d + D * (g + pG * h))); }
};

template <class A>
using RowMatrix = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class A>
using Column = Eigen::Matrix<A, Eigen::Dynamic, 1>;

// Query blocks of 64 rows against key blocks of 128: a block's scores stay in cache.
inline constexpr Index kQueryBlock = 64, kKeyBlock = 128;

// The (g, t) rows of head h of batch row b as a matrix [G * T, D] (row g * T + t), in A.
template <class T, class A>
void pack_head(const T* x, const HeadLayout& l, Index b, Index h, Index G, RowMatrix<A>& out) {
  out.resize(G * l.T, l.D);
  for (Index g = 0; g < G; ++g)
    for (Index d = 0; d < l.D; ++d)
      for (Index t = 0; t < l.T; ++t) out(g * l.T + t, d) = A(x[l.at(b, t, d, g, h)]);
}
template <class T, class A>
void unpack_head(const RowMatrix<A>& in, const HeadLayout& l, Index b, Index h, Index G, T* x) {
  for (Index g = 0; g < G; ++g)
    for (Index d = 0; d < l.D; ++d)
      for (Index t = 0; t < l.T; ++t) x[l.at(b, t, d, g, h)] = T(in(g * l.T + t, d));
}

// scores := q_i k_j^T * scale on the block, with -inf where the mask hides a key.
template <class A, class Block>
void block_scores(Block&& s, const RowMatrix<A>& q, const RowMatrix<A>& k, Index r0, Index t0, Index s0,
                  const AttentionGeometry& geo, A scale) {
  const Index br = s.rows(), bc = s.cols();
  s.noalias() = q.middleRows(r0, br) * k.middleRows(s0, bc).transpose();
  s *= scale;
  if (geo.all_visible(t0, t0 + br, s0, s0 + bc)) return;
  for (Index i = 0; i < br; ++i)
    for (Index j = 0; j < bc; ++j)
      if (!geo.visible(t0 + i, s0 + j)) s(i, j) = -std::numeric_limits<A>::infinity();
}

// One head's forward: o [G * T, D] and the log-sum-exp of every row (its softmax's normaliser).
template <class A>
void attention_forward_head(const RowMatrix<A>& q, const RowMatrix<A>& k, const RowMatrix<A>& v, Index G,
                            const AttentionGeometry& geo, A scale, RowMatrix<A>& o, Column<A>& lse) {
  const A inf = std::numeric_limits<A>::infinity();
  o.setZero(G * geo.T, q.cols());
  lse.resize(G * geo.T);
  RowMatrix<A> scores(kQueryBlock, kKeyBlock);
  Column<A> m(kQueryBlock), l(kQueryBlock);
  for (Index g = 0; g < G; ++g)
    for (Index t0 = 0; t0 < geo.T; t0 += kQueryBlock) {
      const Index br = std::min(kQueryBlock, geo.T - t0), r0 = g * geo.T + t0;
      m.head(br).setConstant(-inf);
      l.head(br).setZero();
      auto oi = o.middleRows(r0, br);
      const auto [lo, hi] = geo.keys(t0, t0 + br);
      for (Index s0 = lo; s0 < hi; s0 += kKeyBlock) {
        const Index bc = std::min(kKeyBlock, hi - s0);
        auto p = scores.topLeftCorner(br, bc);
        block_scores<A>(p, q, k, r0, t0, s0, geo, scale);
        for (Index i = 0; i < br; ++i) {
          const A top = std::max(m(i), p.row(i).maxCoeff());
          if (top == -inf) {  // nothing visible yet on this row
            p.row(i).setZero();
            continue;
          }
          const A rescale = std::exp(m(i) - top);  // (0 on a row's first visible block)
          p.row(i) = (p.row(i).array() - top).exp();
          l(i) = rescale * l(i) + p.row(i).sum();
          oi.row(i) *= rescale;
          m(i) = top;
        }
        oi.noalias() += p * v.middleRows(s0, bc);
      }
      for (Index i = 0; i < br; ++i) {
        if (l(i) > A(0)) oi.row(i) /= l(i);
        lse(r0 + i) = l(i) > A(0) ? m(i) + std::log(l(i)) : -inf;  // (a row that sees no key: zeros)
      }
    }
}

// One head's backward (FlashAttention-2's): each block's probabilities again from the
// log-sum-exp, then dv += p^T do, ds = p (do v^T - rowsum(do o)), dq += ds k, dk += ds^T q.
template <class A>
void attention_backward_head(const RowMatrix<A>& q, const RowMatrix<A>& k, const RowMatrix<A>& v,
                             const RowMatrix<A>& o, const RowMatrix<A>& dout, const Column<A>& lse, Index G,
                             const AttentionGeometry& geo, A scale, RowMatrix<A>& dq, RowMatrix<A>& dk,
                             RowMatrix<A>& dv) {
  const A inf = std::numeric_limits<A>::infinity();
  const Column<A> rowdot = (dout.array() * o.array()).rowwise().sum();
  dq.setZero(q.rows(), q.cols());
  dk.setZero(k.rows(), k.cols());
  dv.setZero(v.rows(), v.cols());
  RowMatrix<A> pb(kQueryBlock, kKeyBlock), dsb(kQueryBlock, kKeyBlock);
  for (Index g = 0; g < G; ++g)
    for (Index t0 = 0; t0 < geo.T; t0 += kQueryBlock) {
      const Index br = std::min(kQueryBlock, geo.T - t0), r0 = g * geo.T + t0;
      const auto [lo, hi] = geo.keys(t0, t0 + br);
      for (Index s0 = lo; s0 < hi; s0 += kKeyBlock) {
        const Index bc = std::min(kKeyBlock, hi - s0);
        auto p = pb.topLeftCorner(br, bc);
        auto ds = dsb.topLeftCorner(br, bc);
        block_scores<A>(p, q, k, r0, t0, s0, geo, scale);
        for (Index i = 0; i < br; ++i) {
          if (lse(r0 + i) == -inf) p.row(i).setZero();
          else p.row(i) = (p.row(i).array() - lse(r0 + i)).exp();
        }
        dv.middleRows(s0, bc).noalias() += p.transpose() * dout.middleRows(r0, br);
        ds.noalias() = dout.middleRows(r0, br) * v.middleRows(s0, bc).transpose();
        for (Index i = 0; i < br; ++i) ds.row(i) = p.row(i).array() * (ds.row(i).array() - rowdot(r0 + i));
        dq.middleRows(r0, br).noalias() += scale * (ds * k.middleRows(s0, bc));
        dk.middleRows(s0, bc).noalias() += scale * (ds.transpose() * q.middleRows(r0, br));
      }
    }
}

// What the types say, checked where the user calls: one sentence each.
template <class Q, class K, class V>
constexpr bool attention_types_checked() {
  static_assert(Q::rank == 4 || Q::rank == 5,
                "tshard: scaled_dot_product_attention takes queries [B, T, Dh, H], or [B, T, Dh, G, KV] with G query "
                "heads per key-value head");
  static_assert(K::rank == 4 && V::rank == 4, "tshard: scaled_dot_product_attention takes keys and values [B, S, Dh, KV]");
  static_assert(std::is_same_v<typename Q::Scalar, typename K::Scalar> && std::is_same_v<typename Q::Scalar, typename V::Scalar>,
                "tshard: scaled_dot_product_attention's queries, keys and values have one element type");
  static_assert(std::is_same_v<typename Q::MeshT, typename K::MeshT> && std::is_same_v<typename Q::MeshT, typename V::MeshT>,
                "tshard: scaled_dot_product_attention's queries, keys and values live on one mesh");
  static_assert(!Q::is_partial && !K::is_partial && !V::is_partial,
                "tshard: scaled_dot_product_attention takes resolved tensors: reshard a partial sum first");
  return true;
}

// The layout the kernel computes in: the queries' batch split, the sequence, head and group dims
// whole, and the key-value heads split over the queries' head axes and then over the axes their
// sequence, head and group dims were split over (Ulysses: sequence-split in, head-split here).
template <class L>
struct split_over;
template <>
struct split_over<tshard::detail::AxisList<>> {
  using type = R;
};
template <FixedString... A>
struct split_over<tshard::detail::AxisList<A...>> {
  using type = S<A...>;
};
template <class QS, int Rank = QS::rank>
struct attention_layout {
  template <int D>
  using axes = typename tshard::detail::dim_axes<tshard::detail::dim_at_t<QS, D>>::type;
  using Heads = typename split_over<typename tshard::detail::concat_axes<
      axes<Rank - 1>, axes<1>, axes<2>, std::conditional_t<Rank == 5, axes<3>, tshard::detail::AxisList<>>>::type>::type;
  using Batch = tshard::detail::dim_at_t<QS, 0>;
  using Queries = std::conditional_t<Rank == 5, Spec<Batch, R, R, R, Heads>, Spec<Batch, R, R, Heads>>;
  using Keys = Spec<Batch, R, R, Heads>;
};
// Whether q, k, v are in that layout already (the kernel's own requirement).
template <class Q, class K, class V>
inline constexpr bool attention_aligned_v =
    std::is_same_v<typename Q::SpecType, typename attention_layout<typename Q::SpecType>::Queries> &&
    std::is_same_v<typename K::SpecType, typename attention_layout<typename Q::SpecType>::Keys> &&
    std::is_same_v<typename V::SpecType, typename attention_layout<typename Q::SpecType>::Keys>;

// The run-time checks (every rank alike: the shapes are global), and the geometry.
template <class Q, class K, class V>
AttentionGeometry attention_geometry(const Q& q, const K& k, const V& v, const AttentionOptions& o, const char* op) {
  tshard::detail::require_same_mesh(q, k, op);
  tshard::detail::require_same_mesh(q, v, op);
  const auto qs = tshard::detail::extents_of(q), ks = tshard::detail::extents_of(k), vs = tshard::detail::extents_of(v);
  const std::string shapes = std::string(op) + ": queries " + q.describe() + ", keys " + k.describe() + ", values " + v.describe();
  if (ks != vs || qs[0] != ks[0] || qs[2] != ks[2] || qs[Q::rank - 1] != ks[3])
    throw ShapeError("tshard::nn::" + shapes + ": keys and values are [B, S, Dh, KV] with the queries' B, Dh and KV");
  if (o.causal && qs[1] > ks[1])
    throw ShapeError("tshard::nn::" + shapes + ": causal attention needs at least as many keys as queries (the queries "
                     "are the last positions); pass {.causal = false} for cross-attention");
  if (o.window < 0 || o.window > std::max(qs[1], ks[1]))
    throw SpecError("tshard::nn::" + std::string(op) + ": a window of " + std::to_string(o.window) +
                    " keys for a sequence of " + std::to_string(qs[1]) + " (0 for none, else at most the sequence length)");
  if (!(o.scale >= 0) || !std::isfinite(o.scale))
    throw SpecError("tshard::nn::" + std::string(op) + ": the scale must be finite and positive (0 for 1 / sqrt(Dh))");
  return AttentionGeometry{qs[1], ks[1], o.causal, o.window, o.causal ? ks[1] - qs[1] : 0};
}

// The log-sum-exp's spec: the queries' without the head dim ([B, T, G, KV] or [B, T, H]).
template <class Q>
using LseSpec = typename tshard::detail::drop_dims<typename Q::SpecType, 2>::type;

// What the forward and the backward share: the local layouts of the queries, keys and values and
// of the log-sum-exp, the group size, this rank's batch rows and key-value heads, and the scale.
template <class A>
struct AttentionLocal {
  HeadLayout q, k, lse;
  Index G = 1, rows = 0, heads = 0;
  A scale = A(1);
};
template <class A, class Q, class K>
AttentionLocal<A> attention_local(const Q& q, const K& k, const AttentionOptions& o) {
  const auto& lq = tshard::detail::layout_of(q);
  const auto& lk = tshard::detail::layout_of(k);
  const auto qs = tshard::detail::extents_of(q);
  AttentionLocal<A> a;
  a.q = HeadLayout{lq.padded[0], lq.padded[1], lq.padded[2], Q::rank == 5 ? lq.padded[3] : 1};
  a.k = HeadLayout{lk.padded[0], lk.padded[1], lk.padded[2], 1};
  a.lse = HeadLayout{a.q.pB, a.q.T, 1, a.q.pG};
  a.G = Q::rank == 5 ? qs[3] : 1;
  a.rows = lq.valid[0];
  a.heads = lq.valid[Q::rank - 1];
  a.scale = o.scale > 0 ? A(o.scale) : A(1) / std::sqrt(A(std::max<Index>(qs[2], 1)));
  return a;
}

}  // namespace detail

// Attention's output [B, T, Dh, (G,) KV], laid out as q, and the log-sum-exp of each query row's
// scores [B, T, (G,) KV] (in float for bfloat16), without a gradient: the pieces
// scaled_dot_product_attention differentiates, for a user's own custom VJP.
template <tshard::detail::FloatingTensor Q, tshard::detail::FloatingTensor K, tshard::detail::FloatingTensor V>
auto scaled_dot_product_attention_forward(const Q& q, const K& k, const V& v, const AttentionOptions& options = {}) {
  static_assert(detail::attention_types_checked<Q, K, V>());
  static_assert(detail::attention_aligned_v<Q, K, V>,
                "tshard: scaled_dot_product_attention_forward computes in place: the sequence, head and group dims whole, "
                "keys and values split as the queries' batch and heads (scaled_dot_product_attention reshards any layout)");
  using T = typename Q::Scalar;
  using A = accumulator_t<T>;
  using Index = tshard::detail::Index;
  using Lse = ShardedTensor<A, typename Q::MeshT, detail::LseSpec<Q>>;
  tshard::detail::OperatorScope scope("attention");
  tshard::detail::refuse_tracked("nn::scaled_dot_product_attention_forward",
                                 "ts::nn::scaled_dot_product_attention is the one to differentiate", q, k, v);
  const auto geo = detail::attention_geometry(q, k, v, options, "scaled_dot_product_attention");
  const auto at = detail::attention_local<A>(q, k, options);
  const auto qs = tshard::detail::extents_of(q);
  typename Lse::Shape lse_shape{};
  for (int d = 0, j = 0; d < Q::rank; ++d)
    if (d != 2) lse_shape[std::size_t(j++)] = qs[d];
  auto out = zeros_like(q);
  Lse lse(q.mesh(), lse_shape);
  std::fill(lse.data(), lse.data() + lse.padded_size(), A(0));
  detail::RowMatrix<A> qh, kh, vh, oh;
  detail::Column<A> lh;
  for (Index h = 0; h < at.heads; ++h)
    for (Index b = 0; b < at.rows; ++b) {
      detail::pack_head(q.data(), at.q, b, h, at.G, qh);
      detail::pack_head(k.data(), at.k, b, h, 1, kh);
      detail::pack_head(v.data(), at.k, b, h, 1, vh);
      detail::attention_forward_head<A>(qh, kh, vh, at.G, geo, at.scale, oh, lh);
      detail::unpack_head(oh, at.q, b, h, at.G, out.data());
      for (Index g = 0; g < at.G; ++g)
        for (Index t = 0; t < geo.T; ++t) lse.data()[at.lse.at(b, t, 0, g, h)] = lh(g * geo.T + t);
    }
  return std::pair{std::move(out), std::move(lse)};
}

// dq, dk, dv of attention given q, k, v, the forward's output and log-sum-exp, and dL/doutput
// (any layout: resolved into q's). No gradient of it is taken.
template <tshard::detail::FloatingTensor Q, tshard::detail::FloatingTensor K, tshard::detail::FloatingTensor V,
          tshard::detail::FloatingTensor O, tshard::detail::FloatingTensor L, tshard::detail::FloatingTensor DO>
auto scaled_dot_product_attention_backward(const Q& q, const K& k, const V& v, const O& out, const L& lse,
                                           const DO& dout, const AttentionOptions& options = {}) {
  static_assert(detail::attention_types_checked<Q, K, V>());
  static_assert(detail::attention_aligned_v<Q, K, V>,
                "tshard: scaled_dot_product_attention_backward computes in place: the sequence, head and group dims whole, "
                "keys and values split as the queries' batch and heads (scaled_dot_product_attention reshards any layout)");
  static_assert(std::is_same_v<O, ShardedTensor<typename Q::Scalar, typename Q::MeshT, typename Q::SpecType>>,
                "tshard: scaled_dot_product_attention_backward takes the output scaled_dot_product_attention_forward gave");
  static_assert(std::is_same_v<typename L::SpecType, detail::LseSpec<Q>> && !L::is_partial,
                "tshard: scaled_dot_product_attention_backward takes the log-sum-exp scaled_dot_product_attention_forward gave");
  if constexpr (!std::is_same_v<DO, O>) {  // (a cotangent of another layout: resolved into q's first)
    return scaled_dot_product_attention_backward(
        q, k, v, out, lse, tshard::detail::implicit_reshard<typename Q::SpecType>(dout, "scaled_dot_product_attention_backward"),
        options);
  } else {
    using T = typename Q::Scalar;
    using A = accumulator_t<T>;
    using Index = tshard::detail::Index;
    tshard::detail::OperatorScope scope("attention_backward");
    tshard::detail::refuse_tracked("nn::scaled_dot_product_attention_backward", tshard::detail::kNoSecondOrder, q, k, v, out,
                                   dout);
    const auto geo = detail::attention_geometry(q, k, v, options, "scaled_dot_product_attention_backward");
    if (tshard::detail::extents_of(dout) != tshard::detail::extents_of(q) ||
        tshard::detail::extents_of(out) != tshard::detail::extents_of(q))
      throw ShapeError("tshard::nn::scaled_dot_product_attention_backward: the output " + out.describe() + " and its gradient " +
                       dout.describe() + " are not shaped as the queries " + q.describe());
    const auto at = detail::attention_local<A>(q, k, options);
    auto dq = zeros_like(q);
    auto dk = zeros_like(k);
    auto dv = zeros_like(v);
    detail::RowMatrix<A> qh, kh, vh, oh, doh, dqh, dkh, dvh;
    detail::Column<A> lh(at.G * geo.T);
    for (Index h = 0; h < at.heads; ++h)
      for (Index b = 0; b < at.rows; ++b) {
        detail::pack_head(q.data(), at.q, b, h, at.G, qh);
        detail::pack_head(k.data(), at.k, b, h, 1, kh);
        detail::pack_head(v.data(), at.k, b, h, 1, vh);
        detail::pack_head(out.data(), at.q, b, h, at.G, oh);
        detail::pack_head(dout.data(), at.q, b, h, at.G, doh);
        for (Index g = 0; g < at.G; ++g)
          for (Index t = 0; t < geo.T; ++t) lh(g * geo.T + t) = A(lse.data()[at.lse.at(b, t, 0, g, h)]);
        detail::attention_backward_head<A>(qh, kh, vh, oh, doh, lh, at.G, geo, at.scale, dqh, dkh, dvh);
        detail::unpack_head(dqh, at.q, b, h, at.G, dq.data());
        detail::unpack_head(dkh, at.k, b, h, 1, dk.data());
        detail::unpack_head(dvh, at.k, b, h, 1, dv.data());
      }
    return std::tuple{std::move(dq), std::move(dk), std::move(dv)};
  }
}

// softmax(q k^T * scale + mask) v for queries [B, T, Dh, G, KV] (or [B, T, Dh, H]) and keys and
// values [B, S, Dh, KV]: the output, laid out as q. Under ts::ad, one node whose rule is the
// fused backward; it keeps the output and the log-sum-exp (O(T) per head), never the scores.
template <tshard::detail::FloatingTensor Q, tshard::detail::FloatingTensor K, tshard::detail::FloatingTensor V>
auto scaled_dot_product_attention(const Q& q, const K& k, const V& v, const AttentionOptions& options = {}) {
  static_assert(detail::attention_types_checked<Q, K, V>());
  if constexpr (!detail::attention_aligned_v<Q, K, V>) {  // a sequence split (or another): resharded, and back
    using Layout = detail::attention_layout<typename Q::SpecType>;
    return reshard<typename Q::SpecType>(scaled_dot_product_attention(
        reshard<typename Layout::Queries>(q), reshard<typename Layout::Keys>(k), reshard<typename Layout::Keys>(v), options));
  } else {
    using Lse = ShardedTensor<accumulator_t<typename Q::Scalar>, typename Q::MeshT, detail::LseSpec<Q>>;
    auto saved = std::make_shared<std::optional<Lse>>();
    return ad::custom_vjp(
        [saved, options](const auto& qv, const auto& kv, const auto& vv) {
          auto [out, lse] = scaled_dot_product_attention_forward(qv, kv, vv, options);
          *saved = std::move(lse);
          return out;
        },
        [saved, options](const auto& dout, const auto& out, const auto& qv, const auto& kv, const auto& vv) {
          if (!*saved)
            throw SpecError("tshard::nn::scaled_dot_product_attention: its backward ran twice for one forward");
          auto grads = scaled_dot_product_attention_backward(qv, kv, vv, out, **saved, dout, options);
          saved->reset();
          return grads;
        },
        q, k, v);
  }
}

}  // namespace tshard::nn
