// Embedding<T, Mesh, TableSpec>: rows of a table [V, D] picked by integer ids of any rank. The
// vocabulary may be split (Megatron's vocab-parallel embedding): each rank looks up the ids in
// its block and writes zeros elsewhere, a partial sum over V's axes resolved where it is used,
// so nothing of the table moves. Backward is a scatter-add into this rank's rows.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tshard/nn/init.hpp"
#include "tshard/nn/module.hpp"
#include "tshard/ops/take.hpp"

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
  tshard::detail::for_each_valid_run(tshard::detail::layout_of(ids), [&](tshard::detail::Index off, tshard::detail::Index n) {
    for (tshard::detail::Index r = off; r < off + n; ++r) {
      const tshard::detail::Index v = tshard::detail::Index(id[r]) - tl.offset[0];
      if (v < 0 || v >= tl.valid[0]) continue;
      for (tshard::detail::Index d = 0; d < tl.valid[1]; ++d) acc[v + tl.padded[0] * d] += gd[r + rows * d];
    }
  });
  tshard::detail::SpecDesc desc = Table::spec_desc;
  if (Ids::spec_desc.split_axes()) {
    desc.partial = tshard::detail::PartialKind::Sum;
    desc.partial_axes = Ids::spec_desc.split_axes();
  }
  tshard::detail::add_cotangent(*node, desc, std::move(buffer));
}

}  // namespace detail

template <class T, class M, class TableSpec = Spec<S<"model">, R>>
class Embedding : public Module {
  static_assert(tshard::detail::is_spec<TableSpec>::value && TableSpec::rank == 2,
                "tshard: Embedding's table spec is a rank-2 tshard::Spec<vocab, features>");
  static_assert(is_real_floating_v<T>, "tshard: Embedding's element type is float, double or bfloat16");
  static constexpr tshard::detail::SpecDesc table_desc = tshard::detail::make_desc<TableSpec, NoPartial>(M::axis_names);

 public:
  using Table = ShardedTensor<T, M, TableSpec>;

  // Rows uniform in [-1, 1) from (seed, global index): the same table on every mesh.
  Embedding(const M& mesh, Eigen::Index vocab, Eigen::Index features, std::uint64_t seed)
      : mesh_(mesh), weight_(own_parameter("weight", detail::uniform_init<T, TableSpec>(mesh, {vocab, features}, seed, 1.0))) {
    streams_parameters_ = true;  // every use is bracketed by use()
  }

  Table& weight() { return weight_; }
  // The gradient (complete: an owning optimizer finishes its data-parallel sum first).
  Table& weight_grad() { return gradient_of(weight_); }

  // ids [...] (int32 or int64) -> [..., D], split like the ids and like the table's D, partial
  // over the axes splitting V, forward only: under ts::ad one node whose rule adds the output's
  // cotangent rows into the table's (a partial sum over the axes splitting the ids, resolved
  // where needed: the data-parallel sum).
  template <ShardedTensorType Ids>
  auto operator()(const Ids& ids_in) {
    tshard::detail::OperatorScope scope("embedding");
    auto in_use = use();
    const auto& ids = tshard::detail::resolved(ids_in, "embedding");
    auto out = lookup(ids);
    if (tshard::detail::recording(weight_))
      tshard::detail::record(out, detail::EmbeddingRows{}, tshard::detail::tape_shape(weight_),
                             tshard::detail::tape_value(ids));
    return out;
  }

 private:
  // ids [...] -> [..., D], split like the ids and like the table's D, partial over V's axes.
  template <class Ids>
  auto lookup(const Ids& ids) const {
    static_assert(tshard::detail::is_id_tensor_v<Ids>, "tshard: Embedding's ids are an int32 or int64 tensor");
    static_assert(std::is_same_v<typename Ids::MeshT, M>, "tshard: Embedding's ids live on the table's mesh type");
    static_assert((Ids::spec_desc.split_axes() & table_desc.split_axes()) == 0,
                  "tshard: Embedding's ids may not be split over an axis that splits the table");
    using Out = ShardedTensor<T, M, typename detail::append_dim<typename Ids::SpecType, tshard::detail::dim_at_t<TableSpec, 1>>::type,
                              typename tshard::detail::partial_of<ReduceOp::Sum,
                                  typename tshard::detail::dim_axes<tshard::detail::dim_at_t<TableSpec, 0>>::type>::type>;
    tshard::detail::require_same_mesh(weight_, ids, "embedding");
    check(ids);
    std::array<Eigen::Index, Ids::rank + 1> shape{};
    for (int d = 0; d < Ids::rank; ++d) shape[d] = tshard::detail::extents_of(ids)[d];
    shape[Ids::rank] = tshard::detail::extents_of(weight_)[1];
    Out out(mesh_, shape);
    T* o = out.data();
    std::fill(o, o + out.padded_size(), T(0));
    const T* table = weight_.data();
    const auto& tl = tshard::detail::layout_of(weight_);
    const tshard::detail::Index rows = ids.padded_size();
    for_each_id(ids, [&](tshard::detail::Index r, tshard::detail::Index v) {
      for (tshard::detail::Index d = 0; d < tl.valid[1]; ++d) o[r + rows * d] = table[v + tl.padded[0] * d];
    });
    return out;
  }

  template <class Ids>
  void check(const Ids& ids) const {
    using I = typename Ids::Scalar;
    std::vector<I> valid;
    const I* d = ids.data();
    tshard::detail::for_each_valid_run(
        tshard::detail::layout_of(ids),
        [&](tshard::detail::Index off, tshard::detail::Index n) { valid.insert(valid.end(), d + off, d + off + n); });
    tshard::detail::check_ids(*tshard::detail::state_of(mesh_), valid.data(), tshard::detail::Index(valid.size()),
                              Ids::spec_desc.split_axes() != 0, tshard::detail::extents_of(weight_)[0], "embedding",
                              weight_.describe(), ids.describe());
  }

  // f(r, v) for each valid id position r (in the ids' padded buffer) whose id is row v of this
  // rank's block of the table.
  template <class Ids, class F>
  void for_each_id(const Ids& ids, F&& f) const {
    const auto& tl = tshard::detail::layout_of(weight_);
    const auto* d = ids.data();
    tshard::detail::for_each_valid_run(tshard::detail::layout_of(ids),
                                       [&](tshard::detail::Index off, tshard::detail::Index n) {
                                         for (tshard::detail::Index r = off; r < off + n; ++r) {
                                           const tshard::detail::Index v = tshard::detail::Index(d[r]) - tl.offset[0];
                                           if (v >= 0 && v < tl.valid[0]) f(r, v);
                                         }
                                       });
  }

  M mesh_;
  Table& weight_;  // in the module's parameter slot
};

}  // namespace tshard::nn
