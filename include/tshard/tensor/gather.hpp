// Assembling the global value from shards, on every rank or on one root: one all-gather over
// the group of split axes (ranks differing only on unsplit axes hold the same data), after
// resolving a partial with an all-reduce over its axes.
#pragma once
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/collectives.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/core/box_copy.hpp"
#include "tshard/core/shard.hpp"

namespace tshard::detail {

// A partial's local values resolved in place (all-reduce over its axes).
template <class T>
void resolve_partial_in_place(MeshState& mesh, const SpecDesc& spec, T* data, Index n) {
  if (spec.partial == PartialKind::None) return;
  all_reduce(mesh.group_of_mask(spec.partial_axes), data, data, n, reduce_op_of(spec.partial));
}

// out (global shape, column-major) = the global value, on every rank.
template <class T>
void gather_to_all(MeshState& mesh, const SpecDesc& spec, const Extents& shape, const T* local, T* out) {
  const MeshShape& m = mesh.shape();
  const ShardLayout mine = shard_layout(spec, shape, m, mesh.coords());
  const Index n = mine.padded_size();
  const T* src = local;
  Scratch<T> resolved(spec.partial != PartialKind::None ? static_cast<std::size_t>(n) : 0);
  if (spec.partial != PartialKind::None) {
    std::copy(local, local + n, resolved.data());
    resolve_partial_in_place(mesh, spec, resolved.data(), n);
    src = resolved.data();
  }
  const std::vector<int> axes = axes_of_mask(spec.split_axes(), m.axes());
  const int members = int(split_parts([&] {
    DimSplit s;
    for (int a : axes) s.push(a);
    return s;
  }(), m));
  const Extents zero{};
  if (members > 1 && fits_datatype(shape, spec.rank) && fits_datatype(mine.padded, spec.rank)) {
    // Every member's valid block straight into its place in out: one box datatype each.
    ShardLayout whole;  // the global tensor as one block
    whole.rank = spec.rank;
    whole.padded = whole.valid = shape;
    BoxExchange<T> boxes(members);
    boxes.send_to_all(mine, mine);
    for (int g = 0; g < members; ++g) {
      const ShardLayout l = shard_layout(spec, shape, m, group_member_coords(m, axes, g, mesh.coords()));
      boxes.recv(g, whole, l);
    }
    boxes.run(mesh.group(axes), src, out, "all_gather");
    return;
  }
  // One member, or past MPI's int-sized datatypes: whole padded blocks, then copies.
  Scratch<T> all(static_cast<std::size_t>(n) * members);
  all_gather(mesh.group(axes), src, n, all.data());
  for (int g = 0; g < members; ++g) {
    const ShardLayout l = shard_layout(spec, shape, m, group_member_coords(m, axes, g, mesh.coords()));
    copy_box(all.data() + g * n, l.padded, zero, out, shape, l.offset, l.valid, spec.rank);
  }
}

// out = the global value on mesh rank `root`; other ranks' `out` is untouched.
template <class T>
void gather_to_root(MeshState& mesh, const SpecDesc& spec, const Extents& shape, const T* local, T* out, int root) {
  const MeshShape& m = mesh.shape();
  const ShardLayout mine = shard_layout(spec, shape, m, mesh.coords());
  const Index n = mine.padded_size();
  Scratch<T> resolved(spec.partial != PartialKind::None ? static_cast<std::size_t>(n) : 0);
  if (spec.partial != PartialKind::None) {
    std::copy(local, local + n, resolved.data());
    resolve_partial_in_place(mesh, spec, resolved.data(), n);
    local = resolved.data();
  }
  // Senders: the ranks whose coordinates on every unsplit axis are 0; each sends its valid block.
  auto is_sender = [&](const std::array<int, kMaxAxes>& c) { return m.first_outside(c, spec.split_axes()); };
  const Extents zero{};
  std::vector<Message<const T>> sends;
  std::vector<Message<T>> recvs;
  Scratch<T> packed(is_sender(mesh.coords()) ? static_cast<std::size_t>(mine.valid_size()) : 0);
  if (is_sender(mesh.coords())) {
    copy_box(local, mine.padded, zero, packed.data(), mine.valid, zero, mine.valid, spec.rank);
    sends.push_back({root, packed.data(), mine.valid_size()});
  }
  std::vector<std::pair<int, Index>> blocks;  // (rank, offset in `incoming`)
  Index total = 0;
  if (mesh.rank() == root)
    for (int r = 0; r < m.size(); ++r)
      if (is_sender(m.coords_of(r))) {
        blocks.emplace_back(r, total);
        total += shard_layout_of_rank(spec, shape, m, r).valid_size();
      }
  Scratch<T> incoming(static_cast<std::size_t>(total));
  for (auto& [r, off] : blocks)
    recvs.push_back({r, incoming.data() + off, shard_layout_of_rank(spec, shape, m, r).valid_size()});
  exchange<T>(mesh.comm(), sends, recvs, "gather_v");
  for (auto& [r, off] : blocks) {
    const ShardLayout l = shard_layout_of_rank(spec, shape, m, r);
    copy_box(incoming.data() + off, l.valid, zero, out, shape, l.offset, l.valid, spec.rank);
  }
}

}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void gather_to_all<T>(MeshState&, const SpecDesc&, \
    const Extents&, const T*, T*))
TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
