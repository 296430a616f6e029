// Compile-time spec algebra: the output specs operators deduce from their inputs' specs
// (sharding propagation by overload resolution). Decisions are constexpr functions over axis
// names; the results are turned back into Spec and Partial types here.
#pragma once
#include <array>
#include <string_view>
#include <tuple>
#include <utility>

#include "tshard/core/spec.hpp"
#include "tshard/core/spec_descriptor.hpp"

namespace tshard::detail {

template <FixedString... A>
struct AxisList {
  static constexpr std::array<std::string_view, sizeof...(A)> names{A.view()...};
};

template <class D>
struct dim_axes;
template <>
struct dim_axes<R> {
  using type = AxisList<>;
};
template <FixedString... A>
struct dim_axes<S<A...>> {
  using type = AxisList<A...>;
};

template <class... L>
struct concat_axes;
template <>
struct concat_axes<> {
  using type = AxisList<>;
};
template <FixedString... A>
struct concat_axes<AxisList<A...>> {
  using type = AxisList<A...>;
};
template <FixedString... A, FixedString... B, class... Rest>
struct concat_axes<AxisList<A...>, AxisList<B...>, Rest...> {
  using type = typename concat_axes<AxisList<A..., B...>, Rest...>::type;
};

template <ReduceOp Op, class L>
struct partial_of;
template <ReduceOp Op>
struct partial_of<Op, AxisList<>> {
  using type = NoPartial;
};
template <ReduceOp Op, FixedString... A>
struct partial_of<Op, AxisList<A...>> {
  using type = Partial<Op, A...>;
};

template <class P>
struct partial_axes {
  using type = AxisList<>;
};
template <ReduceOp Op, FixedString... A>
struct partial_axes<Partial<Op, A...>> {
  using type = AxisList<A...>;
};

template <class SpecT, int I>
struct dim_at;
template <class... D, int I>
struct dim_at<Spec<D...>, I> {
  using type = std::tuple_element_t<I, std::tuple<D...>>;
};
template <class SpecT, int I>
using dim_at_t = typename dim_at<SpecT, I>::type;

// Spec<dim_at<SpecT, Idx[0]>, ...> for a constexpr array of indices, -1 meaning R.
template <class SpecT, auto Idx, class Seq = std::make_index_sequence<Idx.size()>>
struct select_dims;
template <class SpecT, auto Idx, std::size_t... I>
struct select_dims<SpecT, Idx, std::index_sequence<I...>> {
  template <int K>
  using pick = std::conditional_t<(K < 0), R, dim_at_t<SpecT, (K < 0 ? 0 : K)>>;
  using type = Spec<pick<Idx[I]>...>;
};

// Two specs dim by dim, picking from the left (0), the right (1) or R (2).
template <class SA, class SB, auto Choice, class Seq = std::make_index_sequence<Choice.size()>>
struct merge_dims;
template <class SA, class SB, auto Choice, std::size_t... I>
struct merge_dims<SA, SB, Choice, std::index_sequence<I...>> {
  template <int D, int C>
  using pick = std::conditional_t<C == 0, dim_at_t<SA, D>, std::conditional_t<C == 1, dim_at_t<SB, D>, R>>;
  using type = Spec<pick<int(I), Choice[I]>...>;
};

template <std::size_t K, std::size_t L>
constexpr bool same_name_set(const std::array<std::string_view, K>& a, const std::array<std::string_view, L>& b) {
  if (K != L) return false;
  for (auto x : a) {
    bool found = false;
    for (auto y : b) found |= x == y;
    if (!found) return false;
  }
  return true;
}

// The spec without the listed dims.
template <class SpecT, int... Drop>
struct drop_dims {
  static constexpr auto kept = [] {
    std::array<int, std::size_t(SpecT::rank - int(sizeof...(Drop)))> k{};
    std::size_t n = 0;
    for (int d = 0; d < SpecT::rank; ++d) {
      bool dropped = ((d == Drop) || ...);
      if (!dropped) k[n++] = d;
    }
    return k;
  }();
  using type = typename select_dims<SpecT, kept>::type;
  // The axes of the dropped dims: they become partial axes of a reduction.
  using dropped_axes = typename concat_axes<typename dim_axes<dim_at_t<SpecT, Drop>>::type...>::type;
};

// Whether two dim specs name a common mesh axis.
template <class A, class B>
constexpr bool dims_share_axis() {
  for (auto x : A::names)
    for (auto y : B::names)
      if (x == y) return true;
  return false;
}
// Whether dim spec D names a mesh axis that some dim of spec Other names.
template <class D, class Other>
struct shares_axis;
template <class D, class... O>
struct shares_axis<D, Spec<O...>> : std::bool_constant<(dims_share_axis<D, O>() || ...)> {};

// The longest prefix of a dim spec's axes that no dim of spec Avoid names (R where the first
// is named): S<"data", "model"> beside a weight split over "model" keeps S<"data">. A split's
// first axis is major, so where the dim divides evenly its S<"data"> blocks hold the
// S<"data", "model"> blocks; unevenly (ceil chunks) the planner moves what straddles.
template <FixedString... A>
struct axes_list {};
template <FixedString... A>
struct dim_of_axes {
  using type = S<A...>;
};
template <>
struct dim_of_axes<> {
  using type = R;
};
template <class Avoid, class Kept, class Rest>
struct clash_free_prefix_of;
template <class Avoid, FixedString... K>
struct clash_free_prefix_of<Avoid, axes_list<K...>, axes_list<>> : dim_of_axes<K...> {};
template <class Avoid, FixedString... K, FixedString A, FixedString... Rest>
struct clash_free_prefix_of<Avoid, axes_list<K...>, axes_list<A, Rest...>>
    : std::conditional_t<shares_axis<S<A>, Avoid>::value, dim_of_axes<K...>,
                         clash_free_prefix_of<Avoid, axes_list<K..., A>, axes_list<Rest...>>> {};
template <class D, class Avoid>
struct clash_free_prefix {
  using type = R;
};
template <FixedString... A, class Avoid>
struct clash_free_prefix<S<A...>, Avoid> : clash_free_prefix_of<Avoid, axes_list<>, axes_list<A...>> {};

// SpecT's dims but the last, each cut to its axes' longest prefix that spec Avoid does not name,
// then Last: the layout of an operand whose product with a tensor laid out as Avoid (over the
// operand's last dim, laid out as Last) lands in SpecT's leading dims without a conflict, their
// blocks moved into SpecT's by local slicing where the dims divide evenly.
template <class SpecT, class Avoid, class Last, class Seq = std::make_index_sequence<std::size_t(SpecT::rank - 1)>>
struct leading_dims_then;
template <class SpecT, class Avoid, class Last, std::size_t... I>
struct leading_dims_then<SpecT, Avoid, Last, std::index_sequence<I...>> {
  using type = Spec<typename clash_free_prefix<dim_at_t<SpecT, int(I)>, Avoid>::type..., Last>;
};
template <class SpecT, class Avoid, class Last>
using leading_dims_then_t = typename leading_dims_then<SpecT, Avoid, Last>::type;

// The spec with dims permuted: output dim i is input dim Perm[i].
template <class SpecT, int... Perm>
struct permute_dims {
  static constexpr std::array<int, sizeof...(Perm)> order{Perm...};
  using type = typename select_dims<SpecT, order>::type;
};

template <int Rank, int... Dims>
constexpr bool dims_valid() {
  constexpr std::array<int, sizeof...(Dims)> d{Dims...};
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (d[i] < 0 || d[i] >= Rank) return false;
    for (std::size_t j = i + 1; j < d.size(); ++j)
      if (d[i] == d[j]) return false;
  }
  return true;
}

}  // namespace tshard::detail
