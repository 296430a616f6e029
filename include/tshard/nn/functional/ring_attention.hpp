// Ring attention (Liu et al. 2023; Megatron-LM's context parallelism) for a sequence split over
// mesh axes: each rank keeps its queries, and the keys and values travel around the ring of
// those axes point to point, the next block in flight while the present one is attended; the
// partial outputs merge by their log-sum-exps. In the backward the keys and values go round
// again with their gradients' running sums, which arrive home after the last hop.
//
// Load balance: the sequence is cut into 2P chunks and ring rank i attends with chunks i and
// 2P-1-i (a causal query chunk sees the chunks before it: every rank then has the same work).
// The caller's layout is the plain split (rank i holds [i ceil(T/P), ...)); the chunks are
// exchanged into that order on entry and back on exit, so positions stay the global ones and
// nothing changes for the user. Any T works (the last chunks shorter or empty), any number of
// key-value heads (every rank attends every head of its chunks), causal or not, with a window,
// packed documents, attention dropout and ALiBi (stated in global positions, which each chunk
// pair's geometry carries) and a softcap.
// Every buffer that grows with T (the ring-order copies, the travelling blocks and gradient sums,
// the outputs kept for the backward) comes from the buffer pool, so its peak counts them; queries
// are packed per visit, so only one (batch row, head, chunk) unit at a time is an Eigen matrix.
#pragma once
#include "tshard/comm/mpi.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/point_to_point.hpp"
#include "tshard/nn/functional/attention_blocks.hpp"

namespace tshard::nn::detail {

using tshard::detail::Scratch;

// The ring's 2P chunks of a sequence of T: chunk j is [j c, min(T, (j + 1) c)), c = ceil(T / 2P);
// ring rank i holds chunks i and 2P-1-i as 2c rows (the second from row c), padded.
struct ZigzagChunks {
  Index T = 0, c = 1;
  int P = 1;
  ZigzagChunks(Index t, int p) : T(t), c(std::max<Index>(1, (t + 2 * p - 1) / (2 * p))), P(p) {}
  Index begin(Index j) const { return std::min(T, j * c); }
  Index length(Index j) const { return std::min(T, (j + 1) * c) - begin(j); }
  Index chunk(int rank, int k) const { return k == 0 ? rank : 2 * P - 1 - rank; }
  int owner(Index t) const {
    const Index j = t / c;
    return int(j < P ? j : 2 * P - 1 - j);
  }
  Index row(Index t) const {  // in the owner's 2c rows
    const Index j = t / c;
    return (j < P ? 0 : c) + t - j * c;
  }
};

// A local block [pB, Tp, D, pG, pH] (column-major) seen row by row: row t's elements are the
// runs of pB at (t, m) for m over (d, g, h), `width` = pB * M of them.
struct RowSlabs {
  Index pB = 1, Tp = 1, M = 1;
  Index width() const { return pB * M; }
  template <class X, class Y>
  void copy_out(const X* block, Index t, Y* out) const {
    for (Index m = 0; m < M; ++m)
      for (Index b = 0; b < pB; ++b) out[m * pB + b] = Y(block[b + pB * (t + Tp * m)]);
  }
  template <class X, class Y>
  void copy_in(const X* in, Index t, Y* block) const {
    for (Index m = 0; m < M; ++m)
      for (Index b = 0; b < pB; ++b) block[b + pB * (t + Tp * m)] = Y(in[m * pB + b]);
  }
};

inline constexpr int kRelayoutTag = 0x7e20, kRingTag = 0x7e21, kRingGradTag = 0x7e22;

// The plain split's rows [begin, begin + valid) of a block -> the ring order's 2c rows of every
// rank (width A-elements a row, zero where no row is), or back (to_ring false: `ring` holds this
// rank's 2c rows and the block's valid rows are written). Point to point, each peer's rows in
// ascending order.
template <class X, class A>
void relayout(MPI_Comm comm, int me, const ZigzagChunks& z, const RowSlabs& slabs, Index begin, Index valid, X* block,
              Scratch<A>& ring, bool to_ring) {
  const int P = z.P;
  const Index w = slabs.width(), bs = tshard::detail::padded_extent(z.T, P);
  if (to_ring) ring = Scratch<A>(std::size_t(2 * z.c * w), A(0));
  // This rank's block rows by their ring owner, and its ring rows by their block owner.
  const std::size_t peers = std::size_t(P);
  std::vector<std::vector<Index>> block_rows(peers), ring_rows(peers);
  for (Index t = begin; t < begin + valid; ++t) block_rows[std::size_t(z.owner(t))].push_back(t);
  for (int k = 0; k < 2; ++k) {
    const Index j = z.chunk(me, k);
    for (Index t = z.begin(j); t < z.begin(j) + z.length(j); ++t) ring_rows[std::size_t(t / bs)].push_back(t);
  }
  auto& out_rows = to_ring ? block_rows : ring_rows;  // what this rank sends, per peer
  auto& in_rows = to_ring ? ring_rows : block_rows;
  std::vector<Scratch<A>> sent(peers), received(peers);
  std::vector<tshard::detail::PendingMessage> messages;
  for (int q = 0; q < P; ++q) {
    auto& rows = out_rows[std::size_t(q)];
    auto& buf = sent[std::size_t(q)];
    buf = Scratch<A>(rows.size() * std::size_t(w));
    for (std::size_t i = 0; i < rows.size(); ++i) {
      A* at = buf.data() + Index(i) * w;
      if (to_ring) slabs.copy_out(block, rows[i] - begin, at);
      else std::copy_n(ring.data() + z.row(rows[i]) * w, w, at);
    }
    received[std::size_t(q)] = Scratch<A>(in_rows[std::size_t(q)].size() * std::size_t(w));
  }
  for (int q = 0; q < P; ++q) {
    if (q == me) continue;
    if (!received[std::size_t(q)].empty())
      messages.push_back(tshard::detail::PendingMessage::receive(comm, q, received[std::size_t(q)].data(),
                                                                 Index(received[std::size_t(q)].size()), kRelayoutTag));
    if (!sent[std::size_t(q)].empty())
      messages.push_back(tshard::detail::PendingMessage::send(comm, q, sent[std::size_t(q)].data(),
                                                              Index(sent[std::size_t(q)].size()), kRelayoutTag));
  }
  received[std::size_t(me)] = std::move(sent[std::size_t(me)]);
  for (auto& m : messages) m.wait();
  for (int q = 0; q < P; ++q) {
    const auto& rows = in_rows[std::size_t(q)];
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const A* at = received[std::size_t(q)].data() + Index(i) * w;
      if (to_ring) std::copy_n(at, w, ring.data() + z.row(rows[i]) * w);
      else slabs.copy_in(at, rows[i] - begin, block);
    }
  }
}

// One rank's part of ring attention, on the ring order's rows (A elements): queries [2c][pB, D,
// pG, pH], keys and values [2c][pB, D, pH]; `rows` batch rows and `heads` key-value heads valid.
template <class A>
struct RingProblem {
  MPI_Comm comm = MPI_COMM_NULL;
  int me = 0;
  ZigzagChunks z{1, 1};
  Index pB = 1, D = 1, pG = 1, pH = 1, G = 1, rows = 0, heads = 0, row0 = 0, head0 = 0;  // (row0, head0: global indices)
  bool causal = true;
  Index window = 0;
  A scale = A(1);
  const std::vector<std::vector<Index>>* document_starts = nullptr;  // packed documents, by global batch row
  AttentionDropout dropout = {};
  double softcap = 0;
  const std::vector<double>* alibi_slopes = nullptr;  // by global query head

  Index q_width() const { return pB * D * pG * pH; }
  Index k_width() const { return pB * D * pH; }
  Index lse_width() const { return pB * pG * pH; }
  // The geometry of query chunk ja against key chunk jb: positions are global.
  AttentionGeometry geometry(Index ja, Index jb) const {
    AttentionGeometry geo{z.length(ja), z.length(jb), causal, window, z.begin(ja) - z.begin(jb), z.begin(jb)};
    geo.softcap = softcap;
    return geo;
  }
  // ... of batch row b (local), with its packed documents.
  AttentionGeometry geometry(Index ja, Index jb, Index b) const {
    const AttentionGeometry geo = geometry(ja, jb);
    return document_starts ? geo.packed((*document_starts)[std::size_t(row0 + b)]) : geo;
  }
  // ... and of key-value head h (local), with its dropout and ALiBi slopes.
  AttentionGeometry geometry(Index ja, Index jb, Index b, Index h) const {
    const AttentionGeometry geo = geometry(ja, jb, b).with_dropout(dropout, row0 + b, head0 + h);
    return alibi_slopes ? geo.with_alibi(*alibi_slopes, head0 + h, G) : geo;
  }
  bool sees(Index ja, Index jb, Index b) const {
    const auto geo = geometry(ja, jb, b);
    if (geo.T == 0 || geo.S == 0) return false;
    const auto [lo, hi] = geo.keys(0, geo.T);
    return hi > lo;
  }
  // Chunk k's rows (k = 0, 1) of head h, batch row b as a matrix [G * len, D] (query-like, with
  // `groups` = G) or [len, D] (keys, values: groups 1), and back.
  void pack(const A* ring, Index width, Index groups, Index b, Index h, int k, Index len, RowMatrix<A>& out) const {
    out.resize(groups * len, D);
    const Index base = k * z.c, pg = groups == 1 ? 1 : pG;
    for (Index g = 0; g < groups; ++g)
      for (Index t = 0; t < len; ++t)
        for (Index d = 0; d < D; ++d) out(g * len + t, d) = ring[(base + t) * width + b + pB * (d + D * (g + pg * h))];
  }
  void unpack(const RowMatrix<A>& in, Index width, Index groups, Index b, Index h, int k, Index len, A* ring) const {
    const Index base = k * z.c, pg = groups == 1 ? 1 : pG;
    for (Index g = 0; g < groups; ++g)
      for (Index t = 0; t < len; ++t)
        for (Index d = 0; d < D; ++d) ring[(base + t) * width + b + pB * (d + D * (g + pg * h))] = in(g * len + t, d);
  }
  void add_into(const RowMatrix<A>& in, Index width, Index groups, Index b, Index h, int k, Index len, A* ring) const {
    const Index base = k * z.c, pg = groups == 1 ? 1 : pG;
    for (Index g = 0; g < groups; ++g)
      for (Index t = 0; t < len; ++t)
        for (Index d = 0; d < D; ++d) ring[(base + t) * width + b + pB * (d + D * (g + pg * h))] += in(g * len + t, d);
  }
  // The log-sum-exps of unit (b, h, chunk k) of length len, [G * len].
  void pack_lse(const A* lse, Index b, Index h, int k, Index len, Column<A>& out) const {
    out.resize(G * len);
    for (Index g = 0; g < G; ++g)
      for (Index t = 0; t < len; ++t) out(g * len + t) = lse[lse_at(b, g, h, k, t)];
  }
  // The block that starts round the ring from this rank: [keys | values].
  Scratch<A> visiting_block(const Scratch<A>& k, const Scratch<A>& v) const {
    Scratch<A> block(k.size() + v.size());
    std::copy_n(k.data(), k.size(), block.data());
    std::copy_n(v.data(), v.size(), block.data() + k.size());
    return block;
  }
  // f(b, h, query chunk qc, key chunk kc, their chunk numbers ja, jb, the key chunk's length)
  // for every pair of this rank's query chunks and the visiting rank's key chunks that sees
  // anything, with that key chunk's keys and values of (b, h) packed into kh and vh (visiting:
  // [keys | values] of rank src, in the ring's rows).
  template <class F>
  void for_each_visible(const A* visiting, int src, RowMatrix<A>& kh, RowMatrix<A>& vh, F&& f) const {
    const Index kv = 2 * z.c * k_width();
    for (Index h = 0; h < heads; ++h)
      for (Index b = 0; b < rows; ++b)
        for (int kc = 0; kc < 2; ++kc) {
          const Index jb = z.chunk(src, kc), lb = z.length(jb);
          bool packed = false;
          for (int qc = 0; qc < 2; ++qc) {
            const Index ja = z.chunk(me, qc);
            if (!sees(ja, jb, b)) continue;
            if (!packed) {
              pack(visiting, k_width(), 1, b, h, kc, lb, kh);
              pack(visiting + kv, k_width(), 1, b, h, kc, lb, vh);
              packed = true;
            }
            f(b, h, qc, kc, ja, jb, lb);
          }
        }
  }
  std::size_t lse_at(Index b, Index g, Index h, int k, Index t) const {
    return std::size_t((k * z.c + t) * lse_width() + b + pB * (g + pG * h));
  }
};

// Merges a partial output of unit (b, h, chunk k) of length len (part [G * len, D] and its
// log-sum-exps, over some keys) into the running one in ring rows (o: normalised outputs, q's
// width; lse: their log-sum-exps, weights exp(lse)): softmax over the union of the keys.
template <class A>
void merge_partial(const RingProblem<A>& rp, const RowMatrix<A>& part, const Column<A>& part_lse, Index b, Index h, int k,
                   Index len, A* o, A* lse) {
  const A inf = std::numeric_limits<A>::infinity();
  const Index w = rp.q_width(), stride = rp.pB;
  for (Index g = 0; g < rp.G; ++g)
    for (Index t = 0; t < len; ++t) {
      const Index i = g * len + t;
      const A pb = part_lse(i);
      if (pb == -inf) continue;
      A* row = o + (k * rp.z.c + t) * w + b + rp.pB * rp.D * (g + rp.pG * h);  // element d at d * stride
      A& la = lse[rp.lse_at(b, g, h, k, t)];
      if (la == -inf) {
        for (Index d = 0; d < rp.D; ++d) row[d * stride] = part(i, d);
        la = pb;
        continue;
      }
      const A top = std::max(la, pb), wa = std::exp(la - top), wb = std::exp(pb - top), sum = wa + wb;
      for (Index d = 0; d < rp.D; ++d) row[d * stride] = (row[d * stride] * wa + part(i, d) * wb) / sum;
      la = top + std::log(sum);
    }
}

// The forward: the output (ring rows, q's width) and the log-sum-exp (ring rows, lse width).
template <class A>
void ring_attention_forward(const RingProblem<A>& rp, const Scratch<A>& q, const Scratch<A>& k, const Scratch<A>& v,
                            Scratch<A>& o, Scratch<A>& lse) {
  const int P = rp.z.P, me = rp.me, next = (me + 1) % P, prev = (me + P - 1) % P;
  const Index kv = 2 * rp.z.c * rp.k_width();
  // The visiting keys and values (one buffer: [keys | values]), and the next ones arriving.
  Scratch<A> here = rp.visiting_block(k, v), coming(here.size());
  o = Scratch<A>(std::size_t(2 * rp.z.c * rp.q_width()), A(0));
  lse = Scratch<A>(std::size_t(2 * rp.z.c * rp.lse_width()), -std::numeric_limits<A>::infinity());
  RowMatrix<A> qh, kh, vh, part;
  Column<A> part_lse;
  for (int s = 0; s < P; ++s) {
    const int src = (me - s + P) % P;
    tshard::detail::PendingMessage out, in;
    if (s + 1 < P) {  // the next block travels while this one is attended
      in = tshard::detail::PendingMessage::receive(rp.comm, prev, coming.data(), 2 * kv, kRingTag);
      out = tshard::detail::PendingMessage::send(rp.comm, next, here.data(), 2 * kv, kRingTag);
    }
    rp.for_each_visible(here.data(), src, kh, vh, [&](Index b, Index h, int qc, int, Index ja, Index jb, Index) {
      const Index len = rp.z.length(ja);
      rp.pack(q.data(), rp.q_width(), rp.G, b, h, qc, len, qh);
      attention_forward_head<A>(qh, kh, vh, rp.G, rp.geometry(ja, jb, b, h), rp.scale, part, part_lse);
      merge_partial(rp, part, part_lse, b, h, qc, len, o.data(), lse.data());
    });
    if (s + 1 < P) {
      tshard::detail::wait_all({&in, &out});
      std::swap(here, coming);
    }
  }
}

// The backward: dq, dk, dv (ring rows) from q, k, v, the output, its log-sum-exp and dL/doutput.
// The keys and values go round again; each rank adds its share of their gradients to the sums
// that travel with them, which are home after the last hop.
template <class A>
void ring_attention_backward(const RingProblem<A>& rp, const Scratch<A>& q, const Scratch<A>& k, const Scratch<A>& v,
                             const Scratch<A>& o, const Scratch<A>& lse, const Scratch<A>& dout, Scratch<A>& dq,
                             Scratch<A>& dk, Scratch<A>& dv) {
  const int P = rp.z.P, me = rp.me, next = (me + 1) % P, prev = (me + P - 1) % P;
  const Index kv = 2 * rp.z.c * rp.k_width();
  Scratch<A> here = rp.visiting_block(k, v), coming(here.size());
  // The gradient sums of the visiting block: this rank's share, the sums that arrive with it
  // (from the ranks it visited before) and the sums that leave.
  Scratch<A> share(here.size()), arriving(here.size()), leaving(here.size());
  dq = Scratch<A>(std::size_t(2 * rp.z.c * rp.q_width()), A(0));
  RowMatrix<A> qh, oh, doh, kh, vh, dqp, dkp, dvp;
  Column<A> lh;
  auto arrival = tshard::detail::PendingMessage::receive(rp.comm, prev, arriving.data(), 2 * kv, kRingGradTag);
  tshard::detail::PendingMessage departure;
  for (int s = 0; s < P; ++s) {
    const int src = (me - s + P) % P;
    tshard::detail::PendingMessage out, in;
    if (s + 1 < P) {
      in = tshard::detail::PendingMessage::receive(rp.comm, prev, coming.data(), 2 * kv, kRingTag);
      out = tshard::detail::PendingMessage::send(rp.comm, next, here.data(), 2 * kv, kRingTag);
    }
    std::fill_n(share.data(), share.size(), A(0));
    rp.for_each_visible(here.data(), src, kh, vh, [&](Index b, Index h, int qc, int kc, Index ja, Index jb, Index lb) {
      const Index len = rp.z.length(ja);
      rp.pack(q.data(), rp.q_width(), rp.G, b, h, qc, len, qh);
      rp.pack(o.data(), rp.q_width(), rp.G, b, h, qc, len, oh);
      rp.pack(dout.data(), rp.q_width(), rp.G, b, h, qc, len, doh);
      rp.pack_lse(lse.data(), b, h, qc, len, lh);
      attention_backward_head<A>(qh, kh, vh, oh, doh, lh, rp.G, rp.geometry(ja, jb, b, h), rp.scale, dqp, dkp, dvp);
      rp.add_into(dqp, rp.q_width(), rp.G, b, h, qc, len, dq.data());
      rp.add_into(dkp, rp.k_width(), 1, b, h, kc, lb, share.data());
      rp.add_into(dvp, rp.k_width(), 1, b, h, kc, lb, share.data() + kv);
    });
    // The sums of the block that arrived a hop ago (none with its first visit): this rank's
    // share added, on they go with it, and the next block's are awaited.
    if (s > 0) {
      arrival.wait();
      for (std::size_t i = 0; i < share.size(); ++i) share[i] += arriving[i];
      arrival = tshard::detail::PendingMessage::receive(rp.comm, prev, arriving.data(), 2 * kv, kRingGradTag);
    }
    departure.wait();
    std::swap(leaving, share);
    departure = tshard::detail::PendingMessage::send(rp.comm, next, leaving.data(), 2 * kv, kRingGradTag);
    if (s + 1 < P) {
      tshard::detail::wait_all({&in, &out});
      std::swap(here, coming);
    }
  }
  // This rank's own block's sums, home after the last hop.
  arrival.wait();
  departure.wait();
  dk = Scratch<A>(std::size_t(kv));
  dv = Scratch<A>(std::size_t(kv));
  std::copy_n(arriving.data(), kv, dk.data());
  std::copy_n(arriving.data() + kv, kv, dv.data());
}

}  // namespace tshard::nn::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::nn::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(struct RingProblem<T>)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void ring_attention_forward<T>(const RingProblem<T>&, const Scratch<T>&, const Scratch<T>&, const Scratch<T>&, Scratch<T>&, Scratch<T>&))
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void ring_attention_backward<T>(const RingProblem<T>&, const Scratch<T>&, const Scratch<T>&, const Scratch<T>&, const Scratch<T>&, const Scratch<T>&, const Scratch<T>&, Scratch<T>&, Scratch<T>&, Scratch<T>&))
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void relayout<T, T>(MPI_Comm, int, const ZigzagChunks&, const RowSlabs&, Index, Index, T*, Scratch<T>&, bool))
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::nn::detail
