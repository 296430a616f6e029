// Direct redistribution between any two layouts, point to point: each rank receives exactly
// the elements it lacks, each from one owner. With a shift and two global shapes it also moves
// windows of a tensor (slice, pad, concat): dst[i] = src[i + shift] wherever both exist.
#pragma once
#include <algorithm>
#include <memory>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/collectives.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/core/box_copy.hpp"
#include "tshard/core/layout_cache.hpp"
#include "tshard/reshard/plan.hpp"

namespace tshard::detail {

// Whether redistribute(from, ..., to, ..., shift) moves any element between ranks: decided from
// global facts alone, alike on every rank (O(P^2) box overlaps).
inline bool redistribute_communicates(const SpecDesc& from, const Extents& from_shape, const SpecDesc& to,
                                      const Extents& to_shape, const Extents& shift, const MeshShape& m) {
  for (int r = 0; r < m.size(); ++r) {
    const ShardLayout want = shifted(shard_layout_of_rank(to, to_shape, m, r), shift);
    for (int s : direct_senders(from, m, r))
      if (s != r && overlap_block(shard_layout_of_rank(from, from_shape, m, s), want).valid_size() > 0) return true;
  }
  return false;
}

// One rank's part in a direct redistribution: the overlaps it sends and receives (peer, box in
// source coordinates). Found once per (mesh, rank, layouts, shift) and cached: a loop of the
// same move costs O(peers) per call, not the O(P) search.
struct DirectPeers {
  ShardLayout mine_from, mine_to;
  std::vector<std::pair<int, ShardLayout>> outgoing, incoming;
  Index send_total = 0, recv_total = 0;
};

inline std::shared_ptr<DirectPeers> find_direct_peers(const MeshShape& m, int me, const SpecDesc& from, const Extents& from_shape,
                                                      const SpecDesc& to, const Extents& to_shape, const Extents& shift) {
  auto d = std::make_shared<DirectPeers>();
  d->mine_from = shard_layout(from, from_shape, m, m.coords_of(me));
  d->mine_to = shifted(shard_layout(to, to_shape, m, m.coords_of(me)), shift);  // in source coordinates
  for (int r = 0; r < m.size(); ++r) {
    if (!m.same_outside(me, r, from.split_axes())) continue;  // me is not among r's senders
    ShardLayout ov = overlap_block(d->mine_from, shifted(shard_layout_of_rank(to, to_shape, m, r), shift));
    if (ov.valid_size()) {
      d->outgoing.emplace_back(r, ov);
      if (r != me) d->send_total += ov.valid_size();
    }
  }
  for (int s : direct_senders(from, m, me)) {
    ShardLayout ov = overlap_block(shard_layout_of_rank(from, from_shape, m, s), d->mine_to);
    if (ov.valid_size()) {
      d->incoming.emplace_back(s, ov);
      if (s != me) d->recv_total += ov.valid_size();
    }
  }
  return d;
}

inline std::shared_ptr<const DirectPeers> direct_peers(const MeshState& mesh, const SpecDesc& from, const Extents& from_shape,
                                                       const SpecDesc& to, const Extents& to_shape, const Extents& shift) {
  const MeshShape& m = mesh.shape();
  const int me = mesh.rank();
  LayoutKey key(m);
  key.rank = me;
  key.from = from;
  key.from_shape = from_shape;
  key.to = to;
  key.to_shape = to_shape;
  key.shift = shift;
  return layout_cache<DirectPeers, std::shared_ptr<const DirectPeers>>().answer(key, [&] {
    return std::shared_ptr<const DirectPeers>(find_direct_peers(m, me, from, from_shape, to, to_shape, shift));
  });
}

// dst (laid out for `to` over `to_shape`) gets src (laid out for `from`, a plain spec, over
// `from_shape`) at dst index i = src index i + shift; dst elements with no source are untouched.
template <class T>
void redistribute(MeshState& mesh, const SpecDesc& from, const Extents& from_shape, const T* src, const SpecDesc& to,
                  const Extents& to_shape, T* dst, const Extents& shift) {
  const MeshShape& m = mesh.shape();
  const int me = mesh.rank();
  const auto peers = direct_peers(mesh, from, from_shape, to, to_shape, shift);
  const ShardLayout& mine_from = peers->mine_from;
  const ShardLayout& mine_to = peers->mine_to;
  const auto& outgoing = peers->outgoing;
  const auto& incoming = peers->incoming;
  const Index send_total = peers->send_total, recv_total = peers->recv_total;
  // Every message is a box of the source or destination buffer, described by a datatype:
  // nothing is packed (past MPI's int-sized datatypes, boxes are packed into scratch).
  const ShardLayout dst_layout = shard_layout(to, to_shape, m, mesh.coords());
  const bool typed = fits_datatype(mine_from.padded, from.rank) && fits_datatype(dst_layout.padded, to.rank);
  Scratch<T> sbuf(typed ? 0 : static_cast<std::size_t>(send_total)), rbuf(typed ? 0 : static_cast<std::size_t>(recv_total));
  std::vector<BoxType<T>> types;
  types.reserve(outgoing.size() + incoming.size());
  std::vector<Message<const T>> sends;
  std::vector<Message<T>> recvs;
  auto box_of = [&](const ShardLayout& block, const ShardLayout& ov) {
    types.push_back(box_type<T>(block, ov));
    return types.back().get();
  };
  Index off = 0;
  for (auto& [r, ov] : outgoing) {
    if (r == me) {
      copy_overlap(src, mine_from, dst, mine_to);
    } else if (typed) {
      sends.push_back({r, src, ov.valid_size(), box_of(mine_from, ov)});
    } else {
      copy_overlap(src, mine_from, sbuf.data() + off, ov);
      sends.push_back({r, sbuf.data() + off, ov.valid_size()});
      off += ov.valid_size();
    }
  }
  off = 0;
  std::vector<Index> roff;
  for (auto& [s, ov] : incoming) {
    roff.push_back(off);
    if (s == me) continue;
    if (typed) {
      recvs.push_back({s, dst, ov.valid_size(), box_of(mine_to, ov)});
    } else {
      recvs.push_back({s, rbuf.data() + off, ov.valid_size()});
      off += ov.valid_size();
    }
  }
  const bool permute = sends.size() <= 1 && recvs.size() <= 1;
  exchange<T>(mesh.comm(), sends, recvs, permute ? "permute" : "all_to_all_v");
  if (!typed)
    for (std::size_t i = 0; i < incoming.size(); ++i)
      if (incoming[i].first != me) copy_overlap(rbuf.data() + roff[i], incoming[i].second, dst, mine_to);
}

}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void redistribute<T>(MeshState&, const SpecDesc&, const Extents&, \
    const T*, const SpecDesc&, const Extents&, T*, const Extents&))
TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
