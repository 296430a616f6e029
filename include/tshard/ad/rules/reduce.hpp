// Vector-Jacobian products of the reductions: a sum's cotangent is broadcast back over the
// reduced dims (the transpose of a partial sum's psum is that broadcast: nothing moves), a max
// or min's goes to the elements equal to the result (shared evenly among ties, as
// torch.amax), and a keep_dims view's is the same buffer seen without the kept dims.
#pragma once
#include <type_traits>

#include "tshard/ad/cotangent.hpp"
#include "tshard/ops/reduce.hpp"

namespace tshard::detail::grad {

// g (the reduction's cotangent) seen with the reduced dims of x kept at extent 1: the same buffer.
template <class X, int... Dims, class G>
auto kept_view(const X& x, const G& g) {
  using K = ShardedTensor<typename X::Scalar, typename X::MeshT,
                          typename replicate_dims<typename X::SpecType, Dims...>::type>;
  auto shape = x.global_shape();
  ((shape[Dims] = 1), ...);
  return K(AdoptStorage{}, x.mesh(), shape, TensorAccess::storage(g));
}

template <ReduceOp Op, int... Dims, class Out, class T, class X, class Y>
void vjp(Reduce<Op, Dims...>, std::type_identity<Out>, TypedGradNode<T>& self, const X& x, const Y& y) {
  if (!tracked(x)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, x.mesh());
  const auto gk = kept_view<X, Dims...>(x, g);
  if constexpr (Op == ReduceOp::Sum) {
    accumulate(x, zeros_like(x) + gk);
  } else {
    using Plain = ShardedTensor<T, typename X::MeshT, typename Out::SpecType>;
    const auto yk = kept_view<X, Dims...>(x, implicit_reshard<typename Plain::SpecType>(y, "backward"));
    const auto& xv = resolved(x, "backward");
    const auto hit = xv == yk;
    const auto ties = sum<Dims...>(map(hit, [](bool h) { return h ? T(1) : T(0); }), keep_dims);
    accumulate(x, where(hit, gk / ties, T(0)));
  }
}

template <int... Dims, class Out, class T, class R>
void vjp(KeepDims<Dims...>, std::type_identity<Out>, TypedGradNode<T>& self, const R& r) {
  if (!tracked(r)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, r.mesh());
  using Plain = ShardedTensor<T, typename R::MeshT, typename R::SpecType>;
  accumulate(r, Plain(AdoptStorage{}, r.mesh(), r.global_shape(), TensorAccess::storage(g)));
}

}  // namespace tshard::detail::grad
