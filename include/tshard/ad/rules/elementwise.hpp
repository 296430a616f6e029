// Vector-Jacobian products of the elementwise operators: binary with numpy broadcasting (the
// cotangent of a broadcast operand is summed over the dims it was broadcast along), scalars on
// either side, unary functions, pow and where. Linear rules pass the cotangent on as it lies,
// a partial sum included; the others read it in the output's spec.
#pragma once
#include <type_traits>

#include "tshard/ad/cotangent.hpp"
#include "tshard/ops/elementwise.hpp"

namespace tshard::detail::grad {

// a + b, a - b: the cotangent passes on as it lies (a partial sum included), summed over the dims
// an operand was broadcast along. (The output's rank is its node's.)
template <BinaryKind K, class T>
void vjp(Binary<K>, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeNode<T>& a, const TapeNode<T>& b) {
  static_assert(K == BinaryKind::Add || K == BinaryKind::Sub);
  const SpecDesc dg = self.cotangent_desc;
  auto g = std::move(self.cotangent);
  if (auto* n = node_of(a)) add_unbroadcast(*n, dg, self.shape, self.primal.rank, g);
  if (auto* n = node_of(b)) add_unbroadcast(*n, dg, self.shape, self.primal.rank, g, K == BinaryKind::Sub ? T(-1) : T(1));
}

template <BinaryKind K, class Out, class T, class A, class B>
void vjp(Binary<K>, std::type_identity<Out>, TypedGradNode<T>& self, const A& a, const B& b) {
  static_assert(K == BinaryKind::Mul || K == BinaryKind::Div);
  const auto g = cotangent(std::type_identity<Out>{}, self, a.mesh());
  if constexpr (K == BinaryKind::Mul) {
    if (tracked(a)) accumulate_unbroadcast(a, g * b);
    if (tracked(b)) accumulate_unbroadcast(b, g * a);
  } else {  // a / b: da = g / b, db = -g a / b^2
    if (tracked(a)) accumulate_unbroadcast(a, g / b);
    if (tracked(b)) accumulate_unbroadcast(b, (g * a) / (b * b), T(-1));
  }
}

// x + s, s - x, s x, x / s...: the cotangent times a constant factor.
template <BinaryKind K, bool ScalarLeft, class S, class T>
void vjp(WithScalar<K, ScalarLeft, S> tag, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeNode<T>& x) {
  auto* n = node_of(x);
  if (!n) return;
  T factor = T(1);
  if constexpr (K == BinaryKind::Sub && ScalarLeft) factor = T(-1);
  if constexpr (K == BinaryKind::Mul) factor = T(tag.s);
  if constexpr (K == BinaryKind::Div) factor = T(1) / T(tag.s);
  add_unbroadcast(*n, self.cotangent_desc, self.shape, self.primal.rank, std::move(self.cotangent), factor);
}

// s / x: -s g / x^2.
template <BinaryKind K, bool ScalarLeft, class S, class Out, class T, class X>
void vjp(WithScalar<K, ScalarLeft, S> tag, std::type_identity<Out>, TypedGradNode<T>& self, const X& x) {
  static_assert(K == BinaryKind::Div && ScalarLeft);
  if (!tracked(x)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, x.mesh());
  const T s = T(tag.s);
  accumulate(x, map([s](T gv, T xv) { return -s * gv / (xv * xv); }, g, x));
}

template <class T>
void vjp(Unary<UnaryKind::Neg>, std::type_identity<AnyOutput>, TypedGradNode<T>& self, const TapeNode<T>& x) {
  if (auto* n = node_of(x))
    add_unbroadcast(*n, self.cotangent_desc, self.shape, self.primal.rank, std::move(self.cotangent), T(-1));
}

template <UnaryKind K, class Out, class T, class X, class Y>
void vjp(Unary<K>, std::type_identity<Out>, TypedGradNode<T>& self, const X& x, const Y& y) {
  static_assert(K != UnaryKind::Neg);
  if (!tracked(x)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, x.mesh());
  if constexpr (K == UnaryKind::Exp) accumulate(x, map([](T gv, T yv) { return gv * yv; }, g, y));
  if constexpr (K == UnaryKind::Tanh) accumulate(x, map([](T gv, T yv) { return gv * (T(1) - yv * yv); }, g, y));
  if constexpr (K == UnaryKind::Sqrt) accumulate(x, map([](T gv, T yv) { return gv * T(0.5) / yv; }, g, y));
  if constexpr (K == UnaryKind::Sigmoid)
    accumulate(x, map([](T gv, T yv) { return gv * yv * (T(1) - yv); }, g, y));
  if constexpr (K == UnaryKind::Log) accumulate(x, map([](T gv, T xv) { return gv / xv; }, g, x));
  if constexpr (K == UnaryKind::Relu) accumulate(x, map([](T gv, T xv) { return xv > T(0) ? gv : T(0); }, g, x));
  if constexpr (K == UnaryKind::Abs)
    accumulate(x, map([](T gv, T xv) { return xv > T(0) ? gv : xv < T(0) ? -gv : T(0); }, g, x));
  if constexpr (K == UnaryKind::Square) accumulate(x, map([](T gv, T xv) { return T(2) * xv * gv; }, g, x));
}

template <class P, class Out, class T, class X>
void vjp(Pow<P> tag, std::type_identity<Out>, TypedGradNode<T>& self, const X& x) {
  if (!tracked(x)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, x.mesh());
  const T p = T(tag.p);
  accumulate(x, map([p](T gv, T xv) { return gv * p * std::pow(xv, p - T(1)); }, g, x));
}

// where(mask, a, b): the cotangent goes to a where the mask holds and to b elsewhere.
template <class Out, class T, class Mask, class A, class B>
void vjp(Where, std::type_identity<Out>, TypedGradNode<T>& self, const Mask& mask, const A& a, const B& b) {
  const bool ta = tracked(a), tb = tracked(b);
  if (!ta && !tb) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, mask.mesh());
  if constexpr (is_sharded_tensor<A>::value)
    if (ta) accumulate_unbroadcast(a, where(mask, g, T(0)));
  if constexpr (is_sharded_tensor<B>::value)
    if (tb) accumulate_unbroadcast(b, where(mask, T(0), g));
}

}  // namespace tshard::detail::grad
