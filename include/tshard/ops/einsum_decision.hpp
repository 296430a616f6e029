// The compile-time sharding decision of an einsum (GSPMD section 3.5): for every label, which
// operand's split it keeps, and the output's spec, partial over the splits of summed labels.
// One constexpr rule serves the typed API (output types) and descriptor code (run time).
#pragma once
#include <cstddef>
#include <utility>

#include "tshard/core/spec_algebra.hpp"
#include "tshard/core/spec_descriptor.hpp"
#include "tshard/ops/einsum_labels.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::detail {

// Where a label's split comes from: 0 = the left operand's dim idx, 1 = the right's, 2 = R.
struct LabelSource {
  int src = 2, idx = -1;
};

struct EinsumDecision {
  std::array<char, 2 * kMaxRank> label{};
  std::array<LabelSource, 2 * kMaxRank> source{};
  int n = 0;
  constexpr LabelSource of(char c) const {
    for (int i = 0; i < n; ++i)
      if (label[i] == c) return source[i];
    return {};
  }
};

// GSPMD's propagation, label by label (the left operand's labels first): a label keeps the left
// operand's split if it has one, else the right's, unless that reuses a mesh axis already taken.
// One constexpr function for the typed API (at compile time) and for descriptors (at run time).
constexpr EinsumDecision decide_einsum(const EinsumLabels& e, const SpecDesc& a, const SpecDesc& b) {
  EinsumDecision d;
  std::uint32_t used = 0;
  auto decide = [&](char c) {
    const int ia = e.in_a(c), ib = e.in_b(c);
    LabelSource s;
    if (ia >= 0 && a.dims[ia].count > 0) {
      if (!(a.dims[ia].mask() & used)) {
        s = {0, ia};
        used |= a.dims[ia].mask();
      }
    } else if (ib >= 0 && b.dims[ib].count > 0) {
      if (!(b.dims[ib].mask() & used)) {
        s = {1, ib};
        used |= b.dims[ib].mask();
      }
    }
    d.label[d.n] = c;
    d.source[d.n++] = s;
  };
  for (int i = 0; i < e.na; ++i) decide(e.a[i]);
  for (int i = 0; i < e.nb; ++i)
    if (e.in_a(e.b[i]) < 0) decide(e.b[i]);
  return d;
}

constexpr DimSplit split_of(const LabelSource& s, const SpecDesc& a, const SpecDesc& b) {
  return s.src == 0 ? a.dims[s.idx] : s.src == 1 ? b.dims[s.idx] : DimSplit{};
}

// The output's descriptor: each output label's decided split; a partial sum over the splits
// of every summed label (contracted, or summed in one operand alone).
constexpr SpecDesc einsum_output_desc(const EinsumLabels& e, const EinsumDecision& d, const SpecDesc& a,
                                      const SpecDesc& b) {
  SpecDesc o;
  o.rank = e.no;
  for (int i = 0; i < e.no; ++i) o.dims[i] = split_of(d.of(e.o[i]), a, b);
  for (int i = 0; i < d.n; ++i)
    if (e.in_o(d.label[i]) < 0) o.partial_axes |= split_of(d.source[i], a, b).mask();
  if (o.partial_axes) o.partial = PartialKind::Sum;
  return o;
}

// The output type of the typed API, built from the same decision.
template <class SA, class SB, class M, auto E, class Seq = std::make_index_sequence<std::size_t(E.no)>>
struct einsum_output;
template <class SA, class SB, class M, auto E, std::size_t... I>
struct einsum_output<SA, SB, M, E, std::index_sequence<I...>> {
  static constexpr SpecDesc da = make_desc<SA, NoPartial>(M::axis_names);
  static constexpr SpecDesc db = make_desc<SB, NoPartial>(M::axis_names);
  static constexpr EinsumDecision decision = decide_einsum(E, da, db);
  template <int Src, int Idx>
  using dim = std::conditional_t<Src == 0, dim_at_t<SA, (Src == 0 ? Idx : 0)>,
                                 std::conditional_t<Src == 1, dim_at_t<SB, (Src == 1 ? Idx : 0)>, R>>;
  using spec = Spec<dim<decision.of(E.o[I]).src, decision.of(E.o[I]).idx>...>;
  // The summed labels that carry a split: their axes make the partial.
  static constexpr auto summed = [] {
    std::array<LabelSource, 2 * kMaxRank> c{};
    int n = 0;
    for (int i = 0; i < decision.n; ++i)
      if (E.in_o(decision.label[i]) < 0 && decision.source[i].src != 2) c[n++] = decision.source[i];
    return std::pair{c, n};
  }();
  template <std::size_t... J>
  static auto partial_axes_of(std::index_sequence<J...>) ->
      typename concat_axes<typename dim_axes<dim<summed.first[J].src, summed.first[J].idx>>::type...>::type;
  using axes = decltype(partial_axes_of(std::make_index_sequence<std::size_t(summed.second)>{}));
  using partial = typename partial_of<ReduceOp::Sum, axes>::type;
};

}  // namespace tshard::detail
