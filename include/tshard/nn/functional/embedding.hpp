// embedding(table, ids): rows of a table [V, D] picked by integer ids of any rank, as
// torch.nn.functional.embedding. The vocabulary may be split (Megatron's vocab-parallel
// embedding): each rank looks up the ids in its block and writes zeros elsewhere, a partial sum
// over V's axes resolved where it is used, so nothing of the table moves. Its gradient is a
// scatter-add into this rank's rows. An id outside [0, V) is an IndexError on every rank.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tshard/ad/cotangent.hpp"
#include "tshard/core/simulated_timing.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/ops/take.hpp"
#include "tshard/tensor/tape.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::nn {
namespace detail {

template <class SpecT, class D>
struct append_dim;
template <class... Ds, class D>
struct append_dim<Spec<Ds...>, D> {
  using type = Spec<Ds..., D>;
};

// The tag of an embedding lookup on the tape (ts::ad), and its rule: the output's cotangent rows
// added into the table's rows at the ids this rank holds, a partial sum over the axes that split
// the ids (the data-parallel sum, left to the optimizer or resolved when read).
struct EmbeddingRows {};

template <class Out, class T, class Table, class Ids>
void vjp(EmbeddingRows, std::type_identity<Out>, tshard::detail::TypedGradNode<T>& self, const Table& table,
         const Ids& ids) {
  auto* node = tshard::detail::node_of(table);
  if (!node) return;
  const auto g = tshard::detail::cotangent(std::type_identity<Out>{}, self, table.mesh());
  const auto& tl = tshard::detail::layout_of(table);
  auto buffer = tshard::detail::pooled_array<T>(static_cast<std::size_t>(std::max<tshard::detail::Index>(tl.padded_size(), 1)));
  T* acc = buffer.get();
  std::fill(acc, acc + tl.padded_size(), T(0));
  const T* gd = g.data();
  const auto* id = ids.data();
  const tshard::detail::Index rows = ids.padded_size();
  tshard::detail::sampled("embedding rows' gradient", [&] {
    tshard::detail::for_each_valid_run(tshard::detail::layout_of(ids), [&](tshard::detail::Index off, tshard::detail::Index n) {
      for (tshard::detail::Index r = off; r < off + n; ++r) {
        const tshard::detail::Index v = tshard::detail::Index(id[r]) - tl.offset[0];
        if (v < 0 || v >= tl.valid[0]) continue;
        for (tshard::detail::Index d = 0; d < tl.valid[1]; ++d) acc[v + tl.padded[0] * d] += gd[r + rows * d];
      }
    });
  }, tl, tshard::detail::layout_of(ids));
  tshard::detail::SpecDesc desc = Table::spec_desc;
  if (Ids::spec_desc.split_axes()) {
    desc.partial = tshard::detail::PartialKind::Sum;
    desc.partial_axes = Ids::spec_desc.split_axes();
  }
  tshard::detail::add_cotangent(*node, desc, std::move(buffer));
}

// f(r, v) for each valid id position r (in the ids' padded buffer) whose id is row v of this
// rank's block of the table.
template <class Table, class Ids, class F>
void for_each_id(const Table& table, const Ids& ids, F&& f) {
  const auto& tl = tshard::detail::layout_of(table);
  const auto* d = ids.data();
  tshard::detail::for_each_valid_run(tshard::detail::layout_of(ids), [&](tshard::detail::Index off, tshard::detail::Index n) {
    for (tshard::detail::Index r = off; r < off + n; ++r) {
      const tshard::detail::Index v = tshard::detail::Index(d[r]) - tl.offset[0];
      if (v >= 0 && v < tl.valid[0]) f(r, v);
    }
  });
}

// The lookup: ids [...] -> [..., D], split like the ids and like the table's D, partial over V's
// axes (zeros where another rank's block holds the row).
template <class Table, class Ids>
auto embedding_lookup(const Table& table, const Ids& ids) {
  using T = typename Table::Scalar;
  using M = typename Table::MeshT;
  using TableSpec = typename Table::SpecType;
  static_assert(tshard::detail::is_id_tensor_v<Ids>, "tshard: Embedding's ids are an int32 or int64 tensor");
  static_assert(std::is_same_v<typename Ids::MeshT, M>, "tshard: Embedding's ids live on the table's mesh type");
  static_assert((Ids::spec_desc.split_axes() & Table::spec_desc.split_axes()) == 0,
                "tshard: Embedding's ids may not be split over an axis that splits the table");
  using Out = ShardedTensor<T, M, typename append_dim<typename Ids::SpecType, tshard::detail::dim_at_t<TableSpec, 1>>::type,
                            typename tshard::detail::partial_of<ReduceOp::Sum,
                                typename tshard::detail::dim_axes<tshard::detail::dim_at_t<TableSpec, 0>>::type>::type>;
  tshard::detail::require_same_mesh(table, ids, "embedding");
  {  // every id in [0, V): an IndexError on every rank otherwise
    using I = typename Ids::Scalar;
    std::vector<I> valid;
    const I* d = ids.data();
    tshard::detail::for_each_valid_run(
        tshard::detail::layout_of(ids),
        [&](tshard::detail::Index off, tshard::detail::Index n) { valid.insert(valid.end(), d + off, d + off + n); });
    tshard::detail::check_ids(*tshard::detail::state_of(table.mesh()), valid.data(), tshard::detail::Index(valid.size()),
                              Ids::spec_desc.split_axes() != 0, tshard::detail::extents_of(table)[0], "embedding",
                              table.describe(), ids.describe());
  }
  std::array<Eigen::Index, Ids::rank + 1> shape{};
  for (int d = 0; d < Ids::rank; ++d) shape[d] = tshard::detail::extents_of(ids)[d];
  shape[Ids::rank] = tshard::detail::extents_of(table)[1];
  Out out(table.mesh(), shape);
  T* o = out.data();
  std::fill(o, o + out.padded_size(), T(0));
  const T* t = table.data();
  const auto& tl = tshard::detail::layout_of(table);
  const tshard::detail::Index rows = ids.padded_size();
  tshard::detail::sampled("embedding lookup", [&] {
    for_each_id(table, ids, [&](tshard::detail::Index r, tshard::detail::Index v) {
      for (tshard::detail::Index d = 0; d < tl.valid[1]; ++d) o[r + rows * d] = t[v + tl.padded[0] * d];
    });
  }, tl, tshard::detail::layout_of(ids));
  return out;
}

// The lookup, recorded under a gradient.
template <class Table, class Ids>
auto embedding_recorded(const Table& table, const Ids& ids_in) {
  const auto& ids = tshard::detail::resolved(ids_in, "embedding");
  auto out = embedding_lookup(table, ids);
  if (tshard::detail::recording(table))
    tshard::detail::record(out, EmbeddingRows{}, tshard::detail::tape_shape(table), tshard::detail::tape_value(ids));
  return out;
}

}  // namespace detail

// ids [...] (int32 or int64) -> [..., D], split like the ids and like the table's D, partial over
// the axes splitting V. Under ts::ad one node whose rule adds the output's cotangent rows into the
// table's (a partial sum over the axes splitting the ids, resolved where needed: the
// data-parallel sum).
template <class Table, ShardedTensorType Ids>
auto embedding(const Table& table, const Ids& ids) {
  static_assert(tshard::detail::is_sharded_tensor<Table>::value && Table::rank == 2 && !Table::is_partial,
                "tshard: embedding's table is a plain rank-2 ShardedTensor [V, D]");
  tshard::detail::OperatorScope scope("embedding");
  return detail::embedding_recorded(table, ids);
}

}  // namespace tshard::nn
