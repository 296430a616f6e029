// map: a user's function applied to every valid element of one to four tensors (never to
// padding), and its run form for kernels that vectorise. A user function has no derivative:
// a tracked input is refused.
#pragma once
#include "tshard/ops/elementwise/operands.hpp"

namespace tshard {

// f applied to every valid element (never to padding); the result's element type is f's.
template <ShardedTensorType X, class F>
  requires std::is_invocable_v<F&, typename X::Scalar>
auto map(const X& x, F&& f) {
  using T = typename X::Scalar;
  using U = std::remove_cvref_t<std::invoke_result_t<F&, T>>;
  static_assert(Element<U>, "tshard: map's function must return an element type (float, double, complex, int32, int64, bool)");
  if (detail::recording(x)) detail::refuse_untraceable("map", x.describe());
  if constexpr (X::is_partial) {
    detail::OperatorScope scope("map");
    return map(detail::resolved(x, "map"), std::forward<F>(f));
  } else {
    ShardedTensor<U, typename X::MeshT, typename X::SpecType> out(x.mesh(), x.global_shape());
    const T* in = x.data();
    U* o = out.data();
    detail::for_each_valid_run(detail::layout_of(x), [&](detail::Index off, detail::Index n) {
      for (detail::Index i = off; i < off + n; ++i) o[i] = U(f(in[i]));
    });
    return out;
  }
}

namespace detail {
// map's run form for kernels that vectorise: f(out, in0, in1, ..., n) on each contiguous run of
// valid elements (pointers at the run's start), U the output's element type. Same specs,
// alignment and resolution as map.
template <class U, class F, ShardedTensorType X0, ShardedTensorType... Xs>
auto map_runs(F&& f, const X0& x0_in, const Xs&... xs_in) {
  if (recording(x0_in, xs_in...)) refuse_untraceable("map", x0_in.describe());
  using M = typename X0::MeshT;
  using OutSpec = typename elementwise_fold<M, X0::rank, typename X0::SpecType, typename Xs::SpecType...>::type;
  using Out = ShardedTensor<U, M, OutSpec>;
  auto run = [&](const auto& x0, const auto&... xs) {
    (require_same_mesh(x0, xs, "map"), ...);
    ((detail::extents_of(xs) != detail::extents_of(x0)
          ? throw ShapeError("tshard::map: the tensors' shapes differ: " + x0.describe() + " and " + xs.describe())
          : void()),
     ...);
    Out out(x0.mesh(), x0.global_shape());
    auto& mesh = *detail::state_of(x0.mesh());
    auto aligned = [&](const auto& x) {
      return implicit_reshard(mesh, x.spec_desc, Out::spec_desc, detail::extents_of(x), x.data(), "map");
    };
    const auto a0 = aligned(x0);
    const std::tuple<decltype(aligned(xs))...> as{aligned(xs)...};
    U* o = out.data();
    for_each_valid_run(detail::layout_of(out), [&](Index off, Index n) {
      std::apply([&](const auto&... a) { f(o + off, a0.data + off, (a.data + off)..., n); }, as);
    });
    return out;
  };
  return run(resolved(x0_in, "map"), resolved(xs_in, "map")...);
}
}  // namespace detail

// n-ary map: out(i) = f(a(i), b(i), ...) for 1 to 4 tensors of one shape (any element types and
// specs), in one pass over the valid elements (never padding). The output spec folds the
// elementwise rule over the inputs; inputs laid out otherwise are aligned by implicit reshards
// and partial inputs are resolved first. E.g. relu's backward:
//   auto dx = ts::map([](float h, float g) { return h > 0 ? g : 0.0f; }, h, dy);
template <class F, ShardedTensorType X0, ShardedTensorType... Xs>
  requires(!ShardedTensorType<F> && sizeof...(Xs) <= 3)
auto map(F&& f, const X0& x0_in, const Xs&... xs_in) {
  using U = std::remove_cvref_t<std::invoke_result_t<F&, typename X0::Scalar, typename Xs::Scalar...>>;
  static_assert(Element<U>, "tshard: map's function must return an element type (float, double, complex, int32, int64, bool)");
  static_assert((std::is_same_v<typename X0::MeshT, typename Xs::MeshT> && ...), "tshard: map's tensors live on one mesh type");
  static_assert(((Xs::rank == X0::rank) && ...), "tshard: map's tensors have one shape (and so one rank)");
  detail::OperatorScope scope("map");
  return detail::map_runs<U>(
      [&](U* o, const typename X0::Scalar* a0, const typename Xs::Scalar*... a, detail::Index n) {
        for (detail::Index i = 0; i < n; ++i) o[i] = U(f(a0[i], a[i]...));
      },
      x0_in, xs_in...);
}

}  // namespace tshard
