// take<Axis>(table, ids): rows of a table picked by integer ids (an embedding lookup), and its
// backward scatter_add. Where the table's Axis is split, each rank looks up only the ids that
// fall in its block and writes zeros elsewhere: a partial sum over the split's axes, resolved
// lazily (GSPMD's handling of gather, section 3.6). Nothing of the table moves.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "tshard/comm/collectives.hpp"
#include "tshard/core/spec_algebra.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {
namespace detail {

template <class SpecT, int I, class D, class Seq = std::make_index_sequence<std::size_t(SpecT::rank)>>
struct replace_dim;
template <class SpecT, int I, class D, std::size_t... K>
struct replace_dim<SpecT, I, D, std::index_sequence<K...>> {
  using type = Spec<std::conditional_t<int(K) == I, D, dim_at_t<SpecT, int(K)>>...>;
};

// The specs of a lookup: ids keep their split unless it names an axis of the table (then they
// are replicated); the output is the table's spec with Axis replaced by the ids' dim, partial
// over the axes that split the table's Axis.
template <class TableSpec, class IdsSpec, int Axis, class M>
struct take_specs {
  static constexpr SpecDesc table = make_desc<TableSpec, NoPartial>(M::axis_names);
  static constexpr SpecDesc ids = make_desc<IdsSpec, NoPartial>(M::axis_names);
  static constexpr bool keep_ids_split = (ids.dims[0].mask() & table.split_axes()) == 0;
  using ids_dim = std::conditional_t<keep_ids_split, dim_at_t<IdsSpec, 0>, R>;
  using ids_spec = Spec<ids_dim>;
  using out_spec = typename replace_dim<TableSpec, Axis, ids_dim>::type;
  using partial = typename partial_of<ReduceOp::Sum, typename dim_axes<dim_at_t<TableSpec, Axis>>::type>::type;
};

// A padded block seen as [inner, axis, outer] around one dim.
struct AxisView {
  Index inner = 1, extent = 1, outer = 1;
};
inline AxisView axis_view(const Extents& padded, int rank, int axis) {
  AxisView v;
  for (int d = 0; d < axis; ++d) v.inner *= padded[d];
  v.extent = padded[axis];
  for (int d = axis + 1; d < rank; ++d) v.outer *= padded[d];
  return v;
}

// IndexError on every rank where an id lies outside [0, extent): one small all-reduce of the
// ids' range where they are split, none where every rank holds them all.
template <class I>
void check_ids(MeshState& mesh, const I* ids, Index count, bool split, Index extent, const char* op,
               Text table, Text idsd) {
  std::array<std::int64_t, 2> range{std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::min()};
  for (Index n = 0; n < count; ++n) {
    range[0] = std::max<std::int64_t>(range[0], -std::int64_t(ids[n]));
    range[1] = std::max<std::int64_t>(range[1], std::int64_t(ids[n]));
  }
  if (split) {
    std::array<std::int64_t, 2> all{};
    all_reduce(mesh.comm(), range.data(), all.data(), 2, ReduceOp::Max);
    range = all;
  }
  if (range[1] == std::numeric_limits<std::int64_t>::min()) return;  // no ids at all
  if (-range[0] < 0 || range[1] >= extent)
    throw IndexError(std::string("tshard::") + op + ": ids range over [" + std::to_string(-range[0]) + ", " +
                     std::to_string(range[1]) + "], outside [0, " + std::to_string(extent) + "): table is " + table.str() +
                     ", ids are " + idsd.str());
}

// out[i, n, o] = table[i, ids[n] - offset, o] where ids[n] is in this rank's block, else 0
// (blocks: table (padded tp), out (padded op); ids aligned with out's Axis).
template <class T, class I>
void take_kernel(const T* table, const ShardLayout& tl, int axis, const I* ids, const ShardLayout& il, T* out,
                 const ShardLayout& ol) {
  const AxisView t = axis_view(tl.padded, tl.rank, axis), o = axis_view(ol.padded, ol.rank, axis);
  const Index lo = tl.offset[axis], hi = lo + tl.valid[axis];
  std::fill(out, out + ol.padded_size(), T(0));
  for (Index n = 0; n < il.valid[0]; ++n) {
    const Index id = Index(ids[n]);
    if (id < lo || id >= hi) continue;
    for (Index q = 0; q < o.outer; ++q) {
      const T* src = table + (q * t.extent + (id - lo)) * t.inner;
      std::copy(src, src + t.inner, out + (q * o.extent + n) * o.inner);
    }
  }
}

// grad[i, ids[n] - offset, o] += rows[i, n, o] for the ids in this rank's block.
template <class T, class I>
void scatter_add_kernel(T* grad, const ShardLayout& gl, int axis, const I* ids, const ShardLayout& il, const T* rows,
                        const ShardLayout& rl) {
  const AxisView g = axis_view(gl.padded, gl.rank, axis), r = axis_view(rl.padded, rl.rank, axis);
  const Index lo = gl.offset[axis], hi = lo + gl.valid[axis];
  for (Index n = 0; n < il.valid[0]; ++n) {
    const Index id = Index(ids[n]);
    if (id < lo || id >= hi) continue;
    for (Index q = 0; q < g.outer; ++q) {
      T* dst = grad + (q * g.extent + (id - lo)) * g.inner;
      const T* src = rows + (q * r.extent + n) * r.inner;
      for (Index i = 0; i < g.inner; ++i) dst[i] += src[i];
    }
  }
}

template <class X>
inline constexpr bool is_id_tensor_v = std::is_same_v<typename X::Scalar, std::int32_t> || std::is_same_v<typename X::Scalar, std::int64_t>;

}  // namespace detail

// Rows of `table` along Axis picked by `ids` (int32 or int64, rank 1, any spec): for a table
// [V, D] and ids [N], take<0>(table, ids) is [N, D] with out(n, :) = table(ids(n), :), split
// like the ids along N and like the table along D; partial over the axes splitting V. An id
// outside [0, V) is an IndexError on every rank.
namespace detail::grad {  // the tag of take on the tape; its rule (a scatter_add) is in ad/
template <int Axis>
struct Take {};
}  // namespace detail::grad

template <int Axis, ShardedTensorType Table, ShardedTensorType Ids>
auto take(const Table& table_in, const Ids& ids_in) {
  static_assert(detail::dims_valid<Table::rank, Axis>(), "tshard: take's axis must be less than the table's rank");
  static_assert(Ids::rank == 1 && detail::is_id_tensor_v<Ids>, "tshard: take's ids are a rank-1 int32 or int64 tensor");
  static_assert(std::is_same_v<typename Table::MeshT, typename Ids::MeshT>, "tshard: take's tensors live on one mesh type");
  if constexpr (!detail::dims_valid<Table::rank, Axis>() || Ids::rank != 1 || !detail::is_id_tensor_v<Ids> ||
                !std::is_same_v<typename Table::MeshT, typename Ids::MeshT>) {
    return detail::refused<Table>();
  } else {
    using T = typename Table::Scalar;
    using M = typename Table::MeshT;
    using S = detail::take_specs<typename Table::SpecType, typename Ids::SpecType, Axis, M>;
    using Out = ShardedTensor<T, M, typename S::out_spec, typename S::partial>;
    detail::OperatorScope scope("take");
    const auto& table = detail::resolved(table_in, "take");
    const auto& ids = detail::resolved(ids_in, "take");
    detail::require_same_mesh(table, ids, "take");
    auto& mesh = *detail::state_of(table.mesh());
    constexpr detail::SpecDesc want_ids = detail::make_desc<typename S::ids_spec, NoPartial>(M::axis_names);
    const auto al = detail::implicit_reshard(mesh, ids.spec_desc, want_ids, detail::extents_of(ids), ids.data(), "take");
    const auto il = detail::shard_layout(want_ids, detail::extents_of(ids), mesh.shape(), mesh.coords());
    detail::check_ids(mesh, al.data, il.valid[0], want_ids.dims[0].count > 0, detail::extents_of(table)[Axis], "take",
                      [&] { return table.describe(); }, [&] { return ids.describe(); });
    auto shape = table.global_shape();
    shape[Axis] = detail::extents_of(ids)[0];
    Out out(table.mesh(), shape);
    detail::take_kernel<T>(table.data(), detail::layout_of(table), Axis, al.data, il, out.data(), detail::layout_of(out));
    if (detail::recording(table)) detail::record(out, detail::grad::Take<Axis>{}, detail::tape_shape(table), detail::tape_value(ids));
    return out;
  }
}

// The backward of take: grad(ids(n), :) += rows(n, :) (for Axis 0), with repeated ids adding
// up. grad keeps its spec and buffer; rows [.., N, ..] may have any spec (aligned by an
// implicit reshard). Contributions of ranks holding different ids are summed with one
// all-reduce over the ids' axes (none where the ids are replicated).
template <int Axis, class T, class M, class SG, ShardedTensorType Ids, ShardedTensorType Rows>
ShardedTensor<T, M, SG>& scatter_add(ShardedTensor<T, M, SG>& grad, const Ids& ids_in, const Rows& rows_in) {
  static_assert(detail::dims_valid<SG::rank, Axis>(), "tshard: scatter_add's axis must be less than the table's rank");
  static_assert(Ids::rank == 1 && detail::is_id_tensor_v<Ids>, "tshard: scatter_add's ids are a rank-1 int32 or int64 tensor");
  static_assert(Rows::rank == SG::rank && std::is_same_v<typename Rows::Scalar, T>,
                "tshard: scatter_add's rows have the table's rank and element type");
  using S = detail::take_specs<SG, typename Ids::SpecType, Axis, M>;
  using G = ShardedTensor<T, M, SG>;
  detail::OperatorScope scope("scatter_add");
  detail::refuse_tracked("scatter_add", "it is take's transpose, a kernel of gradients: differentiate take instead",
                         grad, rows_in);
  const auto& ids = detail::resolved(ids_in, "scatter_add");
  const auto& rows = detail::resolved(rows_in, "scatter_add");
  detail::require_same_mesh(grad, ids, "scatter_add");
  detail::require_same_mesh(grad, rows, "scatter_add");
  auto expected = grad.global_shape();
  expected[Axis] = detail::extents_of(ids)[0];
  if (rows.global_shape() != expected)
    throw ShapeError("tshard::scatter_add: rows are " + rows.describe() + ", expected " +
                     detail::shape_to_string(detail::to_extents(expected), SG::rank) + " for ids " + ids.describe() +
                     " into " + grad.describe());
  auto& mesh = *detail::state_of(grad.mesh());
  constexpr detail::SpecDesc want_ids = detail::make_desc<typename S::ids_spec, NoPartial>(M::axis_names);
  constexpr detail::SpecDesc want_rows = detail::make_desc<typename S::out_spec, NoPartial>(M::axis_names);
  const auto ai =
      detail::implicit_reshard(mesh, ids.spec_desc, want_ids, detail::extents_of(ids), ids.data(), "scatter_add");
  const auto ar =
      detail::implicit_reshard(mesh, rows.spec_desc, want_rows, detail::extents_of(rows), rows.data(), "scatter_add");
  const auto il = detail::shard_layout(want_ids, detail::extents_of(ids), mesh.shape(), mesh.coords());
  const auto rl = detail::shard_layout(want_rows, detail::extents_of(rows), mesh.shape(), mesh.coords());
  detail::check_ids(mesh, ai.data, il.valid[0], want_ids.dims[0].count > 0, detail::extents_of(grad)[Axis],
                    "scatter_add", [&] { return grad.describe(); }, [&] { return ids.describe(); });
  if (want_ids.dims[0].count == 0) {  // every rank holds every id: add straight into grad
    detail::scatter_add_kernel<T>(grad.data(), detail::layout_of(grad), Axis, ai.data, il, ar.data, rl);
    return grad;
  }
  // Ranks with other ids add into the same rows: a partial sum over the ids' axes, resolved.
  const auto& gl = detail::layout_of(grad);
  detail::Scratch<T> part(static_cast<std::size_t>(gl.padded_size()));
  std::fill(part.data(), part.data() + gl.padded_size(), T(0));
  detail::scatter_add_kernel<T>(part.data(), gl, Axis, ai.data, il, ar.data, rl);
  detail::SpecDesc partial = G::spec_desc;
  partial.partial = detail::PartialKind::Sum;
  partial.partial_axes = want_ids.dims[0].mask();
  const auto summed =
      detail::implicit_reshard(mesh, partial, G::spec_desc, detail::extents_of(grad), part.data(), "scatter_add");
  T* g = grad.data();
  for (detail::Index i = 0; i < gl.padded_size(); ++i) g[i] += summed.data[i];
  return grad;
}

}  // namespace tshard
