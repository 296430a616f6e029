// Fused blockwise attention (FlashAttention-2's algorithm, Dao 2023) on the layout of the Llama's
// grouped-query attention: queries [B, T, Dh, G, KV] (the G query heads of a group share
// key-value head v; [B, T, Dh, H] is plain multi-head attention), keys and values [B, S, Dh, KV].
// softmax(q k^T * scale + mask) v is computed block by block with a running maximum and sum, so
// no T x S tensor exists at any point: memory is O(T * Dh) per head, and the keys and values are
// read in place by every query head of their group (no copies per query head). The backward
// recomputes each block's probabilities from the saved log-sum-exp (a custom VJP). Blocks the
// mask removes entirely are skipped. Batch and key-value heads split over any mesh axes: each
// rank attends its own heads and nothing moves. A sequence split over axes, as context
// parallelism lays activations out, is attended by ring attention (nn/functional/
// ring_attention.hpp: keys and values passed around the ring of those axes) or resharded so that
// the sequence is whole and the key-value heads are split over those axes too, and the output
// back (DeepSpeed Ulysses' all-to-alls, by annotation): AttentionOptions::context chooses. A
// split head dim takes the all-to-all.
//
//   auto o = ts::nn::scaled_dot_product_attention(q, k, v);                    // causal
//   auto e = ts::nn::scaled_dot_product_attention(q, k, v, {.causal = false}); // a ViT's, BERT's
//   auto w = ts::nn::scaled_dot_product_attention(q, k, v, {.window = 256});   // sliding window
//   auto p = ts::nn::scaled_dot_product_attention(q, k, v, {.document_starts = {{0, 700}, {0, 90, 512}}});  // packed
//   auto d = ts::nn::scaled_dot_product_attention(q, k, v, {.dropout = {.p = 0.1, .seed = step}});  // dropout
#pragma once
#include <algorithm>
#include <charconv>
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
#include "tshard/nn/functional/attention_blocks.hpp"
#include "tshard/nn/functional/ring_attention.hpp"
#include "tshard/ops/elementwise/operands.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {

namespace detail {

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
// Ring attention's layout: the sequence split kept (over the axes the queries' sequence is split
// over), the head and group dims whole (their axes moved onto the key-value heads).
template <class QS, int Rank = QS::rank>
struct ring_layout {
  template <int D>
  using axes = typename tshard::detail::dim_axes<tshard::detail::dim_at_t<QS, D>>::type;
  using Heads = typename split_over<typename tshard::detail::concat_axes<
      axes<Rank - 1>, axes<2>, std::conditional_t<Rank == 5, axes<3>, tshard::detail::AxisList<>>>::type>::type;
  using Batch = tshard::detail::dim_at_t<QS, 0>;
  using Sequence = tshard::detail::dim_at_t<QS, 1>;
  using Queries = std::conditional_t<Rank == 5, Spec<Batch, Sequence, R, R, Heads>, Spec<Batch, Sequence, R, Heads>>;
  using Keys = Spec<Batch, Sequence, R, Heads>;
  static constexpr bool sequence_split = !std::is_same_v<Sequence, R>;
};

// Whether q, k, v are in that layout already (the kernel's own requirement).
template <class Q, class K, class V>
inline constexpr bool attention_aligned_v =
    std::is_same_v<typename Q::SpecType, typename attention_layout<typename Q::SpecType>::Queries> &&
    std::is_same_v<typename K::SpecType, typename attention_layout<typename Q::SpecType>::Keys> &&
    std::is_same_v<typename V::SpecType, typename attention_layout<typename Q::SpecType>::Keys>;

// A number in a message: the shortest text that reads back (-2, 0.25, 1.0000001; not -2.000000).
inline std::string shortest_number(double x) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, x).ptr);
}

// The run-time checks (every rank alike: the shapes are global), and the geometry.
template <class Q, class K, class V>
AttentionGeometry attention_geometry(const Q& q, const K& k, const V& v, const AttentionOptions& o, const char* op) {
  tshard::detail::require_same_mesh(q, k, op);
  tshard::detail::require_same_mesh(q, v, op);
  const auto qs = tshard::detail::extents_of(q), ks = tshard::detail::extents_of(k), vs = tshard::detail::extents_of(v);
  const std::string where = "tshard::nn::" + std::string(op) + ": ";
  const std::string shapes = "queries " + q.describe() + ", keys " + k.describe() + ", values " + v.describe();
  const auto dims = [](const auto& e, int rank) { return tshard::detail::shape_to_string(e, rank); };
  if (ks != vs)
    throw ShapeError(where + "keys " + dims(ks, 4) + " and values " + dims(vs, 4) + " differ (" + shapes + ")");
  if (qs[0] != ks[0] || qs[2] != ks[2])
    throw ShapeError(where + "the queries' " + (qs[0] != ks[0] ? "batch " : "head dim ") +
                     std::to_string(qs[0] != ks[0] ? qs[0] : qs[2]) + " differs from the keys' " +
                     std::to_string(qs[0] != ks[0] ? ks[0] : ks[2]) + " (" + shapes +
                     "; queries [B, T, Dh, H] or [B, T, Dh, G, KV], keys and values [B, S, Dh, KV])");
  if (qs[Q::rank - 1] != ks[3]) {
    std::string hint;
    if (Q::rank == 4 && ks[3] > 0 && qs[3] % ks[3] == 0)
      hint = "; for grouped-query attention pass the queries as [B, T, Dh, G, KV], G = H / KV query heads per "
             "key-value head: ts::reshape<Spec>(q, {B, T, Dh, " + std::to_string(qs[3] / ks[3]) + ", " +
             std::to_string(ks[3]) + "}) puts query head h on key-value head h / G, as PyTorch's enable_gqa does";
    throw ShapeError(where + "the queries have " + std::to_string(qs[Q::rank - 1]) +
                     (Q::rank == 4 ? " heads, the keys " : " key-value heads, the keys ") +
                     std::to_string(ks[3]) + " (" + shapes + ")" + hint);
  }
  if (o.causal && qs[1] > ks[1] && o.key_document_starts.empty())
    throw ShapeError(where + shapes + ": causal attention needs at least as many keys as queries (the queries "
                     "are the last positions); pass {.causal = false} for cross-attention");
  if (o.window < 0 || o.window > std::max(qs[1], ks[1]))
    throw SpecError(where + "a window of " + std::to_string(o.window) + " keys for " + std::to_string(qs[1]) +
                    " queries over " + std::to_string(ks[1]) + " keys (0 for none, else at most " +
                    std::to_string(std::max(qs[1], ks[1])) + ")");
  const auto number = shortest_number;
  if (!(o.scale >= 0) || !std::isfinite(o.scale))
    throw SpecError(where + "the scale must be finite and at least 0 (0 for 1 / sqrt(Dh)), not " + number(o.scale));
  if (!(o.dropout.p >= 0 && o.dropout.p < 1))
    throw SpecError(where + "attention dropout drops with a probability in [0, 1), not " + number(o.dropout.p));
  if (o.dropout.row_offset < 0)
    throw SpecError(where + "attention dropout's row offset (the batch's first row in the whole batch) is " +
                    std::to_string(o.dropout.row_offset) + ", not 0 or more");
  // (each row's starts ascend from 0 below the length of what they pack, the last may be that
  // length, the row's end, as cu_seqlens' total; the keys' may repeat: empty key documents, as a
  // row padded whole or not at all)
  const auto check_starts = [&](const std::vector<std::vector<Index>>& starts, const std::string& name, Index length,
                                const std::string& of, bool empty_documents) {
    if (Index(starts.size()) != qs[0])
      throw ShapeError(where + name + " has " + std::to_string(starts.size()) + " rows for a batch of " +
                       std::to_string(qs[0]));
    for (std::size_t b = 0; b < starts.size(); ++b) {
      const auto& row = starts[b];
      Index last = -1;
      for (const Index& start : row) {  // (by reference: the last one is told by its address)
        const bool ends = &start == &row.back() && start == length;  // (the row's end, cu_seqlens' total)
        if ((empty_documents ? start < last || start > length : start <= last || (start >= length && !ends)) ||
            (last < 0 && start != 0))
          throw SpecError(where + name + "[" + std::to_string(b) + "] must " +
                          (empty_documents ? "rise from 0 to at most the " : "ascend from 0 below the ") + of + " " +
                          std::to_string(length) + (empty_documents ? "" : " (or end with it)") + ", and has " +
                          std::to_string(start) + (last < 0 ? " first" : " after " + std::to_string(last)));
        last = start;
      }
      if (row.empty())
        throw SpecError(where + name + "[" + std::to_string(b) + "] is empty ({0}: the row is one document)");
    }
  };
  if (!o.document_starts.empty()) {
    if (qs[1] != ks[1] && o.key_document_starts.empty())
      throw SpecError(where + "packed documents are self-attention: " + std::to_string(qs[1]) + " queries, " +
                      std::to_string(ks[1]) + " keys here (key_document_starts packs the keys apart, as flash-attn's "
                      "cu_seqlens_k)");
    check_starts(o.document_starts, "document_starts", qs[1],
                 o.key_document_starts.empty() ? "sequence length" : "query count", false);
  }
  if (!o.key_document_starts.empty())
    check_starts(o.key_document_starts, "key_document_starts", ks[1], "key count", true);
  if (!(o.softcap >= 0) || !std::isfinite(o.softcap))
    throw SpecError(where + "the softcap must be finite and at least 0 (0 for none), not " + number(o.softcap));
  const Index query_heads = qs[Q::rank - 1] * (Q::rank == 5 ? qs[3] : 1);
  if (!o.alibi_slopes.empty() && Index(o.alibi_slopes.size()) != query_heads)
    throw ShapeError(where + "ALiBi takes one slope per query head: the queries have " + std::to_string(query_heads) +
                     ", alibi_slopes " + std::to_string(o.alibi_slopes.size()) +
                     (Q::rank == 5 ? " (query head g of key-value head h takes alibi_slopes[h * G + g])" : ""));
  for (std::size_t i = 0; i < o.alibi_slopes.size(); ++i)
    if (!std::isfinite(o.alibi_slopes[i]))
      throw SpecError(where + "alibi_slopes[" + std::to_string(i) + "] is " + number(o.alibi_slopes[i]) +
                      ", not a finite number");
  AttentionGeometry geo{qs[1], ks[1], o.causal, o.window, o.causal ? ks[1] - qs[1] : 0};
  geo.softcap = o.softcap;
  return geo;
}

// The geometry of global batch row b and global key-value head h of G query heads: its packed
// documents, dropout and ALiBi slopes, if any.
inline AttentionGeometry head_geometry(const AttentionGeometry& geo, const AttentionOptions& o, Index b, Index h, Index G) {
  const AttentionGeometry packed = o.document_starts.empty() ? geo : geo.packed(o.document_starts[std::size_t(b)]);
  return (o.key_document_starts.empty() ? packed : packed.keyed(o.key_document_starts[std::size_t(b)]))
      .with_dropout(o.dropout, b, h)
      .with_alibi(o.alibi_slopes, h, G);
}

// The log-sum-exp's spec: the queries' without the head dim ([B, T, G, KV] or [B, T, H]).
template <class Q>
using LseSpec = typename tshard::detail::drop_dims<typename Q::SpecType, 2>::type;

// What the forward and the backward share: the local layouts of the queries, keys and values and
// of the log-sum-exp, the group size, this rank's batch rows and key-value heads, and the scale.
template <class A>
struct AttentionLocal {
  HeadLayout q, k, lse;
  Index G = 1, rows = 0, heads = 0, row0 = 0, head0 = 0;  // (row0, head0: the global indices of the first ones)
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
  a.row0 = lq.offset[0];
  a.heads = lq.valid[Q::rank - 1];
  a.head0 = lq.offset[Q::rank - 1];
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
      detail::attention_forward_head<A>(qh, kh, vh, at.G, detail::head_geometry(geo, options, at.row0 + b, at.head0 + h, at.G), at.scale,
                                        oh, lh);
      detail::unpack_head(oh, at.q, b, h, at.G, out.data());
      for (Index g = 0; g < at.G; ++g)
        for (Index t = 0; t < geo.T; ++t) lse.data()[at.lse.at(b, t, 0, g, h)] = lh(g * geo.T + t);
    }
  return std::pair{std::move(out), std::move(lse)};
}

// dq, dk, dv of attention given q, k, v, the forward's output and log-sum-exp, and dL/doutput
// (any layout: resolved into q's), with the options the forward had (dropout's seed and row
// offset among them: the mask is drawn again). No gradient of it is taken.
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
        detail::attention_backward_head<A>(qh, kh, vh, oh, doh, lh, at.G, detail::head_geometry(geo, options, at.row0 + b, at.head0 + h, at.G),
                                           at.scale, dqh, dkh, dvh);
        detail::unpack_head(dqh, at.q, b, h, at.G, dq.data());
        detail::unpack_head(dkh, at.k, b, h, 1, dk.data());
        detail::unpack_head(dvh, at.k, b, h, 1, dv.data());
      }
    return std::tuple{std::move(dq), std::move(dk), std::move(dv)};
  }
}

namespace detail {

// The ring problem of q and k in ring_layout (the sequence split over the ring's axes), and the
// row-slab views of their blocks.
template <class A, class Q, class K>
RingProblem<A> ring_problem(const Q& q, const K& k, const AttentionOptions& o) {
  if (!o.key_document_starts.empty())  // (context_way sends keys packed apart to the all-to-all)
    throw SpecError("tshard::nn::scaled_dot_product_attention: the ring takes no key_document_starts");
  const auto at = attention_local<A>(q, k, o);
  const auto& lq = tshard::detail::layout_of(q);
  RingProblem<A> rp;
  rp.comm = tshard::detail::state_of(q.mesh())->group(Q::spec_desc.dims[1]);
  rp.me = tshard::detail::comm_rank(rp.comm);
  rp.z = ZigzagChunks(tshard::detail::extents_of(q)[1], tshard::detail::comm_size(rp.comm));
  rp.pB = lq.padded[0];
  rp.D = lq.padded[2];
  rp.pG = at.q.pG;
  rp.pH = lq.padded[Q::rank - 1];
  rp.G = at.G;
  rp.rows = at.rows;
  rp.row0 = at.row0;
  rp.heads = at.heads;
  rp.head0 = at.head0;
  rp.causal = o.causal;
  rp.window = o.window;
  rp.scale = at.scale;
  if (!o.document_starts.empty()) rp.document_starts = &o.document_starts;
  rp.dropout = o.dropout;
  rp.softcap = o.softcap;
  if (!o.alibi_slopes.empty()) rp.alibi_slopes = &o.alibi_slopes;
  return rp;
}
template <class X>
RowSlabs row_slabs(const X& x) {
  const auto& l = tshard::detail::layout_of(x);
  Index m = 1;
  for (int d = 2; d < X::rank; ++d) m *= l.padded[d];
  return RowSlabs{l.padded[0], l.padded[1], m};
}
// A tensor's block in the ring's order (A elements), and back into a block of its layout.
template <class A, class X>
Scratch<A> to_ring(const RingProblem<A>& rp, const X& x) {
  Scratch<A> ring;
  const auto& l = tshard::detail::layout_of(x);
  relayout(rp.comm, rp.me, rp.z, row_slabs(x), l.offset[1], l.valid[1], const_cast<typename X::Scalar*>(x.data()), ring, true);
  return ring;
}
template <class A, class X>
void from_ring(const RingProblem<A>& rp, Scratch<A>& ring, X& x) {
  const auto& l = tshard::detail::layout_of(x);
  relayout(rp.comm, rp.me, rp.z, row_slabs(x), l.offset[1], l.valid[1], x.data(), ring, false);
}

// Ring attention of q, k, v in ring_layout (self-attention: T = S), differentiated by its own
// backward; it keeps the log-sum-exp in the ring's order (O(T / P) per head).
template <class Q, class K, class V>
auto ring_attention(const Q& q, const K& k, const V& v, const AttentionOptions& options) {
  using A = accumulator_t<typename Q::Scalar>;
  auto saved = std::make_shared<std::optional<Scratch<A>>>();  // the log-sum-exp, pooled
  return ad::custom_vjp(
      [saved, options](const auto& qv, const auto& kv, const auto& vv) {
        tshard::detail::OperatorScope scope("ring_attention");
        (void)attention_geometry(qv, kv, vv, options, "scaled_dot_product_attention");
        const auto rp = ring_problem<A>(qv, kv, options);
        Scratch<A> o, lse;
        ring_attention_forward(rp, to_ring(rp, qv), to_ring(rp, kv), to_ring(rp, vv), o, lse);
        auto out = zeros_like(qv);
        from_ring(rp, o, out);
        *saved = std::move(lse);
        return out;
      },
      [saved, options](const auto& dout, const auto& out, const auto& qv, const auto& kv, const auto& vv) {
        if (!*saved) throw SpecError("tshard::nn::scaled_dot_product_attention: its backward ran twice for one forward");
        tshard::detail::OperatorScope scope("ring_attention_backward");
        using O = std::decay_t<decltype(out)>;
        const auto rp = ring_problem<A>(qv, kv, options);
        Scratch<A> ring_dout;
        if constexpr (std::is_same_v<std::decay_t<decltype(dout)>, O>)
          ring_dout = to_ring(rp, dout);
        else
          ring_dout = to_ring(rp, tshard::detail::implicit_reshard<typename O::SpecType>(dout, "scaled_dot_product_attention"));
        Scratch<A> dq, dk, dv;
        ring_attention_backward(rp, to_ring(rp, qv), to_ring(rp, kv), to_ring(rp, vv), to_ring(rp, out), **saved, ring_dout,
                                dq, dk, dv);
        saved->reset();
        auto gq = zeros_like(qv);
        auto gk = zeros_like(kv);
        auto gv = zeros_like(vv);
        from_ring(rp, dq, gq);
        from_ring(rp, dk, gk);
        from_ring(rp, dv, gv);
        return std::tuple{std::move(gq), std::move(gk), std::move(gv)};
      },
      q, k, v);
}

// Which way a sequence split is attended, and why (see ContextParallel): the ring for the last
// two reasons, the all-to-all for the others. (Ulysses spreads the key-value heads over the
// heads' axes and the sequence's: `parts` ranks.)
enum class ContextWay { AllToAllAsked, OneRank, CrossAttention, KeyDocuments, RingAsked, HeadsDivide, HeadsDoNotDivide };
template <class Q, class K>
ContextWay context_way(const Q& q, const K& k, const AttentionOptions& o, Index* parts_out = nullptr) {
  const auto& shape = q.mesh().shape();
  Index parts = 1;
  for (const auto* split : {&Q::spec_desc.dims[1], &Q::spec_desc.dims[Q::rank - 1], &Q::spec_desc.dims[2]})
    parts *= tshard::detail::split_parts(*split, shape);
  if constexpr (Q::rank == 5) parts *= tshard::detail::split_parts(Q::spec_desc.dims[3], shape);
  if (parts_out) *parts_out = parts;
  if (o.context == ContextParallel::AllToAll) return ContextWay::AllToAllAsked;
  // A sequence axis of one rank splits nothing: the local kernel, with nothing sent to itself.
  if (tshard::detail::split_parts(Q::spec_desc.dims[1], shape) == 1) return ContextWay::OneRank;
  if (tshard::detail::extents_of(q)[1] != tshard::detail::extents_of(k)[1]) return ContextWay::CrossAttention;
  if (!o.key_document_starts.empty()) return ContextWay::KeyDocuments;
  if (o.context == ContextParallel::Ring) return ContextWay::RingAsked;
  return tshard::detail::extents_of(k)[3] % parts == 0 ? ContextWay::HeadsDivide : ContextWay::HeadsDoNotDivide;
}
template <class Q, class K>
bool takes_ring(const Q& q, const K& k, const AttentionOptions& o) {
  const ContextWay way = context_way(q, k, o);
  return way == ContextWay::RingAsked || way == ContextWay::HeadsDoNotDivide;
}

// What T queries over S keys attend under options o, in words (explain_attention's first clause).
inline std::string attention_what(Index T, Index S, const AttentionOptions& o) {
  const std::string queries = std::to_string(T) + (T == 1 ? " query" : " queries");
  std::string what = o.causal ? "causal" : "bidirectional";
  if (!o.key_document_starts.empty())
    what += std::string(o.causal ? " within each pair of documents (its queries at the last of its keys, bottom-right)"
                                 : "") +
            ", keys packed apart (" + queries + ", " + std::to_string(S) + " keys; query document j sees key document j)";
  else if (o.causal && T < S)
    what += " (the " + queries + " at the last of " + std::to_string(S) + " key positions, bottom-right)";
  else if (T != S)
    what += " cross-attention (" + queries + ", " + std::to_string(S) + " keys)";
  if (o.window > 0) what += ", a window of " + std::to_string(o.window) + " keys";
  if (!o.document_starts.empty()) what += ", packed documents";
  if (o.scale > 0) what += ", scale " + shortest_number(o.scale);
  if (!o.alibi_slopes.empty()) what += ", ALiBi";
  if (o.softcap > 0) what += ", scores soft-capped at " + shortest_number(o.softcap);
  if (o.dropout.p > 0) what += ", attention dropout " + shortest_number(o.dropout.p);
  return what;
}

// How x moves from spec From to spec To: the reshard's steps, or "stays".
template <class From, class To, class X>
std::string layout_moves(const X& x) {
  using A = ShardedTensor<typename X::Scalar, typename X::MeshT, From>;
  using B = ShardedTensor<typename X::Scalar, typename X::MeshT, To>;
  auto& mesh = *tshard::detail::state_of(x.mesh());
  if (tshard::detail::same_blocks(A::spec_desc, B::spec_desc, mesh.shape())) return "stays";  // (as reshard: no move)
  return tshard::detail::reshard_steps(mesh, A::spec_desc, B::spec_desc, tshard::detail::extents_of(x),
                                       sizeof(typename X::Scalar));
}
// ... for q, k, v into layout L and the output back.
template <class L, class Q, class K, class V>
std::string attention_moves(const Q& q, const K& k, const V& v) {
  return "q: " + layout_moves<typename Q::SpecType, typename L::Queries>(q) +
         "; k: " + layout_moves<typename K::SpecType, typename L::Keys>(k) +
         "; v: " + layout_moves<typename V::SpecType, typename L::Keys>(v) +
         "; output: " + layout_moves<typename L::Queries, typename Q::SpecType>(q);
}

// q, k and v moved into the layouts L names (L::Queries, L::Keys), attend(q, k, v) there, and the
// output moved back into q's layout: the forward's moves counted under `moves`, the attention under
// its own name (the backward's moves where the gradients are consumed: a reshard's rule sends its
// cotangent back unresolved).
template <class L, class Q, class K, class V, class Attend>
auto attend_relaid(const char* moves, const Q& q, const K& k, const V& v, Attend&& attend) {
  auto relaid = [&] {
    tshard::detail::OperatorScope scope(moves);
    return std::tuple(reshard<typename L::Queries>(q), reshard<typename L::Keys>(k), reshard<typename L::Keys>(v));
  }();
  auto out = std::apply(attend, relaid);
  tshard::detail::OperatorScope scope(moves);
  return reshard<typename Q::SpecType>(out);
}

}  // namespace detail

// softmax(q k^T * scale + mask) v for queries [B, T, Dh, G, KV] (or [B, T, Dh, H]) and keys and
// values [B, S, Dh, KV]: the output, laid out as q. Under ts::ad, one node whose rule is the
// fused backward; it keeps the output and the log-sum-exp (O(T) per head), never the scores.
template <tshard::detail::FloatingTensor Q, tshard::detail::FloatingTensor K, tshard::detail::FloatingTensor V>
auto scaled_dot_product_attention(const Q& q, const K& k, const V& v, const AttentionOptions& options = {}) {
  static_assert(detail::attention_types_checked<Q, K, V>());
  if constexpr (!detail::attention_aligned_v<Q, K, V>) {  // a sequence split (or another): resharded, and back
    (void)detail::attention_geometry(q, k, v, options, "scaled_dot_product_attention");  // (named in the caller's layout)
    using Layout = detail::attention_layout<typename Q::SpecType>;
    using Ring = detail::ring_layout<typename Q::SpecType>;
    if constexpr (Ring::sequence_split) {
      if (detail::takes_ring(q, k, options))
        return detail::attend_relaid<Ring>("attention_ring_relayout", q, k, v, [&](const auto& a, const auto& b, const auto& c) {
          return detail::ring_attention(a, b, c, options);
        });
    }
    // (Ulysses' all-to-alls where the sequence is split)
    return detail::attend_relaid<Layout>(Ring::sequence_split ? "attention_all_to_all" : "attention_relayout", q, k, v,
                                         [&](const auto& a, const auto& b, const auto& c) {
                                           return scaled_dot_product_attention(a, b, c, options);
                                         });
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

namespace detail {
// explain_attention's way, why and moves.
template <class Q, class K, class V>
std::string attention_way(const Q& q, const K& k, const V& v, const AttentionOptions& options) {
  if constexpr (detail::attention_aligned_v<Q, K, V>) {
    return "in place: each rank attends its own batch rows and key-value heads, nothing moves (queries " +
           q.describe() + ", keys " + k.describe() + ")";
  } else {
    using Layout = detail::attention_layout<typename Q::SpecType>;
    using Ring = detail::ring_layout<typename Q::SpecType>;
    if constexpr (Ring::sequence_split) {
      detail::Index parts = 1;
      const auto way = detail::context_way(q, k, options, &parts);
      const Eigen::Index kv = tshard::detail::extents_of(k)[3];
      const std::string heads = std::to_string(kv) + (kv == 1 ? " key-value head" : " key-value heads");
      const std::string over = " over the " + std::to_string(parts) + " ranks the all-to-all";
      std::string why;
      switch (way) {
        case detail::ContextWay::AllToAllAsked: why = ".context = AllToAll"; break;
        case detail::ContextWay::OneRank: break;
        case detail::ContextWay::CrossAttention:
          why = "the ring needs as many queries as keys (" + std::to_string(tshard::detail::extents_of(q)[1]) +
                " queries, " + std::to_string(tshard::detail::extents_of(k)[1]) + " keys)";
          break;
        case detail::ContextWay::KeyDocuments:
          why = "the ring takes the queries' documents for the keys' (key_document_starts packs them apart)";
          break;
        case detail::ContextWay::RingAsked: why = ".context = Ring"; break;
        case detail::ContextWay::HeadsDivide:
          why = "Auto: the " + heads + (kv == 1 ? " divides" : " divide") + " evenly" + over + " spreads them over";
          break;
        case detail::ContextWay::HeadsDoNotDivide:
          why = "Auto: the " + heads + (kv == 1 ? " does" : " do") + " not divide evenly" + over + " would spread them over";
          break;
      }
      if (way == detail::ContextWay::OneRank)
        return "the local kernel: the sequence's split has one rank, so nothing goes round; " +
               detail::attention_moves<Layout>(q, k, v);
      if (way == detail::ContextWay::RingAsked || way == detail::ContextWay::HeadsDoNotDivide) {
        const Eigen::Index ranks = tshard::detail::split_parts(Q::spec_desc.dims[1], q.mesh().shape());
        return "ring attention over the " + std::to_string(ranks) + " ranks of the sequence's split: keys and values go " +
               "round them point to point, rank i attending chunks i and " + std::to_string(2 * ranks - 1) + " - i of " +
               std::to_string(2 * ranks) + " (exchanged into that order and back inside), because " + why + "; " +
               detail::attention_moves<Ring>(q, k, v);
      }
      if (options.context == ContextParallel::Ring) why += " (.context = Ring cannot be taken)";
      if (kv % parts != 0) {  // (the shard rule's blocks of ceil(kv / parts): the last ranks fewer, or none)
        const Eigen::Index each = (kv + parts - 1) / parts, attending = (kv + each - 1) / each;
        why += attending < parts ? " (key-value heads on only " + std::to_string(attending) + " of the " +
                                       std::to_string(parts) + " ranks, at most " + std::to_string(each) + " each)"
                                 : " (the " + heads + " spread unevenly over the " + std::to_string(parts) +
                                       " ranks, at most " + std::to_string(each) + " each)";
      }
      return "all-to-all (Ulysses): the split moves from the sequence to the key-value heads and back, because " + why +
             "; " + detail::attention_moves<Layout>(q, k, v);
    } else {
      return "resharded into the kernel's layout (the sequence, head and group dims whole) and back; " +
             detail::attention_moves<Layout>(q, k, v);
    }
  }
}
}  // namespace detail

// What scaled_dot_product_attention(q, k, v, options) attends (causal or not, where the queries
// sit, the options that change the scores), which way it goes, why, and how q, k, v and the output
// move (explain_einsum's counterpart). It checks the options as the attention does.
template <tshard::detail::FloatingTensor Q, tshard::detail::FloatingTensor K, tshard::detail::FloatingTensor V>
std::string explain_attention(const Q& q, const K& k, const V& v, const AttentionOptions& options = {}) {
  static_assert(detail::attention_types_checked<Q, K, V>());
  (void)detail::attention_geometry(q, k, v, options, "explain_attention");
  return detail::attention_what(tshard::detail::extents_of(q)[1], tshard::detail::extents_of(k)[1], options) + "; " +
         detail::attention_way(q, k, v, options);
}

}  // namespace tshard::nn
