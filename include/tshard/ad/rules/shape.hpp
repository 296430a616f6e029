// Vector-Jacobian products of the operators that move data without arithmetic: reshard (the
// cotangent goes back unresolved, so an all-gather's transpose is a reduce-scatter where the
// cotangent is a partial sum and a local slice where it is replicated), transpose (the inverse
// permutation), slice <-> pad, concat (two slices), reshape (back), take (a scatter_add).
#pragma once
#include <array>
#include <type_traits>
#include <utility>

#include "tshard/ad/cotangent.hpp"
#include "tshard/ops/shape.hpp"
#include "tshard/ops/take.hpp"

namespace tshard::detail::grad {

template <class T>
void vjp(Reshard, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeNode<T>& x) {
  if (auto* n = node_of(x)) add_cotangent(*n, self.cotangent_desc, std::move(self.cotangent));
}

template <int... Perm>
constexpr std::array<int, sizeof...(Perm)> inverse_permutation() {
  constexpr std::array<int, sizeof...(Perm)> perm{Perm...};
  std::array<int, sizeof...(Perm)> inv{};
  for (std::size_t d = 0; d < perm.size(); ++d) inv[std::size_t(perm[d])] = int(d);
  return inv;
}

template <int... Perm, class Out, class T, class X>
void vjp(Transpose<Perm...>, std::type_identity<Out>, TypedGradNode<T>& self, const X& x) {
  if (!tracked(x)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, x.mesh());
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    accumulate(x, transpose<inverse_permutation<Perm...>()[I]...>(g));
  }(std::make_index_sequence<sizeof...(Perm)>{});
}

template <class Out, class T, class X>
void vjp(Slice tag, std::type_identity<Out>, TypedGradNode<T>& self, const X& x) {
  if (!tracked(x)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, x.mesh());
  constexpr int Rank = X::rank;
  Eigen::Index before[Rank], after[Rank];
  for (int d = 0; d < Rank; ++d) {
    before[d] = tag.offset[d];
    after[d] = extents_of(x)[d] - tag.offset[d] - extents_of(g)[d];
  }
  accumulate(x, pad(g, before, after));
}

template <class Out, class T, class X>
void vjp(Pad tag, std::type_identity<Out>, TypedGradNode<T>& self, const X& x) {
  if (!tracked(x)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, x.mesh());
  constexpr int Rank = X::rank;
  Eigen::Index offset[Rank], extent[Rank];
  for (int d = 0; d < Rank; ++d) offset[d] = tag.before[d], extent[d] = extents_of(x)[d];
  accumulate(x, slice(g, offset, extent));
}

template <int Dim, class Out, class T, class A, class B>
void vjp(Concat<Dim>, std::type_identity<Out>, TypedGradNode<T>& self, const A& a, const B& b) {
  const bool ta = tracked(a), tb = tracked(b);
  if (!ta && !tb) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, a.mesh());
  constexpr int Rank = A::rank;
  Eigen::Index offset[Rank] = {}, extent[Rank];
  for (int d = 0; d < Rank; ++d) extent[d] = extents_of(a)[d];
  if (ta) accumulate(a, slice(g, offset, extent));
  for (int d = 0; d < Rank; ++d) extent[d] = extents_of(b)[d];
  offset[Dim] = extents_of(a)[Dim];
  if (tb) accumulate(b, slice(g, offset, extent));
}

template <class Out, class T, class X>
void vjp(Reshape, std::type_identity<Out>, TypedGradNode<T>& self, const X& x) {
  if (!tracked(x)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, x.mesh());
  constexpr int Rank = X::rank;
  Eigen::Index shape[Rank];
  for (int d = 0; d < Rank; ++d) shape[d] = extents_of(x)[d];
  accumulate(x, reshape<typename X::SpecType>(g, shape));
}

template <int Axis, class Out, class T, class Table, class Ids>
void vjp(Take<Axis>, std::type_identity<Out>, TypedGradNode<T>& self, const Table& table, const Ids& ids) {
  if (!tracked(table)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, table.mesh());
  auto dt = zeros_like(table);
  scatter_add<Axis>(dt, ids, g);
  accumulate(table, dt);
}

}  // namespace tshard::detail::grad

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_RULE_INSTANCE_1(T, TapeNode<T>, grad::Reshard)
TSHARD_FOR_EACH_NUMBER(TSHARD_INSTANCE)  // (integer tensors are resharded with the rest)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
