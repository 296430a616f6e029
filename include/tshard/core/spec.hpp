// Sharding specs as types: R (replicated), S<"x", ...> (split over mesh axes, first major),
// Spec<...> (one entry per tensor dim) and the partial markers of unreduced values.
#pragma once
#include <array>
#include <string_view>
#include <type_traits>

#include "tshard/core/fixed_string.hpp"

namespace tshard {

// A tensor dim that every rank holds whole.
struct R {
  static constexpr std::array<std::string_view, 0> names{};
};

// A tensor dim split over the named mesh axes; with several axes the first is major.
template <FixedString... Axes>
struct S {
  static_assert(sizeof...(Axes) > 0, "tshard: S<...> needs at least one mesh axis name");
  static constexpr std::array<std::string_view, sizeof...(Axes)> names{Axes.view()...};
};

namespace detail {
template <class D>
struct is_dim_spec : std::false_type {};
template <>
struct is_dim_spec<R> : std::true_type {};
template <FixedString... A>
struct is_dim_spec<S<A...>> : std::true_type {};
}  // namespace detail

// One entry per tensor dim, each R or S<...>.
template <class... Dims>
struct Spec {
  static_assert((detail::is_dim_spec<Dims>::value && ...),
                "tshard: a Spec holds only R and S<...> entries, one per tensor dim");
  static constexpr int rank = int(sizeof...(Dims));
};

// In place of a spec where a layer's output layout may be pinned: the layout propagation gives.
struct Deduced {};

// How a partial value is completed.
enum class ReduceOp { Sum, Max, Min };

// Not partial: the values are final.
struct NoPartial {
  static constexpr bool is_partial = false;
  static constexpr std::array<std::string_view, 0> names{};
};

// Per-rank values that still have to be combined with Op over the named mesh axes.
template <ReduceOp Op, FixedString... Axes>
struct Partial {
  static_assert(sizeof...(Axes) > 0, "tshard: a Partial marker needs at least one mesh axis name");
  static constexpr bool is_partial = true;
  static constexpr ReduceOp op = Op;
  static constexpr std::array<std::string_view, sizeof...(Axes)> names{Axes.view()...};
};

template <FixedString... Axes>
using PartialSum = Partial<ReduceOp::Sum, Axes...>;
template <FixedString... Axes>
using PartialMax = Partial<ReduceOp::Max, Axes...>;
template <FixedString... Axes>
using PartialMin = Partial<ReduceOp::Min, Axes...>;

namespace detail {
template <class P>
struct is_partial_marker : std::false_type {};
template <>
struct is_partial_marker<NoPartial> : std::true_type {};
template <ReduceOp Op, FixedString... A>
struct is_partial_marker<Partial<Op, A...>> : std::true_type {};

template <class X>
struct is_spec : std::false_type {};
template <class... D>
struct is_spec<Spec<D...>> : std::true_type {};
template <class S>
inline constexpr bool is_deduced = std::is_same_v<S, Deduced>;
// A pinned spec's rank; -1 for Deduced or anything not a Spec.
template <class S>
constexpr int pinned_rank() {
  if constexpr (is_spec<S>::value) return S::rank;
  else return -1;
}

// Spec with every dim replicated, of a given rank.
template <int Rank, class... D>
struct replicated_spec {
  using type = typename replicated_spec<Rank - 1, R, D...>::type;
};
template <class... D>
struct replicated_spec<0, D...> {
  using type = Spec<D...>;
};
}  // namespace detail

// Spec<R, R, ...> of the given rank.
template <int Rank>
using Replicated = typename detail::replicated_spec<Rank>::type;

}  // namespace tshard
