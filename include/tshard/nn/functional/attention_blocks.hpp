// The blocks of fused attention (FlashAttention-2's algorithm, Dao 2023), what
// scaled_dot_product_attention and ring attention share: the mask as geometry, one head's
// queries, keys and values packed as matrices, and one head's forward (output and log-sum-exp,
// with a running maximum and sum over key blocks) and backward (each block's probabilities again
// from the log-sum-exp), with attention dropout's mask drawn again from a hash where it is needed.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "tshard/core/dispatch.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/random_bits.hpp"
#include "tshard/core/shard.hpp"

namespace tshard::nn {

// Which keys a query sees, and the scale of the scores. causal: the keys at or before its own
// position; with fewer queries than keys (S > T, a KV cache's decoding step) the queries are the
// last T positions (flash-attention's bottom-right alignment). window W > 0: only the W nearest
// (causal: p - W < s <= p for a query at position p; bidirectional: |t - s| < W), as Mistral's
// sliding window. scale 0 means 1 / sqrt(Dh).
// context: how a sequence split over mesh axes (context parallelism) is attended. Ring: keys and
// values travel around the ring of those axes (any number of heads; self-attention). AllToAll
// (DeepSpeed Ulysses): the split moves from the sequence to the key-value heads and back. Auto:
// the all-to-all where the key-value heads divide evenly over every rank it spreads them over,
// else the ring (fewer key-value heads than context ranks: GQA, MQA). Wherever the ring cannot
// go (queries and keys differ in number: cross-attention, a KV cache's step) the all-to-all
// attends, Ring asked for or not: a shape one rank attends is never refused on more, and the
// result is the same.
// document_starts: packed sequences (flash-attention's varlen, Megatron's packed THD batches) in
// self-attention. Row b holds the documents that start at positions document_starts[b] (sorted,
// the first 0; the last may be the row's end, as cu_seqlens' total); a query sees the keys of its
// own document only, and causal and window apply within it. Positions are the global ones on any
// layout, so the same starts serve every mesh, context parallelism included. Empty: each row is
// one sequence.
// dropout: attention dropout (of the probabilities, as PyTorch's dropout_p and Megatron's
// --attention-dropout): each is kept with probability 1 - p and scaled by 1 / (1 - p). The mask
// of query head (g, key-value head h) at global query position t and key position s of batch row
// row_offset + b comes from a hash of (seed, that row, h, g, t, s): the same on every mesh and
// layout, context parallelism included, and again in the backward. Vary the seed from call to
// call; row_offset places a micro-batch's rows in the whole batch.
// alibi_slopes: ALiBi (Press et al. 2022; BLOOM's, MPT's, flash-attn's alibi_slopes), a bias of
// -slope * |query position - key position| on each query head's scores (positions as the mask's:
// a causal query row t of T < S keys sits at S - T + t, flash-attn's bottom-right; bidirectional,
// queries and keys both start at 0, as the window takes them). One slope per query head,
// numbered as HF and flash-attn number them: query head g of key-value head h is h * G + g
// (queries [B, T, Dh, H]: head h). Empty: none.
// softcap: scores soft-capped to (-cap, cap) before the bias and the mask, cap * tanh(scores /
// cap) (Gemma 2's attn_logit_softcapping, flash-attn's softcap); 0: none.
// key_document_starts: the keys packed apart from the queries (flash-attn's varlen with
// cu_seqlens_k apart from cu_seqlens_q: packed encoder-decoder pairs, padded keys). Row b's query
// document j (of document_starts[b], or the whole row where document_starts is empty) sees key
// document j of key_document_starts[b] only (none where the row has fewer; key documents may be
// empty). Positions are counted from the pair's starts, causal queries the last of the pair's keys
// (bottom-right; a pair with more queries than keys leaves its first queries none), and causal,
// the window and ALiBi apply within the pair. {{0, n}}: the row's queries see its first n keys, 0
// to S (a key padding mask). Queries and keys of any lengths; a split sequence takes the
// all-to-all.
enum class ContextParallel { Auto, Ring, AllToAll };
struct AttentionDropout {
  double p = 0;
  std::uint64_t seed = 0;
  Eigen::Index row_offset = 0;
};
struct AttentionOptions {
  bool causal = true;
  Eigen::Index window = 0;
  double scale = 0;
  ContextParallel context = ContextParallel::Auto;
  std::vector<std::vector<Eigen::Index>> document_starts = {};
  AttentionDropout dropout = {};
  std::vector<double> alibi_slopes = {};
  double softcap = 0;
  std::vector<std::vector<Eigen::Index>> key_document_starts = {};
};

namespace detail {

using tshard::detail::Index;

// Whether options ask for plain causal attention, what a layer that takes none computes (context
// only chooses how a split sequence is attended, not what).
inline bool is_plain_causal(const AttentionOptions& o) {
  return o.causal && o.window == 0 && o.scale == 0 && o.document_starts.empty() && o.dropout.p == 0 &&
         o.alibi_slopes.empty() && o.softcap == 0 && o.key_document_starts.empty();
}

// The options a layer attends with: attention dropout in training only (its eval() turns it off,
// as PyTorch's modules' dropout); scratch holds the copy where one is needed.
inline const AttentionOptions& in_mode(const AttentionOptions& o, bool training, AttentionOptions& scratch) {
  if (training || o.dropout.p == 0) return o;
  scratch = o;
  scratch.dropout = {};
  return scratch;
}

// Attention dropout's hash: a key per query row from (seed, batch row, head, group, position),
// then each key position through two rounds of MurmurHash3's 32-bit finaliser (a loop over a
// row's keys vectorises); the top 24 bits against the drop threshold.
inline std::uint64_t dropout_row_key(std::uint64_t seed, Index row, Index head, Index group, Index t) {
  using tshard::detail::splitmix64;
  std::uint64_t key = splitmix64(seed);
  for (const Index x : {row, head, group, t}) key = splitmix64(key ^ std::uint64_t(x));
  return key;
}
inline std::uint32_t murmur_finalize(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  return x ^ (x >> 16);
}
inline std::uint32_t dropout_threshold_of(double p) { return std::uint32_t(std::llround(p * 16777216.0)); }
inline bool dropout_keeps(std::uint64_t row_key, Index s, std::uint32_t threshold) {
  const std::uint32_t x = murmur_finalize(std::uint32_t(row_key) ^ (std::uint32_t(s) * 0x9E3779B9u));
  return (murmur_finalize(x ^ std::uint32_t(row_key >> 32)) >> 8) >= threshold;
}
// The mask as geometry: what a query row sees, and which blocks need no element mask.
struct AttentionGeometry {
  Index T = 0, S = 0;
  bool causal = true;
  Index window = 0;
  Index offset = 0;  // query row t is at position t + offset (causal: S - T)
  // The global position of key 0 (a ring's chunk starts past it): what packed documents and
  // dropout's mask are stated in.
  Index origin = 0;
  // Packed documents: the batch row's document starts (global positions, ascending, the first 0;
  // none: one sequence).
  const Index* starts = nullptr;
  Index documents = 0;
  // Keys packed apart (key_document_starts): this row's key document starts; query document j of
  // `starts` (or the whole row) sees key document j. null: the queries' documents are the keys'.
  const Index* key_starts = nullptr;
  Index key_documents = 0;
  // Attention dropout of this (batch row, key-value head): whether it drops, the threshold of
  // kept hashes and the kept ones' scale, and what a query row's hash key comes from (with its
  // group and global position).
  bool dropout = false;
  double dropout_scale = 1;
  std::uint32_t dropout_threshold = 0;
  std::uint64_t dropout_seed = 0;
  Index dropout_batch_row = 0, dropout_head = 0;
  // Soft-capping (0: none), and ALiBi's slopes of this key-value head's G query heads (none: null).
  double softcap = 0;
  const double* alibi = nullptr;

  // The keys [lo, hi) that any of the query rows [t0, t1) sees: blocks outside are skipped (and,
  // for one row, exactly the keys it sees: one run, as a document is one).
  std::pair<Index, Index> keys(Index t0, Index t1) const {
    if (key_starts) {  // each row's run, joined (rows of one block may see runs of different pairs)
      Index lo = S, hi = 0;
      for (Index t = t0; t < t1; ++t) {
        const auto [a, b] = row_keys(t);
        if (a < b) lo = std::min(lo, a), hi = std::max(hi, b);
      }
      return lo < hi ? std::pair<Index, Index>{lo, hi} : std::pair<Index, Index>{0, 0};
    }
    Index lo = 0, hi = S;
    if (causal) hi = std::min(S, t1 + offset);
    if (window > 0) {
      lo = std::max<Index>(0, t0 + offset - window + 1);
      if (!causal) hi = std::min(S, t1 + offset - 1 + window);
    }
    if (documents > 0) {  // from the first row's document start to the last row's document end
      lo = std::max(lo, document(t0 + offset).first);
      hi = std::min(hi, document(t1 - 1 + offset).second);
    }
    return {lo, std::max(lo, hi)};
  }
  // Whether every (t, s) of the block [t0, t1) x [s0, s1) is visible.
  bool all_visible(Index t0, Index t1, Index s0, Index s1) const {
    Index p0 = t0 + offset, p1 = t1 + offset;
    if (key_starts) {  // one pair's queries, inside its keys; positions then run on within it
      const KeyPair first = pair_of(t0), last = pair_of(t1 - 1);
      if (first.pair != last.pair || first.lo >= first.hi || s0 < first.lo || s1 > first.hi) return false;
      p0 = first.position, p1 = last.position + 1;
    } else if (documents > 0 && (document(p1 - 1).first > s0 || document(p0).second < s1)) {
      return false;
    }
    if (causal && s1 - 1 > p0) return false;
    if (window > 0 && ((p1 - 1) - s0 >= window || (!causal && (s1 - 1) - p0 >= window))) return false;
    return true;
  }
  // The position of query row t among the keys: what causal, the window and ALiBi measure from.
  Index position(Index t) const { return key_starts ? pair_of(t).position : t + offset; }
  // Keys packed apart: query row t's document j, its position among the keys and key document j,
  // [lo, hi) (empty where the row has no key document j, or an empty one).
  struct KeyPair {
    Index pair, position, lo, hi;
  };
  KeyPair pair_of(Index t) const {
    static constexpr Index whole_row = 0;
    const Index* qs = documents > 0 ? starts : &whole_row;
    const Index qn = documents > 0 ? documents : 1;
    const Index j = Index(std::upper_bound(qs, qs + qn, t) - qs) - 1;
    if (j >= key_documents) return {j, t + offset, 0, 0};
    const Index qa = qs[j], qb = j + 1 < qn ? qs[j + 1] : T;
    const Index ka = key_starts[j], kb = j + 1 < key_documents ? key_starts[j + 1] : S;
    return {j, ka + (t - qa) + (causal ? (kb - ka) - (qb - qa) : 0), ka, kb};
  }
  // ... and the keys [lo, hi) it sees.
  std::pair<Index, Index> row_keys(Index t) const {
    const KeyPair pair = pair_of(t);
    Index lo = pair.lo, hi = pair.hi;
    if (causal) hi = std::min(hi, pair.position + 1);
    if (window > 0) {
      lo = std::max(lo, pair.position - window + 1);
      if (!causal) hi = std::min(hi, pair.position + window);
    }
    return {lo, std::max(lo, hi)};
  }
  // This geometry for a batch row packed with documents at `row` (global starts).
  AttentionGeometry packed(const std::vector<Index>& row) const {
    AttentionGeometry geo = *this;
    geo.starts = row.data();
    geo.documents = Index(row.size());
    return geo;
  }
  // This geometry for a batch row whose keys are packed apart, at `row` (key_document_starts[b]).
  AttentionGeometry keyed(const std::vector<Index>& row) const {
    AttentionGeometry geo = *this;
    geo.key_starts = row.data();
    geo.key_documents = Index(row.size());
    return geo;
  }
  // This geometry with attention dropout for batch row `row` (of the tensor: d.row_offset + row
  // in the whole batch) and key-value head `head` (global).
  AttentionGeometry with_dropout(const AttentionDropout& d, Index row, Index head) const {
    AttentionGeometry geo = *this;
    if (d.p <= 0) return geo;
    geo.dropout = true;
    geo.dropout_scale = 1 / (1 - d.p);
    geo.dropout_threshold = dropout_threshold_of(d.p);
    geo.dropout_seed = d.seed;
    geo.dropout_batch_row = d.row_offset + row;
    geo.dropout_head = head;
    return geo;
  }
  // This geometry with ALiBi for key-value head `head` (global) of G query heads each.
  AttentionGeometry with_alibi(const std::vector<double>& slopes, Index head, Index G) const {
    AttentionGeometry geo = *this;
    if (!slopes.empty()) geo.alibi = slopes.data() + head * G;
    return geo;
  }
  // The dropout multipliers z[0, n) of query row t (local) of group g against keys [s0, s0 + n).
  template <class A>
  void dropout_multipliers(A* z, Index n, Index g, Index t, Index s0) const {
    const std::uint64_t key = dropout_row_key(dropout_seed, dropout_batch_row, dropout_head, g, t + offset + origin);
    const A kept = A(dropout_scale);
    const Index first = s0 + origin;
    for (Index c = 0; c < n; ++c) z[c] = dropout_keeps(key, first + c, dropout_threshold) ? kept : A(0);
  }
  // [begin, end) of the document that holds key position p, in key positions (the last one's
  // end: past any key).
  std::pair<Index, Index> document(Index p) const {
    const Index* next = std::upper_bound(starts, starts + documents, p + origin);
    const Index end = next == starts + documents ? std::numeric_limits<Index>::max() / 2 : *next - origin;
    return {*(next - 1) - origin, end};
  }
};

// The multiplier of query head (g, h) at global query position t against global key position s
// in batch row b (row_offset + b in the whole batch): 0 or 1 / (1 - p), as the kernels draw it;
// for a reference to build its mask from (a causal query row t of T < S sits at S - T + t).
inline double dropout_multiplier_at(const AttentionDropout& d, Index b, Index head, Index group, Index t, Index s) {
  if (d.p <= 0) return 1;
  double z = 1;
  AttentionGeometry{}.with_dropout(d, b, head).dropout_multipliers(&z, 1, group, t, s);
  return z;
}

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
// A caller's rows as the kernels see them: they read and write, never resize (a dispatched
// kernel never allocates what its caller owns).
template <class A>
using RowsIn = Eigen::Map<const RowMatrix<A>>;
template <class A>
using RowsOut = Eigen::Map<RowMatrix<A>>;

// Query blocks of 64 rows against key blocks of 128: a block's scores stay in cache.
inline constexpr Index kQueryBlock = 64, kKeyBlock = 128;

// The (g, t) rows of head h of batch row b as a matrix [G * T, D] (row g * T + t), in A.
template <class T, class A>
void pack_head(const T* x, const HeadLayout& l, Index b, Index h, Index G, RowMatrix<A>& out) {
  out.resize(G * l.T, l.D);
  TSHARD_SAMPLED_KERNEL(l, G);
  for (Index g = 0; g < G; ++g)
    for (Index d = 0; d < l.D; ++d)
      for (Index t = 0; t < l.T; ++t) out(g * l.T + t, d) = A(x[l.at(b, t, d, g, h)]);
}
template <class T, class A>
void unpack_head(const RowMatrix<A>& in, const HeadLayout& l, Index b, Index h, Index G, T* x) {
  TSHARD_SAMPLED_KERNEL(l, G);
  for (Index g = 0; g < G; ++g)
    for (Index d = 0; d < l.D; ++d)
      for (Index t = 0; t < l.T; ++t) x[l.at(b, t, d, g, h)] = T(in(g * l.T + t, d));
}

// The products of a block pair, register-blocked on Eigen's packets: none of the packing and
// zeroing a general GEMM does on every call, which at head dims of 16-64 cost as much as the
// arithmetic. Each output element is one accumulator summed over the depth in order (as Eigen's
// GEMM sums it), then scaled once.
//   out[r, c] = alpha * sum_k a(r, k) b[k * ldb + c]   (Store), or
//   out[r, c] += alpha * sum_k a(r, k) b[k * ldb + c]
// a(r, k) = a.p[r * a.rs + k * a.ks] reads a row-major block or its transpose; b's columns are
// contiguous (a block of rows of K, V, dO, Q or of the transposed K, V).
// (Packet types as template arguments: GCC warns that their alignment attribute is dropped
// there, which is harmless, as Eigen's own headers say by silencing it.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
#endif
template <class A>
struct BlockOperand {
  const A* p;
  Index rs, ks;
  A operator()(Index r, Index k) const { return p[r * rs + k * ks]; }
};
// A score block (or its transpose) as a: strides known when compiling. A tile then reads its
// rows at fixed displacements from one pointer a step; with run-time strides a tile of 16 rows
// keeps 16 row addresses, more than x86's registers hold beside the loop's own, and the spills
// cost a third of the products that write head-dim columns.
template <class A, Index RowStride, Index DepthStride>
struct FixedStrideOperand {
  const A* p;
  A operator()(Index r, Index k) const { return p[r * RowStride + k * DepthStride]; }
};
template <class A>
using BlockPacket = typename Eigen::internal::packet_traits<A>::type;
template <class A>
inline constexpr Index kBlockLanes = Eigen::internal::unpacket_traits<BlockPacket<A>>::size;
// Rows per tile of 4, 2 and 1 packets of columns (0: no such tile): as many accumulators as the
// vector registers hold beside a row of b and a broadcast (BLIS's shapes: 6 x 2 with 16 registers).
#if defined(EIGEN_VECTORIZE_AVX512)
inline constexpr int kRowsBy4 = 4, kRowsBy2 = 8, kRowsBy1 = 16;  // 32 registers
#elif defined(EIGEN_VECTORIZE_FMA)
inline constexpr int kRowsBy4 = 0, kRowsBy2 = 6, kRowsBy1 = 12;  // 16 registers, fused multiply-add
#else
inline constexpr int kRowsBy4 = 0, kRowsBy2 = 4, kRowsBy1 = 8;   // 16, a product and a sum apart
#endif

// Rows [r0, r0 + RB) by the CB packets P of columns from c0. The accumulators must live in
// registers: the unroll pragmas let GCC see each as its own variable (else it keeps the array on
// the stack and stores and reloads every tile, a quarter of the time at depth 16), and the first
// step writes them (no zeros to add). The packets of b are pinned to registers: folded into each
// multiply-add, they would be loaded once per row of the tile, which on cores with two FMA units
// makes the loads, not the arithmetic, the limit.
#if defined(__GNUC__)
#define TSHARD_DETAIL_UNROLL _Pragma("GCC unroll 16")
#else
#define TSHARD_DETAIL_UNROLL
#endif
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__SSE2__))
#define TSHARD_DETAIL_IN_REGISTER(x) __asm__("" : "+v"(x))
#else
#define TSHARD_DETAIL_IN_REGISTER(x) (void)(x)
#endif
#if defined(__GNUC__)
#define TSHARD_DETAIL_OPAQUE_POINTER(x) __asm__("" : "+r"(x))
#else
#define TSHARD_DETAIL_OPAQUE_POINTER(x) (void)(x)
#endif
// a(r0 + i, k) for the rows of a tile: from one pointer a step where the strides are fixed (the
// pointer made opaque, else GCC derives one address per row again).
template <class Operand>
struct TileRows {
  const Operand& a;
  Index r0;
  auto at(Index k, int i) const { return a(r0 + i, k); }
};
template <class A, Index RS, Index KS>
struct TileRows<FixedStrideOperand<A, RS, KS>> {
  const FixedStrideOperand<A, RS, KS>& a;
  Index r0;
  A at(Index k, int i) const {
    const A* p = a.p + r0 * RS + k * KS;
    TSHARD_DETAIL_OPAQUE_POINTER(p);
    return p[i * RS];
  }
};
template <bool Store, int RB, int CB, class P, class A, class Operand>
void block_tile(A* out, Index ldo, const Operand& a, Index r0, const A* b, Index ldb, Index c0, Index depth,
                A alpha) {
  namespace ei = Eigen::internal;
  constexpr Index L = ei::unpacket_traits<P>::size;
  P acc[RB * CB];
  const TileRows<Operand> rows{a, r0};
  {  // k = 0 (or zeros, for depth 0): a product is what a multiply-add onto zero gives (a -0 aside)
    P bk[CB];
    TSHARD_DETAIL_UNROLL for (int j = 0; j < CB; ++j) bk[j] = depth > 0 ? ei::ploadu<P>(b + c0 + j * L) : ei::pset1<P>(A(0));
    TSHARD_DETAIL_UNROLL for (int i = 0; i < RB; ++i) {
      const P ai = ei::pset1<P>(depth > 0 ? rows.at(0, i) : A(0));
      TSHARD_DETAIL_UNROLL for (int j = 0; j < CB; ++j) acc[i * CB + j] = ei::pmul(ai, bk[j]);
    }
  }
  for (Index k = 1; k < depth; ++k) {
    P bk[CB];
    TSHARD_DETAIL_UNROLL for (int j = 0; j < CB; ++j) {
      bk[j] = ei::ploadu<P>(b + k * ldb + c0 + j * L);
      if constexpr (CB > 1 && !std::is_same_v<P, A>) TSHARD_DETAIL_IN_REGISTER(bk[j]);
    }
    TSHARD_DETAIL_UNROLL for (int i = 0; i < RB; ++i) {
      const P ai = ei::pset1<P>(rows.at(k, i));
      TSHARD_DETAIL_UNROLL for (int j = 0; j < CB; ++j) acc[i * CB + j] = ei::pmadd(ai, bk[j], acc[i * CB + j]);
    }
  }
  const P al = ei::pset1<P>(alpha);
  TSHARD_DETAIL_UNROLL for (int i = 0; i < RB; ++i) TSHARD_DETAIL_UNROLL for (int j = 0; j < CB; ++j) {
    A* o = out + (r0 + i) * ldo + c0 + j * L;
    if constexpr (Store) ei::pstoreu(o, ei::pmul(acc[i * CB + j], al));
    else ei::pstoreu(o, ei::pmadd(acc[i * CB + j], al, ei::ploadu<P>(o)));
  }
}
#undef TSHARD_DETAIL_IN_REGISTER
#undef TSHARD_DETAIL_OPAQUE_POINTER
#undef TSHARD_DETAIL_UNROLL

// The rows from r, in tiles of RB, over the CB packets of columns from c0; the rows left, in
// tiles of half as many, and so on.
template <bool Store, int RB, int CB, class P, class A, class Operand>
void block_columns(A* out, Index ldo, Index rows, const Operand& a, const A* b, Index ldb, Index c0,
                   Index depth, A alpha, Index r = 0) {
  for (; r + RB <= rows; r += RB) block_tile<Store, RB, CB, P>(out, ldo, a, r, b, ldb, c0, depth, alpha);
  if constexpr (RB > 1)
    if (r < rows) block_columns<Store, RB / 2, CB, P>(out, ldo, rows, a, b, ldb, c0, depth, alpha, r);
}

// The columns from c that whole packets P cover (four, two, then one at a time; narrower packet
// types one at a time); returns the first column left.
template <bool Store, bool Widest, class P, class A, class Operand>
Index block_packets(A* out, Index ldo, Index rows, Index cols, Index c, const Operand& a, const A* b,
                    Index ldb, Index depth, A alpha) {
  constexpr Index L = Eigen::internal::unpacket_traits<P>::size;
  if constexpr (Widest && kRowsBy4 > 0)
    for (; c + 4 * L <= cols; c += 4 * L)
      block_columns<Store, kRowsBy4, 4, P>(out, ldo, rows, a, b, ldb, c, depth, alpha);
  if constexpr (Widest)
    for (; c + 2 * L <= cols; c += 2 * L)
      block_columns<Store, kRowsBy2, 2, P>(out, ldo, rows, a, b, ldb, c, depth, alpha);
  for (; c + L <= cols; c += L) block_columns<Store, kRowsBy1, 1, P>(out, ldo, rows, a, b, ldb, c, depth, alpha);
  return c;
}

// Every column that packets cover, widest packets first; returns the first column left.
template <bool Store, class A, class Operand>
Index block_all_packets(A* out, Index ldo, Index rows, Index cols, const Operand& a, const A* b, Index ldb,
                        Index depth, A alpha) {
  using P = BlockPacket<A>;
  using Half = typename Eigen::internal::unpacket_traits<P>::half;
  using Quarter = typename Eigen::internal::unpacket_traits<Half>::half;
  Index c = block_packets<Store, true, P>(out, ldo, rows, cols, 0, a, b, ldb, depth, alpha);
  if constexpr (!std::is_same_v<Half, P>)
    c = block_packets<Store, false, Half>(out, ldo, rows, cols, c, a, b, ldb, depth, alpha);
  if constexpr (!std::is_same_v<Quarter, Half>)
    c = block_packets<Store, false, Quarter>(out, ldo, rows, cols, c, a, b, ldb, depth, alpha);
  return c;
}

template <bool Store, class A>
void block_product(A* out, Index ldo, Index rows, Index cols, const BlockOperand<A>& a, const A* b, Index ldb,
                   Index depth, A alpha) {
  Index c;
  if (a.rs == kKeyBlock && a.ks == 1)  // a score block
    c = block_all_packets<Store>(out, ldo, rows, cols, FixedStrideOperand<A, kKeyBlock, 1>{a.p}, b, ldb, depth, alpha);
  else if (a.rs == 1 && a.ks == kKeyBlock)  // its transpose
    c = block_all_packets<Store>(out, ldo, rows, cols, FixedStrideOperand<A, 1, kKeyBlock>{a.p}, b, ldb, depth, alpha);
  else
    c = block_all_packets<Store>(out, ldo, rows, cols, a, b, ldb, depth, alpha);
  if (c == cols) return;
  // The columns past the last packet (head dims that are not a multiple of 4): Eigen's product.
  using Strided = Eigen::Map<const RowMatrix<A>, 0, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>;
  using Rows = Eigen::Map<const RowMatrix<A>, 0, Eigen::OuterStride<>>;
  const Strided am(a.p, rows, depth, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(a.rs, a.ks));
  const Rows bm(b + c, depth, cols - c, Eigen::OuterStride<>(ldb));
  Eigen::Map<RowMatrix<A>, 0, Eigen::OuterStride<>> om(out + c, rows, cols - c, Eigen::OuterStride<>(ldo));
  if constexpr (Store) om.noalias() = alpha * (am * bm);
  else om.noalias() += alpha * (am * bm);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// x [S, D] transposed, [D, S] with S padded so that its rows do not start a multiple of 4 KiB
// apart: a block product reads a packet from each of D rows, which would otherwise all fall
// into the same sets of the L1 cache.
template <class A>
RowMatrix<A> transposed_rows(const RowsIn<A>& x) {
  Index ld = x.rows();
  if ((ld * Index(sizeof(A))) % 4096 == 0) ld += 64 / Index(sizeof(A));
  RowMatrix<A> t(x.cols(), ld);
  t.leftCols(x.rows()) = x.transpose();
  return t;
}

// scores := q_i k_j^T * scale on the block of group g (kt: the head's keys transposed),
// soft-capped, with ALiBi's bias, and -inf where the mask hides a key. slope (the backward's,
// with a softcap): where the capped scores change with the scores, 1 - tanh^2 of each.
template <class A, class Block>
void block_scores(Block&& s, const RowsIn<A>& q, const RowMatrix<A>& kt, Index r0, Index g, Index t0, Index s0,
                  const AttentionGeometry& geo, A scale, RowMatrix<A>* slope = nullptr) {
  const Index br = s.rows(), bc = s.cols(), D = q.cols();
  block_product<true>(s.data(), s.outerStride(), br, bc, BlockOperand<A>{q.data() + r0 * D, D, 1}, kt.data() + s0,
                      kt.cols(), D, scale);
  if (geo.softcap > 0) {
    const A cap = A(geo.softcap);
    for (Index i = 0; i < br; ++i) {
      auto r = s.row(i).array();
      r = (r * (A(1) / cap)).tanh();
      if (slope) slope->row(i).head(bc).array() = A(1) - r.square();
      r *= cap;
    }
  }
  if (geo.alibi) {  // -slope |p - s|: a row's distances from the block's first key, less 0, 1, 2, ...
    static const Eigen::Array<A, 1, kKeyBlock> ramp = Eigen::Array<A, 1, kKeyBlock>::LinSpaced(A(0), A(kKeyBlock - 1));
    const A m = A(geo.alibi[g]);
    for (Index i = 0; i < br; ++i) s.row(i).array() -= m * (A(geo.position(t0 + i) - s0) - ramp.head(bc)).abs();
  }
  if (geo.all_visible(t0, t0 + br, s0, s0 + bc)) return;
  for (Index i = 0; i < br; ++i) {  // a row sees one run of keys: hide what lies either side
    const auto [lo, hi] = geo.keys(t0 + i, t0 + i + 1);
    const Index a = std::clamp<Index>(lo - s0, 0, bc), z = std::clamp<Index>(hi - s0, a, bc);
    s.row(i).head(a).setConstant(-std::numeric_limits<A>::infinity());
    s.row(i).tail(bc - z).setConstant(-std::numeric_limits<A>::infinity());
  }
}

// One head's forward: o [G * T, D] and the log-sum-exp of every row (its softmax's normaliser)
// from q [G * T, D], k and v [S, D], all row-major. Dispatched (core/dispatch.hpp).
template <class A>
void attention_forward_head_kernel(const A* q_rows, const A* k_rows, const A* v_rows, Index D, Index G,
                                   const AttentionGeometry& geo, A scale, A* o_rows, A* lse_rows) {
  TSHARD_DISPATCH((attention_forward_head_kernel<A>), q_rows, k_rows, v_rows, D, G, geo, scale, o_rows, lse_rows);
  const A inf = std::numeric_limits<A>::infinity();
  const RowsIn<A> q(q_rows, G * geo.T, D), k(k_rows, geo.S, D), v(v_rows, geo.S, D);
  RowsOut<A> o(o_rows, G * geo.T, D);
  Eigen::Map<Column<A>> lse(lse_rows, G * geo.T);
  o.setZero();
  const RowMatrix<A> kt = transposed_rows(k);
  RowMatrix<A> scores(kQueryBlock, kKeyBlock);
  const Index ld = kKeyBlock;  // of the score block
  Column<A> m(kQueryBlock), l(kQueryBlock), z(geo.dropout ? kKeyBlock : 0);
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
        block_scores<A>(p, q, kt, r0, g, t0, s0, geo, scale);
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
          if (geo.dropout) {  // the normaliser counts every probability, the output the kept ones
            geo.dropout_multipliers(z.data(), bc, g, t0 + i, s0);
            p.row(i).array() *= z.head(bc).transpose().array();
          }
        }
        // oi += p v_j
        block_product<false>(oi.data(), D, br, D, BlockOperand<A>{p.data(), ld, 1}, v.data() + s0 * D, D, bc,
                             A(1));
      }
      for (Index i = 0; i < br; ++i) {
        if (l(i) > A(0)) oi.row(i) /= l(i);
        lse(r0 + i) = l(i) > A(0) ? m(i) + std::log(l(i)) : -inf;  // (a row that sees no key: zeros)
      }
    }
}

// One head's backward (FlashAttention-2's): each block's probabilities again from the
// log-sum-exp, then dv += p^T do, ds = p (do v^T - rowsum(do o)), dq += ds k, dk += ds^T q.
// With dropout's multipliers z: dv += (p z)^T do, ds = p (z do v^T - rowsum(do o)); with a
// softcap, ds times the capped scores' slope. (ALiBi's bias is a constant: no term.)
// q, o, dout and dq [G * T, D], k, v, dk and dv [S, D], lse [G * T]. Dispatched.
template <class A>
void attention_backward_head_kernel(const A* q_rows, const A* k_rows, const A* v_rows, const A* o_rows,
                                    const A* dout_rows, const A* lse_rows, Index D, Index G,
                                    const AttentionGeometry& geo, A scale, A* dq_rows, A* dk_rows, A* dv_rows) {
  TSHARD_DISPATCH((attention_backward_head_kernel<A>), q_rows, k_rows, v_rows, o_rows, dout_rows, lse_rows, D, G, geo,
                  scale, dq_rows, dk_rows, dv_rows);
  const A inf = std::numeric_limits<A>::infinity();
  const RowsIn<A> q(q_rows, G * geo.T, D), k(k_rows, geo.S, D), v(v_rows, geo.S, D), o(o_rows, G * geo.T, D),
      dout(dout_rows, G * geo.T, D);
  const Eigen::Map<const Column<A>> lse(lse_rows, G * geo.T);
  RowsOut<A> dq(dq_rows, G * geo.T, D), dk(dk_rows, geo.S, D), dv(dv_rows, geo.S, D);
  const Column<A> rowdot = (dout.array() * o.array()).rowwise().sum();
  dq.setZero();
  dk.setZero();
  dv.setZero();
  const RowMatrix<A> kt = transposed_rows(k), vt = transposed_rows(v);
  RowMatrix<A> pb(kQueryBlock, kKeyBlock), dsb(kQueryBlock, kKeyBlock);
  RowMatrix<A> capped(geo.softcap > 0 ? kQueryBlock : 0, kKeyBlock);  // d(capped scores) / d(scores)
  Column<A> z(geo.dropout ? kKeyBlock : 0);
  const Index ld = kKeyBlock;  // of the p and ds blocks
  for (Index g = 0; g < G; ++g)
    for (Index t0 = 0; t0 < geo.T; t0 += kQueryBlock) {
      const Index br = std::min(kQueryBlock, geo.T - t0), r0 = g * geo.T + t0;
      const auto [lo, hi] = geo.keys(t0, t0 + br);
      for (Index s0 = lo; s0 < hi; s0 += kKeyBlock) {
        const Index bc = std::min(kKeyBlock, hi - s0);
        auto p = pb.topLeftCorner(br, bc);
        auto ds = dsb.topLeftCorner(br, bc);
        const A* dout_i = dout.data() + r0 * D;
        // The scores and ds = do_i v_j^T; then, a row at a time while it is in cache, p from the
        // scores and ds = p (ds - rowdot); then dv_j += p^T do_i.
        block_scores<A>(p, q, kt, r0, g, t0, s0, geo, scale, geo.softcap > 0 ? &capped : nullptr);
        block_product<true>(ds.data(), ld, br, bc, BlockOperand<A>{dout_i, D, 1}, vt.data() + s0, vt.cols(), D, A(1));
        for (Index i = 0; i < br; ++i) {
          if (lse(r0 + i) == -inf) p.row(i).setZero();
          else p.row(i) = (p.row(i).array() - lse(r0 + i)).exp();
          if (geo.dropout) {
            geo.dropout_multipliers(z.data(), bc, g, t0 + i, s0);
            const auto zi = z.head(bc).transpose().array();
            ds.row(i) = p.row(i).array() * (zi * ds.row(i).array() - rowdot(r0 + i));
            p.row(i).array() *= zi;
          } else {
            ds.row(i) = p.row(i).array() * (ds.row(i).array() - rowdot(r0 + i));
          }
          if (geo.softcap > 0) ds.row(i).array() *= capped.row(i).head(bc).array();
        }
        block_product<false>(dv.data() + s0 * D, D, bc, D, BlockOperand<A>{p.data(), 1, ld}, dout_i, D, br, A(1));
        // dq_i += scale ds k_j; dk_j += scale ds^T q_i
        block_product<false>(dq.data() + r0 * D, D, br, D, BlockOperand<A>{ds.data(), ld, 1}, k.data() + s0 * D, D, bc,
                             scale);
        block_product<false>(dk.data() + s0 * D, D, bc, D, BlockOperand<A>{ds.data(), 1, ld}, q.data() + r0 * D, D, br,
                             scale);
      }
    }
}

// One head's forward and backward on the caller's matrices, sized here (what the callers hold).
template <class A>
void attention_forward_head(const RowMatrix<A>& q, const RowMatrix<A>& k, const RowMatrix<A>& v, Index G,
                            const AttentionGeometry& geo, A scale, RowMatrix<A>& o, Column<A>& lse) {
  o.resize(G * geo.T, q.cols());
  lse.resize(G * geo.T);
  attention_forward_head_kernel<A>(q.data(), k.data(), v.data(), q.cols(), G, geo, scale, o.data(), lse.data());
}
template <class A>
void attention_backward_head(const RowMatrix<A>& q, const RowMatrix<A>& k, const RowMatrix<A>& v,
                             const RowMatrix<A>& o, const RowMatrix<A>& dout, const Column<A>& lse, Index G,
                             const AttentionGeometry& geo, A scale, RowMatrix<A>& dq, RowMatrix<A>& dk,
                             RowMatrix<A>& dv) {
  dq.resize(q.rows(), q.cols());
  dk.resize(k.rows(), k.cols());
  dv.resize(v.rows(), v.cols());
  attention_backward_head_kernel<A>(q.data(), k.data(), v.data(), o.data(), dout.data(), lse.data(), q.cols(), G, geo,
                                    scale, dq.data(), dk.data(), dv.data());
}

}  // namespace detail
}  // namespace tshard::nn

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp); the head
// kernels also per instruction-set level (core/dispatch.hpp).
namespace tshard::nn::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void pack_head<T, T>(const T*, const HeadLayout&, Index, Index, \
    Index, RowMatrix<T>&))
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (attention_forward_head_kernel<T>), const T*, const T*, \
    const T*, Index, Index, const AttentionGeometry&, T, T*, T*)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (attention_backward_head_kernel<T>), const T*, const T*, \
    const T*, const T*, const T*, const T*, Index, Index, const AttentionGeometry&, T, T*, T*, T*)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::nn::detail
