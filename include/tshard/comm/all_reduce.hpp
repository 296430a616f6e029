// tshard's own all-reduce of large buffers (the gradient buckets): the reduce-scatter exchange of
// collectives.hpp done in place, then each reduced segment all-gathered as soon as it is
// complete, so that one segment's gather travels while the next is summed (NCCL's and Horovod's
// pipelining of a ring). Bytes per rank are a ring's 2 (p - 1) / p of the buffer; the sum of each
// element is taken in the reduce-scatter's ring order (its owner's block: r + 1, ..., r - 1, r),
// the same bits on every rank, and on two ranks MPI's (a + b is b + a).
//
// Two levels (many nodes): the communicator split by shared memory (MPI_Comm_split_type), a
// reduce-scatter inside each node, the all-reduce of each rank's block among the ranks of the
// other nodes that hold the same block, then an all-gather inside each node: the network carries
// 2 (nodes - 1) / nodes of a node's share instead of the whole buffer through every rank.
// ZeRO's reduce-scatter gets the same two levels. TSHARD_RANKS_PER_NODE=k makes world ranks
// [0, k), [k, 2k), ... nodes (tests and benchmarks on one machine; scripts/two_hosts.sh runs two
// real network namespaces).
#pragma once
#include "tshard/comm/mpi.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/comm/collectives.hpp"

namespace tshard::detail {

// The tag of the all-gather half (the reduce-scatter half uses kReductionTag).
inline constexpr int kGatherTag = 0x7e5e;

// Buffers of at least this many bytes take tshard's all-reduce in the optimizer's buckets; smaller
// ones MPI's, whose log p rounds beat p - 1 there (settable: tests run every size through it).
inline std::uint64_t& own_all_reduce_bytes() {
  static std::uint64_t bytes = std::uint64_t(1) << 20;
  return bytes;
}

// n elements as p blocks of ceil(n / p), the last ones shorter or empty: rank r owns block r.
struct Blocks {
  Index n = 0, size = 0;
  int p = 1;
  Blocks(Index n_, int p_) : n(n_), size((n_ + p_ - 1) / p_), p(p_) {}
  Index begin(int r) const { return std::min(n, Index(r) * size); }
  Index length(int r) const { return std::min(n, Index(r + 1) * size) - begin(r); }
  // Segment k of block r: [at, at + len) of the buffer.
  Index segment_at(int r, Index k, Index seg) const { return begin(r) + std::min(length(r), k * seg); }
  Index segment_length(int r, Index k, Index seg) const {
    return std::max<Index>(0, std::min(length(r), (k + 1) * seg) - std::min(length(r), k * seg));
  }
};

// data = the sum over comm of data, in place, by the exchange above; `segment` elements a message.
template <class T>
void exchange_all_reduce(MPI_Comm comm, T* data, Index n, Index segment = 0) {
  using A = accumulator_t<T>;
  const int p = comm_size(comm), me = comm_rank(comm);
  if (p == 1 || n == 0) return;
  const Blocks b(n, p);
  const Index seg = std::max<Index>(1, std::min({segment > 0 ? segment : reduction_segment<T>(), collective_chunk_limit(), b.size}));
  const Index segments = (b.size + seg - 1) / seg;
  std::uint64_t moved = 0;  // each way: the other blocks' (reduce-scatter) and p - 1 copies of this one's (all-gather)
  for (int r = 0; r < p; ++r) moved += bytes_of<T>(r == me ? Index(p - 1) * b.length(r) : b.length(r));
  CollectiveTimer timer("all_reduce", moved, moved, comm);
  auto acc = pooled_array<A>(std::size_t(seg));
  std::shared_ptr<T> incoming[2] = {pooled_array<T>(std::size_t(seg)), pooled_array<T>(std::size_t(seg))};
  std::vector<MPI_Request> gathers[2];  // segments k - 1 and k in flight
  auto post_round = [&](Index k, int d, MPI_Request* reqs) {
    const int to = (me - d + p) % p, from = (me + d) % p;
    MPI_Irecv(incoming[d % 2].get(), int(b.segment_length(me, k, seg)), mpi_datatype<T>(), from, kReductionTag, comm, &reqs[0]);
    MPI_Isend(data + b.segment_at(to, k, seg), int(b.segment_length(to, k, seg)), mpi_datatype<T>(), to, kReductionTag, comm, &reqs[1]);
  };
  for (Index k = 0; k < segments; ++k) {
    // Reduce-scatter of segment k: round d + 1's messages travel while round d is summed.
    const Index at = b.segment_at(me, k, seg), len = b.segment_length(me, k, seg);
    MPI_Request round[2][2];
    post_round(k, 1, round[1]);
    for (int d = 1; d < p; ++d) {
      if (d + 1 < p) post_round(k, d + 1, round[(d + 1) % 2]);
      MPI_Waitall(2, round[d % 2], MPI_STATUSES_IGNORE);
      T* own = data + at;
      accumulate_round(ReduceOp::Sum, d, p, acc.get(), incoming[d % 2].get(), own, own, len);
    }
    // All-gather of segment k, left in flight while segment k + 1 is reduced.
    auto& g = gathers[k % 2];
    for (int q = 0; q < p; ++q) {
      if (q == me) continue;
      g.emplace_back();
      MPI_Irecv(data + b.segment_at(q, k, seg), int(b.segment_length(q, k, seg)), mpi_datatype<T>(), q, kGatherTag, comm, &g.back());
      g.emplace_back();
      MPI_Isend(data + at, int(len), mpi_datatype<T>(), q, kGatherTag, comm, &g.back());
    }
    auto& before = gathers[(k + 1) % 2];
    MPI_Waitall(int(before.size()), before.data(), MPI_STATUSES_IGNORE);
    before.clear();
  }
  for (auto& g : gathers) MPI_Waitall(int(g.size()), g.data(), MPI_STATUSES_IGNORE);
}

// The two levels of a communicator: this rank's node and its peers on the other nodes (the
// ranks with the same position in theirs). Usable where there are several nodes of several
// ranks each, all of one size, however the ranks are placed on them (round-robin included).
struct NodeGroups {
  MPI_Comm node = MPI_COMM_NULL, across = MPI_COMM_NULL;
  int nodes = 1, per_node = 1;
  bool usable = false;
  std::vector<int> rank_at;  // [local * nodes + across rank]: the communicator's rank there
  NodeGroups() = default;
  NodeGroups(const NodeGroups&) = delete;
  NodeGroups& operator=(const NodeGroups&) = delete;
  ~NodeGroups() {
    int down = 0;
    MPI_Finalized(&down);
    if (down) return;
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    if (across != MPI_COMM_NULL) MPI_Comm_free(&across);
  }
};

// Collective over comm: its node groups (shared memory, or TSHARD_RANKS_PER_NODE).
inline std::shared_ptr<NodeGroups> split_by_node(MPI_Comm comm) {
  auto g = std::make_shared<NodeGroups>();
  const int me = comm_rank(comm), p = comm_size(comm);
  if (const char* k = std::getenv("TSHARD_RANKS_PER_NODE"); k && std::atoi(k) > 0) {
    int world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    MPI_Comm_split(comm, world / std::atoi(k), me, &g->node);
  } else {
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &g->node);
#if TSHARD_SIMULATE
    // SMPI 3.32's shared-memory communicator has no context of its own: its messages match those
    // of any other communicator with the same peer and tag (the two-level overlapped reduction's
    // tags met the data axis's, MPI_ERR_TRUNCATE), and it orders ranks by host, not by key. The
    // same ranks split again, named by the node's first rank (a local lookup: no message).
    MPI_Group node_group, group;
    MPI_Comm_group(g->node, &node_group);
    MPI_Comm_group(comm, &group);
    int first = 0, color = 0;
    MPI_Group_translate_ranks(node_group, 1, &first, group, &color);
    MPI_Group_free(&node_group);
    MPI_Group_free(&group);
    MPI_Comm_free(&g->node);
    MPI_Comm_split(comm, color, me, &g->node);
#endif
  }
  const int local = comm_rank(g->node);
  g->per_node = comm_size(g->node);
  MPI_Comm_split(comm, local, me, &g->across);
  g->nodes = comm_size(g->across);
  // Every rank's place (local rank, across rank) and node size: one size everywhere makes the
  // table whole.
  const int mine[3] = {local, comm_rank(g->across), g->per_node};
  std::vector<int> all(std::size_t(3 * p));
  MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, comm);
  bool even = true;
  for (int j = 0; j < p; ++j) even = even && all[std::size_t(3 * j + 2)] == g->per_node;
  g->usable = even && g->nodes > 1 && g->per_node > 1;
  if (g->usable) {
    g->rank_at.assign(std::size_t(p), -1);
    for (int j = 0; j < p; ++j) g->rank_at[std::size_t(all[std::size_t(3 * j)] * g->nodes + all[std::size_t(3 * j + 1)])] = j;
  }
  return g;
}

// data = the sum over comm of data in two levels (g.usable), or flat.
template <class T>
void two_level_all_reduce(MPI_Comm comm, const NodeGroups& g, T* data, Index n) {
  if (!g.usable) return exchange_all_reduce(comm, data, n);
  const int L = g.per_node;
  const Blocks b(n, L);
  const Index len = b.length(comm_rank(g.node));
  auto share = pooled_array<T>(std::size_t(std::max<Index>(b.size, 1)));
  const bool whole = b.size * L == n;  // else the node's collectives take padded blocks (pooled: a bucket a step)
  std::shared_ptr<T> padded;
  if (!whole) {
    padded = pooled_array<T>(std::size_t(b.size * L));
    std::copy(data, data + n, padded.get());
    std::fill(padded.get() + n, padded.get() + b.size * L, T(0));
  }
  T* blocks = whole ? data : padded.get();
  reduce_scatter_block(g.node, blocks, share.get(), b.size, ReduceOp::Sum);
  exchange_all_reduce(g.across, share.get(), len);
  all_gather(g.node, share.get(), b.size, blocks);
  if (!whole) std::copy(padded.get(), padded.get() + n, data);
}

// ZeRO's reduce-scatter in two levels: send holds one block of n per rank of comm, in its rank
// order; each rank receives its block summed. The node's reduce-scatter hands local rank l the
// blocks of the ranks at local position l on every node (in their across order), summed over
// the node; the reduce-scatter among those ranks then leaves each its own.
template <class T>
void two_level_reduce_scatter(MPI_Comm comm, const NodeGroups& g, const T* send, T* recv, Index n) {
  if (!g.usable) return reduce_scatter_block(comm, send, recv, n, ReduceOp::Sum);
  const int L = g.per_node, N = g.nodes;
  auto grouped = pooled_array<T>(std::size_t(n) * std::size_t(L * N));
  for (int slot = 0; slot < L * N; ++slot) {
    const T* block = send + Index(g.rank_at[std::size_t(slot)]) * n;
    std::copy(block, block + n, grouped.get() + Index(slot) * n);
  }
  auto mine = pooled_array<T>(std::size_t(std::max<Index>(n * N, 1)));
  reduce_scatter_block(g.node, grouped.get(), mine.get(), n * N, ReduceOp::Sum);
  reduce_scatter_block(g.across, mine.get(), recv, n, ReduceOp::Sum);
}

}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void exchange_all_reduce<T>(MPI_Comm, T*, Index, Index))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void two_level_all_reduce<T>(MPI_Comm, const NodeGroups&, T*, \
    Index))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void two_level_reduce_scatter<T>(MPI_Comm, const NodeGroups&, \
    const T*, T*, Index))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
