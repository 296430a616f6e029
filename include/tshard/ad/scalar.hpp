// ad::Scalar<T, M>: a number computed from sharded tensors that remembers how, so a gradient
// can be taken of it: cross_entropy's result. It converts to T where a number is wanted
// (`float l = ts::nn::cross_entropy(...)`) and keeps its derivation through + - * / with
// numbers and other scalars (`ce + 0.5 * aux`). The same value on every rank.
#pragma once
#include <type_traits>
#include <utility>

#include "tshard/core/spec.hpp"
#include "tshard/ops/elementwise.hpp"

namespace tshard::ad {

template <class T, class M>
class Scalar {
 public:
  using Tensor = ShardedTensor<T, M, Spec<>>;
  using value_type = T;

  explicit Scalar(Tensor t) : t_(std::move(t)) {}
  operator T() const { return value(); }  // NOLINT: a loss is used as a number
  // A rank-0 replicated tensor holds its value on every rank: no communication.
  T value() const { return t_.data()[0]; }
  const Tensor& tensor() const { return t_; }

 private:
  Tensor t_;
};

template <class X>
struct is_scalar : std::false_type {};
template <class T, class M>
struct is_scalar<Scalar<T, M>> : std::true_type {};

template <class T, class M>
Scalar<T, M> operator+(const Scalar<T, M>& a, const Scalar<T, M>& b) {
  return Scalar<T, M>(a.tensor() + b.tensor());
}
template <class T, class M>
Scalar<T, M> operator-(const Scalar<T, M>& a, const Scalar<T, M>& b) {
  return Scalar<T, M>(a.tensor() - b.tensor());
}
template <class T, class M>
Scalar<T, M> operator*(const Scalar<T, M>& a, const Scalar<T, M>& b) {
  return Scalar<T, M>(a.tensor() * b.tensor());
}
template <class T, class M>
Scalar<T, M> operator/(const Scalar<T, M>& a, const Scalar<T, M>& b) {
  return Scalar<T, M>(a.tensor() / b.tensor());
}
template <class T, class M>
Scalar<T, M> operator-(const Scalar<T, M>& a) {
  return Scalar<T, M>(Scalar<T, M>::Tensor(-a.tensor()));
}

#define TSHARD_SCALAR_WITH_NUMBER(op)                                      \
  template <class T, class M, class S>                                     \
    requires std::is_arithmetic_v<S>                                       \
  Scalar<T, M> operator op(const Scalar<T, M>& a, S s) {                   \
    return Scalar<T, M>(typename Scalar<T, M>::Tensor(a.tensor() op T(s))); \
  }                                                                        \
  template <class T, class M, class S>                                     \
    requires std::is_arithmetic_v<S>                                       \
  Scalar<T, M> operator op(S s, const Scalar<T, M>& a) {                   \
    return Scalar<T, M>(typename Scalar<T, M>::Tensor(T(s) op a.tensor())); \
  }
TSHARD_SCALAR_WITH_NUMBER(+)
TSHARD_SCALAR_WITH_NUMBER(-)
TSHARD_SCALAR_WITH_NUMBER(*)
TSHARD_SCALAR_WITH_NUMBER(/)
#undef TSHARD_SCALAR_WITH_NUMBER

}  // namespace tshard::ad
