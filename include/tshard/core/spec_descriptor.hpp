// The run-time spec descriptor: what the planner, executor and kernels work on, so that they
// are instantiated per element type only, never per spec combination (docs/architecture.md: types check,
// descriptors do). Also the compile-time translation of Spec types into descriptors.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "tshard/core/mesh_shape.hpp"
#include "tshard/core/spec.hpp"

namespace tshard::detail {

// The mesh axes one tensor dim is split over, in split order (first major).
struct DimSplit {
  int count = 0;
  std::array<std::int8_t, kMaxAxes> axes{};

  constexpr int operator[](int i) const { return axes[i]; }
  constexpr void push(int axis) { axes[count++] = std::int8_t(axis); }
  constexpr bool operator==(const DimSplit& o) const {
    if (count != o.count) return false;
    for (int i = 0; i < count; ++i)
      if (axes[i] != o.axes[i]) return false;
    return true;
  }
  // True when this split is a prefix of `o` (o refines this one).
  constexpr bool is_prefix_of(const DimSplit& o) const {
    if (count > o.count) return false;
    for (int i = 0; i < count; ++i)
      if (axes[i] != o.axes[i]) return false;
    return true;
  }
  constexpr std::uint32_t mask() const {
    std::uint32_t m = 0;
    for (int i = 0; i < count; ++i) m |= 1u << axes[i];
    return m;
  }
};

enum class PartialKind : std::uint8_t { None, Sum, Max, Min };

// The reduction that resolves a partial of kind k.
constexpr ReduceOp reduce_op_of(PartialKind k) {
  return k == PartialKind::Max ? ReduceOp::Max : k == PartialKind::Min ? ReduceOp::Min : ReduceOp::Sum;
}

struct SpecDesc {
  int rank = 0;
  std::array<DimSplit, kMaxRank> dims{};
  PartialKind partial = PartialKind::None;
  std::uint32_t partial_axes = 0;  // bit mask of mesh axes

  constexpr bool operator==(const SpecDesc& o) const {
    if (rank != o.rank || partial != o.partial || partial_axes != o.partial_axes) return false;
    for (int d = 0; d < rank; ++d)
      if (!(dims[d] == o.dims[d])) return false;
    return true;
  }
  constexpr std::uint32_t split_axes() const {
    std::uint32_t m = 0;
    for (int d = 0; d < rank; ++d) m |= dims[d].mask();
    return m;
  }
  constexpr SpecDesc without_partial() const {
    SpecDesc s = *this;
    s.partial = PartialKind::None;
    s.partial_axes = 0;
    return s;
  }
  // "{x, R}" for Spec<S<"x">, R>; "{(x,y), R} partial-sum(z)" with multi-axis and partial.
  std::string to_string(const MeshShape& mesh) const {
    std::string s = "{";
    for (int d = 0; d < rank; ++d) {
      if (d) s += ", ";
      const DimSplit& sp = dims[d];
      if (sp.count == 0) s += "R";
      if (sp.count > 1) s += "(";
      for (int i = 0; i < sp.count; ++i) s += (i ? "," : "") + mesh.names[sp[i]];
      if (sp.count > 1) s += ")";
    }
    s += "}";
    if (partial != PartialKind::None) {
      s += partial == PartialKind::Sum ? " partial-sum(" : partial == PartialKind::Max ? " partial-max(" : " partial-min(";
      bool first = true;
      for (int a = 0; a < mesh.axes(); ++a)
        if (partial_axes & (1u << a)) {
          s += (first ? "" : ",") + mesh.names[a];
          first = false;
        }
      s += ")";
    }
    return s;
  }
};

// ---- compile time: Spec types -> descriptor, with the checks behind the static_asserts ----

template <std::size_t N, std::size_t K>
constexpr int axis_index(const std::array<std::string_view, N>& mesh_axes,
                         const std::array<std::string_view, K>& names, std::size_t i) {
  for (std::size_t a = 0; a < N; ++a)
    if (mesh_axes[a] == names[i]) return int(a);
  return -1;
}

template <std::size_t N, class Dim>
constexpr bool dim_axes_known(const std::array<std::string_view, N>& mesh_axes) {
  for (std::size_t i = 0; i < Dim::names.size(); ++i)
    if (axis_index(mesh_axes, Dim::names, i) < 0) return false;
  return true;
}

template <class SpecT>
struct spec_traits;
template <class... D>
struct spec_traits<Spec<D...>> {
  template <std::size_t N>
  static constexpr bool axes_known(const std::array<std::string_view, N>& mesh_axes) {
    return (dim_axes_known<N, D>(mesh_axes) && ...);
  }
  // Every axis name across all dims, in order.
  static constexpr auto all_names() {
    constexpr std::size_t total = (D::names.size() + ... + 0);
    std::array<std::string_view, total> out{};
    std::size_t k = 0;
    ((([&] {
       for (auto n : D::names) out[k++] = n;
     }())),
     ...);
    return out;
  }
};

// Whether every axis the specs split over is an axis of mesh M (Deduced and non-specs: none),
// for layers to refuse where they are declared rather than at their first call.
template <class M, class... Specs>
constexpr bool specs_on_mesh() {
  return ([] {
    if constexpr (is_spec<Specs>::value) return spec_traits<Specs>::axes_known(M::axis_names);
    else return true;
  }() && ...);
}

template <std::size_t K>
constexpr bool names_unique(const std::array<std::string_view, K>& names) {
  for (std::size_t i = 0; i < K; ++i)
    for (std::size_t j = i + 1; j < K; ++j)
      if (names[i] == names[j]) return false;
  return true;
}

template <std::size_t K, std::size_t L>
constexpr bool names_disjoint(const std::array<std::string_view, K>& a,
                              const std::array<std::string_view, L>& b) {
  for (auto x : a)
    for (auto y : b)
      if (x == y) return false;
  return true;
}

template <std::size_t N, std::size_t K>
constexpr bool names_known(const std::array<std::string_view, N>& mesh_axes,
                           const std::array<std::string_view, K>& names) {
  for (std::size_t i = 0; i < K; ++i)
    if (axis_index(mesh_axes, names, i) < 0) return false;
  return true;
}

template <class P>
constexpr PartialKind partial_kind() {
  if constexpr (!P::is_partial) {
    return PartialKind::None;
  } else {
    return P::op == ReduceOp::Sum ? PartialKind::Sum : P::op == ReduceOp::Max ? PartialKind::Max : PartialKind::Min;
  }
}

// The descriptor of (SpecT, P) on a mesh with the given axis names; assumes the checks passed.
template <class SpecT, class P, std::size_t N>
constexpr SpecDesc make_desc(const std::array<std::string_view, N>& mesh_axes) {
  return [&]<class... D>(Spec<D...>*) {
    SpecDesc desc{};
    desc.rank = int(sizeof...(D));
    int d = 0;
    (([&] {
       for (std::size_t i = 0; i < D::names.size(); ++i) desc.dims[d].push(axis_index(mesh_axes, D::names, i));
       ++d;
     }()),
     ...);
    desc.partial = partial_kind<P>();
    for (std::size_t i = 0; i < P::names.size(); ++i)
      desc.partial_axes |= 1u << axis_index(mesh_axes, P::names, i);
    return desc;
  }(static_cast<SpecT*>(nullptr));
}

}  // namespace tshard::detail
