// Custom vector-Jacobian products: a function whose forward is computed some faster way (a
// fused kernel, a hand-written backward) registered with its own derivative, as JAX's
// custom_vjp and PyTorch's autograd.Function. The forward runs without recording; where an
// input is tracked, one node is recorded whose rule is the given backward.
//
//   auto y = ts::ad::custom_vjp(
//       [](const auto& x) { return my_fused_forward(x); },                  // values in, value out
//       [](const auto& dy, const auto& y, const auto& x) { return my_backward(x, y, dy); },
//       x);                                                                  // the inputs
//
// backward(dy, y, inputs...) gets the output's cotangent dy (laid out as y, resolved), the
// output and the inputs, and returns the inputs' cotangents: one tensor for one input, a
// std::tuple for several, with ts::ad::no_gradient for an input that has none (labels, masks).
// A returned cotangent may have any spec (a partial sum included): it is resolved into the
// input's layout when needed.
#pragma once
#include <tuple>
#include <type_traits>
#include <utility>

#include "tshard/ad/cotangent.hpp"

namespace tshard::ad {

// Returned by a custom backward for an input that has no cotangent.
struct NoGradient {};
inline constexpr NoGradient no_gradient{};

}  // namespace tshard::ad

namespace tshard::detail {

template <class X>
struct is_tuple : std::false_type {};
template <class... X>
struct is_tuple<std::tuple<X...>> : std::true_type {};

template <class X, class C>
void accumulate_custom(const X& x, const C& c) {
  if constexpr (!std::is_same_v<std::remove_cvref_t<C>, ad::NoGradient>) {
    static_assert(is_sharded_tensor<std::remove_cvref_t<C>>::value,
                  "tshard: a custom backward returns tensors (or ts::ad::no_gradient) for its inputs");
    if constexpr (is_real_floating_v<typename X::Scalar>) {
      if (!tracked(x)) return;
      if (extents_of(c) != extents_of(x))
        throw ShapeError("tshard::ad::custom_vjp: the backward returned " + c.describe() + " for the input " +
                         x.describe());
      accumulate(x, c);
    }
  }
}

namespace grad {
template <class Backward>
struct Custom {
  Backward backward;
};

template <class Backward, class Out, class T, class Y, class... In>
void vjp(const Custom<Backward>& tag, std::type_identity<Out>, TypedGradNode<T>& self, const Y& y, const In&... in) {
  const auto g = cotangent(std::type_identity<Out>{}, self, y.mesh());
  auto grads = tag.backward(g, y, in...);
  if constexpr (is_tuple<decltype(grads)>::value) {
    static_assert(std::tuple_size_v<decltype(grads)> == sizeof...(In),
                  "tshard: a custom backward returns one cotangent per input");
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      const auto inputs = std::tie(in...);
      (accumulate_custom(std::get<I>(inputs), std::get<I>(grads)), ...);
    }(std::make_index_sequence<sizeof...(In)>{});
  } else {
    static_assert(sizeof...(In) == 1, "tshard: a custom backward of several inputs returns a std::tuple of cotangents");
    (accumulate_custom(in, grads), ...);
  }
}
}  // namespace grad
}  // namespace tshard::detail

namespace tshard::ad {

template <class Forward, class Backward, ShardedTensorType... In>
auto custom_vjp(Forward&& forward, Backward backward, const In&... in) {
  using Y = std::remove_cvref_t<std::invoke_result_t<Forward&, const In&...>>;
  static_assert(detail::is_sharded_tensor<Y>::value, "tshard: a custom_vjp's forward returns one ShardedTensor");
  Y y = [&] {
    detail::PauseRecording pause;
    return forward(in...);
  }();
  if (detail::recording(in...))
    detail::record(y, detail::grad::Custom<Backward>{std::move(backward)}, detail::tape_output(y),
                   detail::tape_value(in)...);
  return y;
}

}  // namespace tshard::ad
