// In-place operators: y += x, y -= x, y *= x, y /= x with a tensor or a scalar. y keeps its spec
// and its buffer; the right side is resolved where partial and aligned to y's spec (the implicit
// reshard entry point) where laid out otherwise, and may broadcast (numpy) to y's shape. An
// unevaluated `s * g` on the right is read in the same pass: `w -= lr * g` reads w and g once.
// A partial right side that is expiring (`w -= lr * std::move(g)`, or a gradient written inline)
// and owns its pooled buffer is all-reduced in that buffer: no copy of the gradient.
#pragma once
#include <string>
#include <type_traits>
#include <utility>

#include "tshard/comm/collectives.hpp"

#include "tshard/ops/elementwise.hpp"

namespace tshard {
namespace detail {

template <BinaryKind K, class T, class M, class SY, class PY, class SX, class PX>
ShardedTensor<T, M, SY, PY>& compound(ShardedTensor<T, M, SY, PY>& y, const ShardedTensor<T, M, SX, PX>& x,
                                      const char* name) {
  using Y = ShardedTensor<T, M, SY, PY>;
  using X = ShardedTensor<T, M, SX, PX>;
  static_assert(no_arithmetic_on_masks<T>, "tshard: masks (bool tensors) take no arithmetic: use where(mask, a, b)");
  static_assert(SX::rank <= SY::rank, "tshard: the right side of an in-place operator has more dims than the left side");
  // A partial left side can only take a partial sum over the same axes, added or subtracted.
  constexpr bool partial_pair = (K == BinaryKind::Add || K == BinaryKind::Sub) && is_partial_sum_v<Y> &&
                                is_partial_sum_v<X> && same_name_set(PY::names, PX::names);
  static_assert(!PY::is_partial || partial_pair,
                "tshard: the left side of an in-place operator is partial: resolve it first (reshard to a plain spec)");
  OperatorScope scope(name);
  // Under a gradient, y (op)= x is y = y (op) x laid out as y: recorded, and the old value of y
  // that the rule may read stays as it was (its buffer is shared, so y gets a new one). A partial
  // y stays the partial sum it was (partial +/- partial over the same axes).
  if (recording(y, x)) {
    refuse_in_place_on_leaf(y, name);
    auto r = binary<K>(std::as_const(y), x, name);
    if (detail::extents_of(r) != detail::extents_of(y))
      throw ShapeError(std::string("tshard::") + name + ": the result " + r.describe() +
                       " does not fit the left side: y is " + y.describe() + ", x is " + x.describe());
    if constexpr (PY::is_partial) {
      if constexpr (std::is_same_v<decltype(r), Y>)
        y = std::move(r);
      else
        throw SpecError(std::string("tshard::") + name + ": under a gradient, the partial left side " + y.describe() +
                        " takes a partial sum of its own layout, not " + x.describe());
    } else {
      y = implicit_reshard<SY>(r, name);
    }
    return y;
  }
  if constexpr (PX::is_partial && !partial_pair) {
    return compound<K>(y, resolved(x, name), name);
  } else {
    require_same_mesh(y, x, name);
    const Extents ex = extents_of_rank(detail::extents_of(x), SX::rank, SY::rank);
    const Extents shape = broadcast_shape(detail::extents_of(y), ex, SY::rank, name, [&] { return y.describe(); },
                                          [&] { return x.describe(); });
    if (shape != detail::extents_of(y))
      throw ShapeError(std::string("tshard::") + name + ": the result " + shape_to_string(shape, SY::rank) +
                       " does not fit the left side: y is " + y.describe() + ", x is " + x.describe());
    const auto vx = TensorAccess::buffer(x);  // before y is written: x may share y's old buffer
    T* out = y.data();
    binary_run<T>(*detail::state_of(y.mesh()), K, Y::spec_desc, detail::extents_of(y), out, desc_of_rank<X, SY::rank>(),
                  ex, vx.data, Y::spec_desc, detail::extents_of(y), out, name, T(1), vx.scale);
    return y;
  }
}

// y (op)= x where x expires: a partial sum that alone owns its pooled buffer is resolved in it
// (an all-reduce in place, counted under "<op>/auto"), then read in the update's one pass.
template <BinaryKind K, class T, class M, class SY, class PY, class SX, class PX>
ShardedTensor<T, M, SY, PY>& compound_expiring(ShardedTensor<T, M, SY, PY>& y, ShardedTensor<T, M, SX, PX>&& x,
                                               const char* name) {
  using X = ShardedTensor<T, M, SX, PX>;
  if constexpr (is_partial_sum_v<X> && !PY::is_partial) {
    // (Under a gradient the resolution is recorded by compound: x's node must not be lost.)
    if (TensorAccess::owns_pooled_buffer(x) && y.mesh() == x.mesh() && !recording(y, x)) {
      constexpr SpecDesc plain = X::spec_desc.without_partial();
      auto& mesh = *detail::state_of(x.mesh());
      require_implicit_allowed(mesh, X::spec_desc, plain, detail::extents_of(x), name);
      const ScaledBuffer<T> v = TensorAccess::buffer(x);
      T* buf = const_cast<T*>(v.data);  // this tensor's own buffer, expiring
      {
        OperatorScope outer(name), scope("auto");
        all_reduce(mesh.group_of_mask(X::spec_desc.partial_axes), buf, buf, x.padded_size(), ReduceOp::Sum);
      }
      ShardedTensor<T, M, SX> resolved_x(AdoptStorage{}, x.mesh(), x.global_shape(), TensorAccess::storage(x, false));
      if (v.scaled) return compound<K>(y, TensorAccess::scaled(resolved_x, v.scale), name);
      return compound<K>(y, resolved_x, name);
    }
  }
  return compound<K>(y, std::as_const(x), name);
}

template <BinaryKind K, class Y, class S>
Y& compound_scalar(Y& y, S s, const char* name) {
  using T = typename Y::Scalar;
  static_assert(no_arithmetic_on_masks<T>, "tshard: masks (bool tensors) take no arithmetic: use where(mask, a, b)");
  constexpr bool keeps = is_partial_sum_v<Y> && (K == BinaryKind::Mul || (K == BinaryKind::Div && !std::is_integral_v<T>));
  static_assert(!Y::is_partial || keeps,
                "tshard: the left side of an in-place operator is partial: resolve it first (reshard to a plain spec)");
  if (recording(y)) {  // under a gradient: y = y (op) s, recorded
    refuse_in_place_on_leaf(y, name);
    y = with_scalar<K, false>(std::as_const(y), s, name);
    return y;
  }
  const T v = T(s);
  const Index n = y.padded_size();
  T* p = y.data();
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> a(p, n);
  if constexpr (K == BinaryKind::Add) a += v;
  if constexpr (K == BinaryKind::Sub) a -= v;
  if constexpr (K == BinaryKind::Mul) a *= v;
  if constexpr (K == BinaryKind::Div) {
    if constexpr (std::is_integral_v<T>)
      for (Index i = 0; i < n; ++i) p[i] = SafeDivide<T>{}(p[i], v);
    else
      a /= v;
  }
  return y;
}

}  // namespace detail

template <class T, class M, class SY, class PY, class SX, class PX>
ShardedTensor<T, M, SY, PY>& operator+=(ShardedTensor<T, M, SY, PY>& y, const ShardedTensor<T, M, SX, PX>& x) {
  return detail::compound<detail::BinaryKind::Add>(y, x, "add");
}
template <class T, class M, class SY, class PY, class SX, class PX>
ShardedTensor<T, M, SY, PY>& operator+=(ShardedTensor<T, M, SY, PY>& y, ShardedTensor<T, M, SX, PX>&& x) {
  return detail::compound_expiring<detail::BinaryKind::Add>(y, std::move(x), "add");
}
template <class T, class M, class SY, class PY, class SX, class PX>
ShardedTensor<T, M, SY, PY>& operator-=(ShardedTensor<T, M, SY, PY>& y, const ShardedTensor<T, M, SX, PX>& x) {
  return detail::compound<detail::BinaryKind::Sub>(y, x, "subtract");
}
template <class T, class M, class SY, class PY, class SX, class PX>
ShardedTensor<T, M, SY, PY>& operator-=(ShardedTensor<T, M, SY, PY>& y, ShardedTensor<T, M, SX, PX>&& x) {
  return detail::compound_expiring<detail::BinaryKind::Sub>(y, std::move(x), "subtract");
}
template <class T, class M, class SY, class PY, class SX, class PX>
ShardedTensor<T, M, SY, PY>& operator*=(ShardedTensor<T, M, SY, PY>& y, const ShardedTensor<T, M, SX, PX>& x) {
  return detail::compound<detail::BinaryKind::Mul>(y, x, "multiply");
}
template <class T, class M, class SY, class PY, class SX, class PX>
ShardedTensor<T, M, SY, PY>& operator/=(ShardedTensor<T, M, SY, PY>& y, const ShardedTensor<T, M, SX, PX>& x) {
  return detail::compound<detail::BinaryKind::Div>(y, x, "divide");
}

#define TSHARD_REFUSE_MIXED(op)                            \
  template <class Y, class X>                              \
    requires detail::MixedTensors<Y, X>                    \
  Y& operator op(Y& y, X&&) {                              \
    detail::refuse_mixed<Y, X>();                          \
    return y;                                              \
  }
TSHARD_REFUSE_MIXED(+=)
TSHARD_REFUSE_MIXED(-=)
TSHARD_REFUSE_MIXED(*=)
TSHARD_REFUSE_MIXED(/=)
#undef TSHARD_REFUSE_MIXED

template <class Y, class S> requires detail::ScalarFor<Y, S>
Y& operator+=(Y& y, S s) { return detail::compound_scalar<detail::BinaryKind::Add>(y, s, "add"); }
template <class Y, class S> requires detail::ScalarFor<Y, S>
Y& operator-=(Y& y, S s) { return detail::compound_scalar<detail::BinaryKind::Sub>(y, s, "subtract"); }
template <class Y, class S> requires detail::ScalarFor<Y, S>
Y& operator*=(Y& y, S s) { return detail::compound_scalar<detail::BinaryKind::Mul>(y, s, "multiply"); }
template <class Y, class S> requires detail::ScalarFor<Y, S>
Y& operator/=(Y& y, S s) { return detail::compound_scalar<detail::BinaryKind::Div>(y, s, "divide"); }

}  // namespace tshard
