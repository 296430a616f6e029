// Layers whose activation spec is pinned (tokens split over the heads' or hidden dim's axis:
// Megatron's sequence parallelism) move their input once into the layout whose product with their
// weight lands in the pinned spec, and their biased output into that spec; with the spec Deduced
// both are the identity. Linear, Attention and GroupedQueryAttention share these steps.
#pragma once
#include "tshard/core/spec_algebra.hpp"
#include "tshard/ops/einsum.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/reshard/reshard.hpp"

namespace tshard::nn::detail {

// x laid out for a product with a weight of spec W whose result lands in Pinned: Pinned's leading
// dims (whole where they would share an axis with W), then W's input dim. x itself (no copy) where
// Pinned is Deduced or x is already so laid out.
template <class Pinned, class W, class X>
decltype(auto) input_for_pinned(const X& x) {
  if constexpr (tshard::detail::is_deduced<Pinned>)
    return x;
  else
    return tshard::detail::laid_out_as<
        tshard::detail::leading_dims_then_t<Pinned, W, tshard::detail::dim_at_t<W, 0>>>(x);
}

// y + b laid out as Pinned (y's pending partial resolved by reduce-scatter where Pinned splits).
template <class Pinned, class Y, class B>
auto biased_as(const Y& y, const B& b) {
  using Out = ShardedTensor<typename Y::Scalar, typename Y::MeshT, Pinned>;
  return Out(tshard::detail::laid_out_as<Pinned>(y + b));
}

// An output projection einsum<Eq>(a, w) + b; the product and the sum in Pinned where it is pinned.
template <FixedString Eq, class Pinned, class A, class W, class B>
auto output_projection(const A& a, const W& w, const B& b) {
  if constexpr (tshard::detail::is_deduced<Pinned>)
    return einsum<Eq>(a, w) + b;
  else
    return biased_as<Pinned>(einsum<Eq, Pinned>(a, w), b);
}

}  // namespace tshard::nn::detail
