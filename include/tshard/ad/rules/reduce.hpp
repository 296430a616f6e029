// Vector-Jacobian products of the reductions: a sum's cotangent is broadcast back over the
// reduced dims (the transpose of a partial sum's psum is that broadcast: nothing moves), a max
// or min's goes to the elements equal to the result (shared evenly among ties, as
// torch.amax), and a keep_dims view's is the same buffer seen without the kept dims.
#pragma once
#include <type_traits>

#include "tshard/ad/cotangent.hpp"
#include "tshard/ad/rules/elementwise.hpp"
#include "tshard/ops/reduce.hpp"

namespace tshard::detail {

// x summed over `reduced`: x's node += zeros like x + g seen with those dims kept at
// extent 1 (the typed rule's sum, -0 included), broadcast back over them.
template <class T>
void sum_vjp(const std::array<bool, kMaxRank>& reduced, TypedGradNode<T>& self, const TapeValue<T>& x) {
  auto* nx = node_of(x);
  if (!nx) return;
  MeshState& mesh = *self.mesh;
  BlockValue<T> g{read_cotangent(self), x.spec.without_partial(), x.shape};
  for (int d = 0; d < x.spec.rank; ++d)
    if (reduced[d]) g.spec.dims[d] = DimSplit{}, g.shape[d] = 1;
  BlockValue<T> zeros{nullptr, x.spec.without_partial(), x.shape};
  const Index n = shard_layout(zeros.spec, zeros.shape, mesh.shape(), mesh.coords()).padded_size();
  zeros.data = pooled_array<T>(static_cast<std::size_t>(n));
  std::fill(zeros.data.get(), zeros.data.get() + n, T(0));
  auto c = rule_binary(mesh, BinaryKind::Add, zeros, g, "add");
  accumulate_block(*nx, c.spec, c.shape, std::move(c.data));
}

// x reduced over `reduced` by max or min into y: the cotangent goes to the elements equal to the
// result, shared evenly among ties (torch.amax), as the expression
//   where(x == y_kept, g_kept / sum<reduced>(x == y_kept ? 1 : 0, keep_dims), 0)
// computes it (the same kernels, in that order; the tie counts are whole numbers, exact).
template <class T>
void extremum_vjp(const std::array<bool, kMaxRank>& reduced, TypedGradNode<T>& self, const TapeValue<T>& x,
                  const TapeValue<T>& y) {
  auto* nx = node_of(x);
  if (!nx) return;
  MeshState& mesh = *self.mesh;
  auto layout = [&](const SpecDesc& d, const Extents& s) { return shard_layout(d, s, mesh.shape(), mesh.coords()); };
  const int rank = x.spec.rank;
  const SpecDesc dx = x.spec.without_partial();
  SpecDesc dk = dx;  // g and y seen with the reduced dims kept at extent 1: the same buffers
  Extents kshape = x.shape, rshape{};
  for (int d = 0, k = 0; d < rank; ++d) {
    if (reduced[d]) dk.dims[d] = DimSplit{}, kshape[d] = 1;
    else rshape[k++] = x.shape[d];
  }
  const std::shared_ptr<T> g = read_cotangent(self);
  const auto yk = implicit_reshard(mesh, y.spec, y.spec.without_partial(), y.shape, y.value.get(), "backward");
  const auto xv = implicit_reshard(mesh, x.spec, dx, x.shape, x.value.get(), "backward");
  // hit = x == y_kept
  const SpecDesc dhit = elementwise_desc(dx, dk);
  const Index n = layout(dhit, x.shape).padded_size();
  auto hit = pooled_array<bool>(static_cast<std::size_t>(n));
  {
    OperatorScope scope("equal");
    compare_run<T>(mesh, CompareKind::Equal, dx, x.shape, xv.data, dk, kshape, yk.data, dhit, x.shape, hit.get(), "equal");
  }
  // ties = sum<reduced>(hit ? 1 : 0, keep_dims): a partial sum over the axes splitting those dims
  const ShardLayout lhit = layout(dhit, x.shape);
  auto ones = pooled_array<T>(static_cast<std::size_t>(n));
  for_each_valid_run(lhit, [&](Index off, Index len) {
    for (Index i = off; i < off + len; ++i) ones.get()[i] = hit.get()[i] ? T(1) : T(0);
  });
  SpecDesc dsum{};  // the reduction's spec: dhit without the reduced dims
  for (int d = 0; d < rank; ++d) {
    if (!reduced[d]) dsum.dims[dsum.rank++] = dhit.dims[d];
    else dsum.partial_axes |= dhit.dims[d].mask();
  }
  const ShardLayout lsum = layout(dsum, rshape);
  BlockValue<T> ties{pooled_array<T>(static_cast<std::size_t>(lsum.padded_size())), dk, kshape};
  reduce_kernel<T>(ReduceOp::Sum, ones.get(), lhit, reduced, ties.data.get(), lsum.padded, dsum.rank);
  ties.spec = dhit;
  for (int d = 0; d < rank; ++d)
    if (reduced[d]) ties.spec.dims[d] = DimSplit{};
  ties.spec.partial_axes = dsum.partial_axes;
  ties.spec.partial = dsum.partial_axes ? PartialKind::Sum : PartialKind::None;
  // q = g_kept / ties (ties resolved first), then where(hit, q, 0)
  BlockValue<T> q;
  {
    OperatorScope scope("divide");
    auto tr = implicit_reshard(mesh, ties.spec, ties.spec.without_partial(), kshape, ties.data.get(), "divide");
    if (tr.owned) ties.data = std::move(tr.owned);
    ties.spec = ties.spec.without_partial();
    q = rule_binary(mesh, BinaryKind::Div, BlockValue<T>{g, dk, kshape}, ties, "divide");
  }
  const T zero(0);
  const SpecDesc dout = elementwise_desc(elementwise_desc(dhit, q.spec), ScalarOperand<T>::desc(rank));
  auto out = pooled_array<T>(static_cast<std::size_t>(layout(dout, x.shape).padded_size()));
  {
    OperatorScope scope("where");
    where_run<T>(mesh, dhit, x.shape, hit.get(), q.spec, q.shape, q.data.get(), ScalarOperand<T>::desc(rank),
                 ScalarOperand<T>::shape(rank), &zero, dout, x.shape, out.get());
  }
  accumulate_block(*nx, dout, x.shape, std::move(out));
}

}  // namespace tshard::detail

namespace tshard::detail::grad {

template <class T>
void vjp(const Extremum& tag, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeValue<T>& x,
         const TapeValue<T>& y) {
  extremum_vjp(tag.reduced, self, x, y);
}

template <class T>
void vjp(Sum tag, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeValue<T>& x) {
  sum_vjp(tag.reduced, self, x);
}

// r seen with kept dims: its cotangent is the same buffer, seen as r (r's spec without its partial).
template <class T>
void vjp(KeepDims, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeValue<T>& r) {
  if (auto* n = node_of(r)) accumulate_block(*n, r.spec.without_partial(), r.shape, read_cotangent(self));
}

}  // namespace tshard::detail::grad

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T)                                                                              \
  TSHARD_RULE_INSTANCE_1(T, TapeValue<T>, grad::Sum)                                                     \
  TSHARD_RULE_INSTANCE_1(T, TapeValue<T>, grad::KeepDims)                                                \
  TSHARD_RULE_INSTANCE_2(T, TapeValue<T>, TapeValue<T>, grad::Extremum)
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void extremum_vjp<T>(const std::array<bool, kMaxRank>&, \
    TypedGradNode<T>&, const TapeValue<T>&, const TapeValue<T>&))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void sum_vjp<T>(const std::array<bool, kMaxRank>&, \
    TypedGradNode<T>&, const TapeValue<T>&))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
