// The vector-Jacobian product of convolve: a "same" correlation with a centred kernel is, as a
// linear map, adjoint to the correlation with the kernel reversed in every dim, under either
// boundary (zeros stay zeros, a wrap wraps back). So the cotangent takes one more halo
// exchange of its own, with the same widths, rather than a transpose of the forward's.
#pragma once
#include <type_traits>

#include "tshard/ad/cotangent.hpp"
#include "tshard/ops/stencil.hpp"

namespace tshard::detail::grad {

template <class Out, class T, int Rank, class X>
void vjp(const Convolve<T, Rank>& tag, std::type_identity<Out>, TypedGradNode<T>& self, const X& x) {
  if (!tracked(x)) return;
  const auto g = cotangent(std::type_identity<Out>{}, self, x.mesh());
  Eigen::array<bool, Rank> all{};
  all.fill(true);
  const Eigen::Tensor<T, Rank> flipped = tag.kernel.reverse(all);
  accumulate(x, convolve(g, flipped, tag.boundary));
}

}  // namespace tshard::detail::grad
