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
// key-value heads (every rank attends every head of its chunks), causal or not, with a window.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tshard/comm/point_to_point.hpp"
#include "tshard/nn/functional/attention_blocks.hpp"

namespace tshard::nn::detail {

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
              std::vector<A>& ring, bool to_ring) {
  const int P = z.P;
  const Index w = slabs.width(), bs = tshard::detail::padded_extent(z.T, P);
  if (to_ring) ring.assign(std::size_t(2 * z.c * w), A(0));
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
  std::vector<std::vector<A>> sent(peers), received(peers);
  std::vector<tshard::detail::PendingMessage> messages;
  for (int q = 0; q < P; ++q) {
    auto& rows = out_rows[std::size_t(q)];
    auto& buf = sent[std::size_t(q)];
    buf.resize(std::size_t(rows.size()) * std::size_t(w));
    for (std::size_t i = 0; i < rows.size(); ++i) {
      A* at = buf.data() + Index(i) * w;
      if (to_ring) slabs.copy_out(block, rows[i] - begin, at);
      else std::copy_n(ring.data() + z.row(rows[i]) * w, w, at);
    }
    received[std::size_t(q)].resize(std::size_t(in_rows[std::size_t(q)].size()) * std::size_t(w));
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
  Index pB = 1, D = 1, pG = 1, pH = 1, G = 1, rows = 0, heads = 0;
  bool causal = true;
  Index window = 0;
  A scale = A(1);

  Index q_width() const { return pB * D * pG * pH; }
  Index k_width() const { return pB * D * pH; }
  Index lse_width() const { return pB * pG * pH; }
  // The geometry of query chunk ja against key chunk jb: positions are global.
  AttentionGeometry geometry(Index ja, Index jb) const {
    return AttentionGeometry{z.length(ja), z.length(jb), causal, window, z.begin(ja) - z.begin(jb)};
  }
  bool sees(Index ja, Index jb) const {
    const auto geo = geometry(ja, jb);
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
  void add_into(const RowMatrix<A>& in, Index b, Index h, int k, Index len, A* ring) const {
    const Index base = k * z.c, w = k_width();
    for (Index t = 0; t < len; ++t)
      for (Index d = 0; d < D; ++d) ring[(base + t) * w + b + pB * (d + D * h)] += in(t, d);
  }
  // This rank's (batch row, head, chunk) units: f(b, h, c, the chunk's length, its index).
  std::size_t units() const { return std::size_t(rows * heads * 2); }
  std::size_t unit(Index b, Index h, int c) const { return std::size_t((h * rows + b) * 2 + c); }
  template <class F>
  void for_each_unit(F&& f) const {
    for (Index h = 0; h < heads; ++h)
      for (Index b = 0; b < rows; ++b)
        for (int c = 0; c < 2; ++c) f(b, h, c, z.length(z.chunk(me, c)), unit(b, h, c));
  }
  // The block that starts round the ring from this rank: [keys | values].
  std::vector<A> visiting_block(const std::vector<A>& k, const std::vector<A>& v) const {
    std::vector<A> block(k);
    block.insert(block.end(), v.begin(), v.end());
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
            if (!sees(ja, jb)) continue;
            if (!packed) {
              pack(visiting, k_width(), 1, b, h, kc, lb, kh);
              pack(visiting + kv, k_width(), 1, b, h, kc, lb, vh);
              packed = true;
            }
            f(b, h, qc, kc, ja, jb, lb);
          }
        }
  }
  Index lse_at(Index b, Index g, Index h, int k, Index t) const {
    return (k * z.c + t) * lse_width() + b + pB * (g + pG * h);
  }
};

// Merges a partial output (o, lse over some keys) into the running one (normalised outputs
// weighted by exp(lse)): softmax over the union of the keys.
template <class A>
void merge_partial(RowMatrix<A>& o, Column<A>& lse, const RowMatrix<A>& part, const Column<A>& part_lse) {
  const A inf = std::numeric_limits<A>::infinity();
  for (Index i = 0; i < o.rows(); ++i) {
    const A b = part_lse(i);
    if (b == -inf) continue;
    const A a = lse(i);
    if (a == -inf) {
      o.row(i) = part.row(i);
      lse(i) = b;
      continue;
    }
    const A top = std::max(a, b), wa = std::exp(a - top), wb = std::exp(b - top), sum = wa + wb;
    o.row(i) = (o.row(i) * wa + part.row(i) * wb) / sum;
    lse(i) = top + std::log(sum);
  }
}

// The forward: the output (ring rows, q's width) and the log-sum-exp (ring rows, lse width).
template <class A>
void ring_attention_forward(const RingProblem<A>& rp, const std::vector<A>& q, const std::vector<A>& k,
                            const std::vector<A>& v, std::vector<A>& o, std::vector<A>& lse) {
  const int P = rp.z.P, me = rp.me, next = (me + 1) % P, prev = (me + P - 1) % P;
  const Index kv = 2 * rp.z.c * rp.k_width();
  const A inf = std::numeric_limits<A>::infinity();
  // The visiting keys and values (one buffer: [keys | values]), and the next ones arriving.
  std::vector<A> here = rp.visiting_block(k, v), coming(here.size());
  const std::size_t units = rp.units();
  std::vector<RowMatrix<A>> qs(units), os(units);
  std::vector<Column<A>> ls(units);
  rp.for_each_unit([&](Index b, Index h, int c, Index len, std::size_t u) {
    rp.pack(q.data(), rp.q_width(), rp.G, b, h, c, len, qs[u]);
    os[u].setZero(rp.G * len, rp.D);
    ls[u].setConstant(rp.G * len, -inf);
  });
  RowMatrix<A> kh, vh, part;
  Column<A> part_lse;
  for (int s = 0; s < P; ++s) {
    const int src = (me - s + P) % P;
    tshard::detail::PendingMessage out, in;
    if (s + 1 < P) {  // the next block travels while this one is attended
      in = tshard::detail::PendingMessage::receive(rp.comm, prev, coming.data(), 2 * kv, kRingTag);
      out = tshard::detail::PendingMessage::send(rp.comm, next, here.data(), 2 * kv, kRingTag);
    }
    rp.for_each_visible(here.data(), src, kh, vh, [&](Index b, Index h, int qc, int, Index ja, Index jb, Index) {
      const auto u = rp.unit(b, h, qc);
      attention_forward_head<A>(qs[u], kh, vh, rp.G, rp.geometry(ja, jb), rp.scale, part, part_lse);
      merge_partial(os[u], ls[u], part, part_lse);
    });
    if (s + 1 < P) {
      tshard::detail::wait_all({&in, &out});
      std::swap(here, coming);
    }
  }
  o.assign(std::size_t(2 * rp.z.c * rp.q_width()), A(0));
  lse.assign(std::size_t(2 * rp.z.c * rp.lse_width()), -inf);
  rp.for_each_unit([&](Index b, Index h, int c, Index len, std::size_t u) {
    rp.unpack(os[u], rp.q_width(), rp.G, b, h, c, len, o.data());
    for (Index g = 0; g < rp.G; ++g)
      for (Index t = 0; t < len; ++t) lse[std::size_t(rp.lse_at(b, g, h, c, t))] = ls[u](g * len + t);
  });
}

// The backward: dq, dk, dv (ring rows) from q, k, v, the output, its log-sum-exp and dL/doutput.
// The keys and values go round again; each rank adds its share of their gradients to the sums
// that travel with them, which are home after the last hop.
template <class A>
void ring_attention_backward(const RingProblem<A>& rp, const std::vector<A>& q, const std::vector<A>& k,
                             const std::vector<A>& v, const std::vector<A>& o, const std::vector<A>& lse,
                             const std::vector<A>& dout, std::vector<A>& dq, std::vector<A>& dk, std::vector<A>& dv) {
  const int P = rp.z.P, me = rp.me, next = (me + 1) % P, prev = (me + P - 1) % P;
  const Index kv = 2 * rp.z.c * rp.k_width();
  std::vector<A> here = rp.visiting_block(k, v), coming(here.size());
  // The gradient sums of the visiting block: this rank's share, the sums that arrive with it
  // (from the ranks it visited before) and the sums that leave.
  std::vector<A> share(here.size()), arriving(here.size()), leaving(here.size());
  const std::size_t units = rp.units();
  std::vector<RowMatrix<A>> qs(units), os(units), dos(units), dqs(units);
  std::vector<Column<A>> ls(units);
  rp.for_each_unit([&](Index b, Index h, int c, Index len, std::size_t u) {
    rp.pack(q.data(), rp.q_width(), rp.G, b, h, c, len, qs[u]);
    rp.pack(o.data(), rp.q_width(), rp.G, b, h, c, len, os[u]);
    rp.pack(dout.data(), rp.q_width(), rp.G, b, h, c, len, dos[u]);
    dqs[u].setZero(rp.G * len, rp.D);
    ls[u].resize(rp.G * len);
    for (Index g = 0; g < rp.G; ++g)
      for (Index t = 0; t < len; ++t) ls[u](g * len + t) = lse[std::size_t(rp.lse_at(b, g, h, c, t))];
  });
  RowMatrix<A> kh, vh, dqp, dkp, dvp;
  auto arrival = tshard::detail::PendingMessage::receive(rp.comm, prev, arriving.data(), 2 * kv, kRingGradTag);
  tshard::detail::PendingMessage departure;
  for (int s = 0; s < P; ++s) {
    const int src = (me - s + P) % P;
    tshard::detail::PendingMessage out, in;
    if (s + 1 < P) {
      in = tshard::detail::PendingMessage::receive(rp.comm, prev, coming.data(), 2 * kv, kRingTag);
      out = tshard::detail::PendingMessage::send(rp.comm, next, here.data(), 2 * kv, kRingTag);
    }
    std::fill(share.begin(), share.end(), A(0));
    rp.for_each_visible(here.data(), src, kh, vh, [&](Index b, Index h, int qc, int kc, Index ja, Index jb, Index lb) {
      const auto u = rp.unit(b, h, qc);
      attention_backward_head<A>(qs[u], kh, vh, os[u], dos[u], ls[u], rp.G, rp.geometry(ja, jb), rp.scale, dqp, dkp, dvp);
      dqs[u] += dqp;
      rp.add_into(dkp, b, h, kc, lb, share.data());
      rp.add_into(dvp, b, h, kc, lb, share.data() + kv);
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
  const auto& sums = arriving;
  dk.assign(sums.begin(), sums.begin() + kv);
  dv.assign(sums.begin() + kv, sums.end());
  dq.assign(std::size_t(2 * rp.z.c * rp.q_width()), A(0));
  rp.for_each_unit([&](Index b, Index h, int c, Index len, std::size_t u) {
    rp.unpack(dqs[u], rp.q_width(), rp.G, b, h, c, len, dq.data());
  });
}

}  // namespace tshard::nn::detail
