// Compile-time strings usable as template arguments: mesh axis names are types, not values.
#pragma once
#include <algorithm>
#include <cstddef>
#include <string_view>

namespace tshard {

template <std::size_t N>
struct FixedString {
  char chars[N]{};
  constexpr FixedString(const char (&s)[N]) { std::copy_n(s, N, chars); }
  constexpr std::string_view view() const { return {chars, N - 1}; }
  template <std::size_t K>
  constexpr bool operator==(const FixedString<K>& o) const { return view() == o.view(); }
};

}  // namespace tshard
