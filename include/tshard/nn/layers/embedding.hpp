// Embedding<T, Mesh, TableSpec>: a table [V, D] of spec TableSpec as a module; embedding(table,
// ids) (nn/functional/embedding.hpp) looks rows up, the vocabulary split or not.
#pragma once
#include <cstdint>

#include "tshard/nn/functional/embedding.hpp"
#include "tshard/nn/init.hpp"
#include "tshard/nn/module.hpp"

namespace tshard::nn {

template <class T, class M, class TableSpec = Spec<S<"model">, R>>
class Embedding : public Module {
  static_assert(tshard::detail::is_spec<TableSpec>::value && TableSpec::rank == 2,
                "tshard: Embedding's table spec is a rank-2 tshard::Spec<vocab, features>");
  static_assert(is_real_floating_v<T>, "tshard: Embedding's element type is float, double or bfloat16");
  static_assert(tshard::detail::specs_on_mesh<M, TableSpec>(),
                "tshard: Embedding's specs split over a mesh axis this mesh lacks (the default splits the vocabulary over \"model\")"
                ": give the mesh that axis (of size 1 where nothing splits over it) or pass specs of its own axes");

 public:
  using Table = ShardedTensor<T, M, TableSpec>;

  // Rows uniform in [-1, 1) from (seed, global index): the same table on every mesh.
  Embedding(const M& mesh, Eigen::Index vocab, Eigen::Index features, std::uint64_t seed)
      : weight_(own_parameter("weight", detail::uniform_init<T, TableSpec>(mesh, {vocab, features}, seed, 1.0))) {
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
    return detail::embedding_recorded(weight_, ids_in);
  }

 private:
  Table& weight_;  // in the module's parameter slot
};

}  // namespace tshard::nn
