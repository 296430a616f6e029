// update: a user's function that writes several existing tensors in one pass, reading its inputs
// in the same pass (Kokkos' fused parallel_for, PETSc's VecAXPBYPCZ). CG's two updates
//
//   ts::update<2>([a](double& x, double& r, double p, double q) { x += a * p; r -= a * q; }, x, r, p, q);
//
// read x, r, p and q once and write x and r in place, where `x += a * p; r -= a * q;` takes two
// passes. The first N tensors are the outputs: f gets a reference to each one's element (read it,
// write it, or both), then the value of each input's element. The outputs keep their buffers
// (one still shared with a copy is made its own first, as any write does) and must share one
// spec and shape; inputs laid out otherwise are aligned to it by implicit reshards
// (refused under ImplicitCommunication::Forbid), partial inputs are summed first. Padding is never
// read or written. As map, a user function has no derivative: a tracked tensor is refused.
//
// Where f returns a number, update returns the sum of what it returned over every element, the
// same on every rank (Kokkos' parallel_reduce): CG's residual norm rides in the pass that writes r,
//
//   double rr = ts::update<2>([a](double& x, double& r, double p, double q) {
//     x += a * p; r -= a * q; return r * r; }, x, r, p, q);
//
// summed as ts::dot sums (floats in double, each rank its block, then one all-reduce of one
// number over the axes the outputs are split by).
#pragma once
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tshard/ops/elementwise/operands.hpp"
#include "tshard/ops/inner_product.hpp"

namespace tshard {
namespace detail {

template <class Y, class X>
inline constexpr bool update_output_like =
    std::is_same_v<typename std::remove_cvref_t<X>::MeshT, typename Y::MeshT> &&
    std::is_same_v<typename std::remove_cvref_t<X>::SpecType, typename Y::SpecType> &&
    !std::remove_cvref_t<X>::is_partial;

template <class Outs, class Ins>
struct UpdatePass;

template <class... Os, class... Is>
struct UpdatePass<std::tuple<Os&...>, std::tuple<const Is&...>> {
  template <class F>
  static auto run(F& f, std::tuple<Os&...> outs, std::tuple<const Is&...> ins_in) {
    using Y = std::remove_cvref_t<std::tuple_element_t<0, std::tuple<Os...>>>;
    static_assert((ShardedTensorType<Os> && ...) && (ShardedTensorType<Is> && ...),
                  "tshard: update's outputs and inputs are sharded tensors");
    static_assert((!std::is_const_v<Os> && ...), "tshard: update writes its first N tensors: pass them as non-const lvalues");
    static_assert(!Y::is_partial && (update_output_like<Y, Os> && ...),
                  "tshard: update's outputs share one mesh type and one spec, resolved (not partial): reshard one first");
    static_assert(((std::is_same_v<typename Is::MeshT, typename Y::MeshT> && Is::rank == Y::rank) && ...),
                  "tshard: update's inputs live on the outputs' mesh type and have their rank (one shape)");
    static_assert(std::is_invocable_v<F&, typename Os::Scalar&..., typename Is::Scalar...>,
                  "tshard: update's function takes a reference to each output's element, then each input's value "
                  "(e.g. [](double& x, double p) { x += p; } for update<1>(f, x, p))");
    using R = std::invoke_result_t<F&, typename Os::Scalar&..., typename Is::Scalar...>;
    constexpr bool sums = !std::is_void_v<R>;
    static_assert(!sums || ((std::is_arithmetic_v<R> || is_complex_v<R>) && !std::is_same_v<R, bool>),
                  "tshard: update's function returns nothing, or a number (not a bool: return 1 or 0 to count) "
                  "that update sums over the elements");
    // Sums run wide: floats in double as dot's, integers in 64 bits (a count over a large grid).
    using W = std::conditional_t<!sums, int,
                                 std::conditional_t<std::is_integral_v<std::conditional_t<sums, R, int>>, std::int64_t,
                                                    wide_t<std::conditional_t<sums, R, int>>>>;
    Y& y = std::get<0>(outs);
    auto check = [&](const auto& t) {
      if (recording(t)) refuse_untraceable("update", t.describe());
      require_same_mesh(y, t, "update");
      if (extents_of(t) != extents_of(y))
        throw ShapeError("tshard::update: the tensors' shapes differ: " + y.describe() + " and " + t.describe());
    };
    std::apply([&](const auto&... o) { (check(o), ...); }, outs);
    std::apply([&](const auto&... x) { (check(x), ...); }, ins_in);
    auto& mesh = *state_of(y.mesh());
    W total{};
    auto pass = [&](const auto&... x) {
      // Inputs are aligned (and so copied where an output shares their buffer with another
      // layout) before any output is written.
      const std::tuple<decltype(implicit_reshard(mesh, x.spec_desc, Y::spec_desc, extents_of(x), x.data(), "update"))...>
          in{implicit_reshard(mesh, x.spec_desc, Y::spec_desc, extents_of(x), x.data(), "update")...};
      const std::tuple<typename Os::Scalar*...> out = std::apply([](auto&... o) { return std::tuple{o.data()...}; }, outs);
      for_each_valid_run(layout_of(y), [&](Index off, Index n) {
        std::apply(
            [&](auto*... o) {
              std::apply(
                  [&](const auto&... a) {
                    if constexpr (sums) {
                      W s{};
                      for (Index i = off; i < off + n; ++i) s += W(f(o[i]..., a.data[i]...));
                      total += s;
                    } else {
                      for (Index i = off; i < off + n; ++i) f(o[i]..., a.data[i]...);
                    }
                  },
                  in);
            },
            out);
      });
    };
    std::apply([&](const auto&... x) { pass(resolved(x, "update")...); }, ins_in);
    if constexpr (sums) {
      if (MPI_Comm g = split_group(mesh, Y::spec_desc); g != MPI_COMM_NULL) all_reduce(g, &total, &total, 1, ReduceOp::Sum);
      return R(total);
    }
  }
};

template <std::size_t N, class Tuple, std::size_t... O, std::size_t... I>
auto split_update(auto& f, Tuple all, std::index_sequence<O...>, std::index_sequence<I...>) {
  static_assert((std::is_lvalue_reference_v<std::tuple_element_t<O, Tuple>> && ...),
                "tshard: update writes its first N tensors in place: pass them as variables, not temporaries");
  return UpdatePass<std::tuple<std::tuple_element_t<O, Tuple>...>,
             std::tuple<const std::remove_cvref_t<std::tuple_element_t<N + I, Tuple>>&...>>::
      run(f, std::tie(std::get<O>(all)...), std::tie(std::get<N + I>(all)...));
}

}  // namespace detail

// f(out_0(i)&, ..., out_{N-1}(i)&, in_0(i), ...) for every valid element i, in one pass: the first
// N tensors are written in place, the rest read. Collective where an input is realigned, and
// where f returns a number (then the sum of its returns is returned, on every rank).
template <std::size_t N, class F, class... Ts>
  requires(!ShardedTensorType<F>)
auto update(F&& f, Ts&&... ts) {
  static_assert(N >= 1 && N <= sizeof...(Ts), "tshard: update<N> writes its first N tensors: N is 1 to their count");
  static_assert(sizeof...(Ts) <= 8, "tshard: update takes at most 8 tensors");
  detail::OperatorScope scope("update");
  return detail::split_update<N>(f, std::forward_as_tuple(ts...), std::make_index_sequence<N>{},
                                 std::make_index_sequence<sizeof...(Ts) - N>{});
}

// map into an existing tensor: out(i) = f(a(i), b(i), ...) in out's buffer and spec (no new tensor);
// the inputs are read as by map. ts::map_into(u_next, [](double u, double l) { return u + dt * l; }, u, lap).
template <class Y, class F, ShardedTensorType... Xs>
  requires(ShardedTensorType<Y> && !ShardedTensorType<F> && sizeof...(Xs) >= 1)
void map_into(Y& out, F&& f, const Xs&... xs) {
  using U = typename Y::Scalar;
  static_assert(std::is_invocable_v<F&, typename Xs::Scalar...>, "tshard: map_into's function takes each input's element");
  update<1>([&f](U& o, const typename Xs::Scalar&... a) { o = U(f(a...)); }, out, xs...);
}

}  // namespace tshard
