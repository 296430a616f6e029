// The einsum string ("bij,bjk->bik"), parsed at compile time into per-operand label lists.
#pragma once
#include <array>

#include "tshard/core/fixed_string.hpp"
#include "tshard/core/mesh_shape.hpp"

namespace tshard::detail {

struct EinsumLabels {
  int na = 0, nb = 0, no = 0;
  std::array<char, kMaxRank> a{}, b{}, o{};
  bool well_formed = true;

  static constexpr int find(const std::array<char, kMaxRank>& l, int n, char c) {
    for (int i = 0; i < n; ++i)
      if (l[i] == c) return i;
    return -1;
  }
  constexpr int in_a(char c) const { return find(a, na, c); }
  constexpr int in_b(char c) const { return find(b, nb, c); }
  constexpr int in_o(char c) const { return find(o, no, c); }
};

template <std::size_t N>
constexpr EinsumLabels parse_einsum(const FixedString<N>& s) {
  EinsumLabels e;
  int part = 0;
  for (std::size_t i = 0; i + 1 < N; ++i) {
    const char c = s.chars[i];
    if (c == ' ') continue;
    if (c == ',') {
      if (part != 0) e.well_formed = false;
      part = 1;
    } else if (c == '-') {
      if (part != 1 || i + 2 >= N || s.chars[i + 1] != '>') e.well_formed = false;
      part = 2;
      ++i;
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      int& n = part == 0 ? e.na : part == 1 ? e.nb : e.no;
      auto& l = part == 0 ? e.a : part == 1 ? e.b : e.o;
      if (n >= kMaxRank) {
        e.well_formed = false;
      } else {
        l[n++] = c;
      }
    } else {
      e.well_formed = false;
    }
  }
  if (part != 2) e.well_formed = false;
  return e;
}

constexpr bool labels_repeat(const std::array<char, kMaxRank>& l, int n) {
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      if (l[i] == l[j]) return true;
  return false;
}
constexpr bool outputs_known(const EinsumLabels& e) {
  for (int i = 0; i < e.no; ++i)
    if (e.in_a(e.o[i]) < 0 && e.in_b(e.o[i]) < 0) return false;
  return true;
}
}  // namespace tshard::detail
