// The reshard executor: runs a plan's steps on one rank's buffers, instantiated once per
// element type. Each step reads the previous step's buffer and writes the next one; only the
// last writes into the caller's destination.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/collectives.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/core/box_copy.hpp"
#include "tshard/reshard/plan.hpp"
#include "tshard/reshard/redistribute.hpp"
#include "tshard/tensor/gather_kernels.hpp"

namespace tshard::detail {

// A block with dim d's extent, offset and valid length taken from another block.
inline ShardLayout with_dim_of(ShardLayout l, const ShardLayout& o, int d) {
  l.padded[d] = o.padded[d];
  l.offset[d] = o.offset[d];
  l.valid[d] = o.valid[d];
  return l;
}

// True when the blocks along d are contiguous in memory (every later dim has extent 1).
inline bool slowest_dim(const ShardLayout& l, int d) {
  for (int e = d + 1; e < l.rank; ++e)
    if (l.padded[e] != 1) return false;
  return true;
}

inline ReduceOp reduce_op_of(PartialKind k) {
  return k == PartialKind::Max ? ReduceOp::Max : k == PartialKind::Min ? ReduceOp::Min : ReduceOp::Sum;
}

template <class T>
class StepRunner {
 public:
  StepRunner(MeshState& mesh, const Extents& shape) : mesh_(mesh), m_(mesh.shape()), shape_(shape) {}

  void run(const ReshardStep& st, const T* src, T* dst) {
    const ShardLayout from = mine(st.from), to = mine(st.to);
    switch (st.kind) {
      case StepKind::Local: copy_overlap(src, from, dst, to); break;
      case StepKind::AllReduce:
        all_reduce(mesh_.group(st.axes), src, dst, from.padded_size(), reduce_op_of(st.from.partial));
        break;
      case StepKind::AllGather: all_gather_step(st, from, to, src, dst); break;
      case StepKind::AllToAll: all_to_all_step(st, from, to, src, dst); break;
      case StepKind::ReduceScatter: reduce_scatter_step(st, from, to, src, dst); break;
      case StepKind::Direct: direct_step(st, from, to, src, dst); break;
    }
  }

 private:
  ShardLayout mine(const SpecDesc& s) const { return shard_layout(s, shape_, m_, mesh_.coords()); }
  ShardLayout member(const SpecDesc& s, const std::vector<int>& axes, int g) const {
    return shard_layout(s, shape_, m_, group_member_coords(m_, axes, g, mesh_.coords()));
  }
  int group_size(const std::vector<int>& axes) const {
    int k = 1;
    for (int a : axes) k *= m_.sizes[a];
    return k;
  }

  // Each member's block travels straight into place in mine: where the padded blocks tile the
  // new block, one all-gather (a plain one when the blocks are back to back in memory, else
  // with a datatype that places each block); with uneven padding, one box per member
  // (Alltoallw), valid elements only. No scratch and no unpacking either way.
  void all_gather_step(const ReshardStep& st, const ShardLayout& from, const ShardLayout& to, const T* src, T* dst) {
    const int k = group_size(st.axes), d = st.dim, rank = from.rank;
    if (k == 1) return copy_overlap(src, from, dst, to);  // an axis of size 1: nothing moves
    const Index n = from.padded_size();
    if (n == 0) return;
    MPI_Comm group = mesh_.group(st.axes);
    const bool tiles = to.padded[d] == k * from.padded[d] && member(st.from, st.axes, 0).offset[d] == to.offset[d];
    if (tiles && slowest_dim(to, d)) return all_gather(group, src, n, dst);
    if (slowest_dim(to, d) && to.padded_size() <= std::min<Index>(INT_MAX, collective_chunk_limit())) {
      // Uneven, but each member's block is one run in both buffers.
      const Index slice = to.padded[d] ? to.padded_size() / to.padded[d] : 0;
      std::vector<int> counts(k), displs(k);
      for (int g = 0; g < k; ++g) {
        const ShardLayout l = member(st.from, st.axes, g);
        counts[g] = int(l.valid[d] * slice);
        displs[g] = int(l.valid[d] ? (l.offset[d] - to.offset[d]) * slice : 0);
      }
      return all_gather_counts(group, src, dst, counts, displs);
    }
    if (!fits_datatype(from.padded, rank) || !fits_datatype(to.padded, rank) || n > collective_chunk_limit())
      return all_gather_packed(st, from, to, src, dst);
    if (tiles) {
      BoxType<T> block(rank, to.padded, Extents{}, from.padded, from.padded[d] * slice_stride(to, d));
      return all_gather_placed(group, src, n, dst, block.get());
    }
    BoxExchange<T> boxes(k);
    boxes.send_to_all(from, from);
    for (int g = 0; g < k; ++g) {
      const ShardLayout l = member(st.from, st.axes, g);
      boxes.recv(g, to, l);
    }
    boxes.run(group, src, dst, "all_gather");
  }

  // Past MPI's int-sized datatypes: gather whole padded blocks and copy them into place.
  void all_gather_packed(const ReshardStep& st, const ShardLayout& from, const ShardLayout& to, const T* src, T* dst) {
    const int k = group_size(st.axes);
    const Index n = from.padded_size();
    Scratch<T> all(static_cast<std::size_t>(n) * k);
    all_gather(mesh_.group(st.axes), src, n, all.data());
    for (int g = 0; g < k; ++g) copy_overlap(all.data() + g * n, member(st.from, st.axes, g), dst, to);
  }

  static Index slice_stride(const ShardLayout& l, int d) {
    Index s = 1;
    for (int e = 0; e < d; ++e) s *= l.padded[e];
    return s;
  }

  // Each member gets the box of my block it keeps, straight from my buffer into its own
  // (MPI_Alltoallw with one subarray datatype per peer): no packing on either side.
  void all_to_all_step(const ReshardStep& st, const ShardLayout& from, const ShardLayout& to, const T* src, T* dst) {
    const int k = group_size(st.axes), d2 = st.dim2, rank = from.rank;
    if (k == 1) return copy_overlap(src, from, dst, to);
    if (!fits_datatype(from.padded, rank) || !fits_datatype(to.padded, rank)) return all_to_all_packed(st, from, to, src, dst);
    BoxExchange<T> boxes(k);
    for (int g = 0; g < k; ++g) {
      boxes.send(g, from, overlap_block(from, with_dim_of(from, member(st.to, st.axes, g), d2)));
      boxes.recv(g, to, overlap_block(with_dim_of(member(st.from, st.axes, g), to, d2), to));
    }
    boxes.run(mesh_.group(st.axes), src, dst, "all_to_all");
  }

  void all_to_all_packed(const ReshardStep& st, const ShardLayout& from, const ShardLayout& to, const T* src, T* dst) {
    const int k = group_size(st.axes), d2 = st.dim2;
    const Index chunk = from.padded[d2] ? from.padded_size() / from.padded[d2] * to.padded[d2] : 0;
    Scratch<T> send(static_cast<std::size_t>(chunk) * k), recv(static_cast<std::size_t>(chunk) * k);
    for (int g = 0; g < k; ++g)  // the part of my block that member g keeps along d2
      copy_overlap(src, from, send.data() + g * chunk, with_dim_of(from, member(st.to, st.axes, g), d2));
    all_to_all(mesh_.group(st.axes), send.data(), recv.data(), chunk);
    for (int g = 0; g < k; ++g)  // member g's block along d1, cut to mine along d2
      copy_overlap(recv.data() + g * chunk, with_dim_of(member(st.from, st.axes, g), to, d2), dst, to);
  }

  // Member g's chunk is its rows along the dim with every other dim whole (padding included,
  // reduced harmlessly into padding). Equal chunks back to back in memory go straight from src
  // to dst; uneven chunks back to back go as they are (MPI_Reduce_scatter with counts); others
  // are packed into equal padded chunks (zeroed only where a chunk has padding), since
  // OpenMPI's reduce_scatter_block is much faster than its counted reduce-scatter (70 vs 48 ms
  // for 64 MiB on 2 ranks here).
  void reduce_scatter_step(const ReshardStep& st, const ShardLayout& from, const ShardLayout& to, const T* src,
                           T* dst) {
    const int k = group_size(st.axes), d = st.dim;
    const ReduceOp op = reduce_op_of(st.from.partial);
    MPI_Comm group = mesh_.group(st.axes);
    const Index chunk = to.padded_size();
    const bool from_start = member(st.to, st.axes, 0).offset[d] == from.offset[d];
    if (slowest_dim(from, d) && from_start) {
      if (from.padded[d] == k * to.padded[d]) return reduce_scatter_block(group, src, dst, chunk, op);
      const Index slice = to.padded[d] ? chunk / to.padded[d] : 0;
      std::vector<Index> counts(k);
      Index total = 0;
      for (int g = 0; g < k; ++g) total += counts[g] = member(st.to, st.axes, g).valid[d] * slice;
      if (total <= collective_chunk_limit() && total <= INT_MAX) return reduce_scatter_counts(group, src, dst, counts, op);
    }
    Scratch<T> send(static_cast<std::size_t>(chunk) * k);
    for (int g = 0; g < k; ++g) {
      const ShardLayout l = member(st.to, st.axes, g), ov = overlap_block(from, l);
      T* c = send.data() + g * chunk;
      // What the copy leaves is zeroed: the rows past a short chunk's end, or all of a ragged one.
      bool rows_only = true;
      for (int e = 0; e < from.rank; ++e)
        if (e != d) rows_only &= ov.valid[e] == l.padded[e];
      if (!rows_only) std::fill(c, c + chunk, T(0));
      copy_overlap(src, from, c, l);
      if (rows_only) {
        Extents start{}, rest = l.padded;
        start[d] = ov.valid[d];
        rest[d] = l.padded[d] - ov.valid[d];
        fill_box(c, l.padded, start, rest, from.rank, T(0));
      }
    }
    reduce_scatter_block(group, send.data(), dst, chunk, op);
  }

  void direct_step(const ReshardStep& st, const ShardLayout&, const ShardLayout&, const T* src, T* dst) {
    redistribute<T>(mesh_, st.from, shape_, src, st.to, shape_, dst, Extents{});
  }

  MeshState& mesh_;
  const MeshShape& m_;
  Extents shape_;
};

// Plans are cached per (mesh shape, global shape, specs, element size): repeated reshards in a
// loop plan once.
inline std::shared_ptr<const ReshardPlan> cached_plan(const MeshShape& mesh, const SpecDesc& src, const SpecDesc& dst,
                                                      const Extents& shape, std::size_t element_bytes) {
  using Key = std::tuple<std::string, std::string, std::string, Extents, std::size_t>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const ReshardPlan>> cache;
  Key key{mesh.describe(), src.to_string(mesh), dst.to_string(mesh), shape, element_bytes};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end() && it->second) return it->second;
  if (cache.size() > 4096) cache.clear();
  auto p = std::make_shared<const ReshardPlan>(plan_reshard(src, dst, shape, mesh, element_bytes));
  cache[key] = p;
  return p;
}
inline std::shared_ptr<const ReshardPlan> cached_plan(MeshState& mesh, const SpecDesc& src, const SpecDesc& dst,
                                                      const Extents& shape, std::size_t element_bytes) {
  return cached_plan(mesh.shape(), src, dst, shape, element_bytes);
}

// The seconds and traffic of moving a tensor between two layouts by its cached plan (nothing
// where they are one).
inline Traffic reshard_traffic(const MeshShape& mesh, const SpecDesc& src, const SpecDesc& dst, const Extents& shape,
                               std::size_t element_bytes, int rank = -1) {
  if (src == dst) return {};
  const auto plan = cached_plan(mesh, src, dst, shape, element_bytes);
  return rank < 0 ? plan->traffic : predicted_traffic(*plan, shape, mesh, element_bytes, rank);
}

// dst (laid out for `dst_spec`) = src (laid out for `src_spec`), by the cached plan.
template <class T>
void execute_reshard(MeshState& mesh, const SpecDesc& src_spec, const SpecDesc& dst_spec, const Extents& shape,
                     const T* src, T* dst) {
  auto plan = cached_plan(mesh, src_spec, dst_spec, shape, sizeof(T));
  StepRunner<T> runner(mesh, shape);
  std::unique_ptr<Scratch<T>> held[2];
  const T* cur = src;
  for (std::size_t i = 0; i < plan->steps.size(); ++i) {
    const ReshardStep& st = plan->steps[i];
    T* out = dst;
    if (i + 1 < plan->steps.size()) {
      auto l = shard_layout(st.to, shape, mesh.shape(), mesh.coords());
      held[i % 2] = std::make_unique<Scratch<T>>(static_cast<std::size_t>(l.padded_size()));
      out = held[i % 2]->data();
    }
    runner.run(st, cur, out);
    cur = out;
  }
}

}  // namespace tshard::detail
