// A translation unit compiled without PCRE2 that makes a UnicodeRegex during its static
// initialisation, linked ahead of the one compiled with it (whose initialisers have not run
// yet): the engine is a linked symbol, not something installed at start-up, so it is there.
#undef TSHARD_WITH_PCRE2
#include <cstddef>
#include <string>

#include "tshard/train/unicode_regex.hpp"

std::size_t static_init_regex_matches() {
  static const std::size_t matches = [] {
    try {
      return tshard::train::UnicodeRegex(R"(\p{L}+)", "a pattern made before main").find_all("héllo wörld 42").size();
    } catch (const tshard::Error&) {
      return std::size_t(0);
    }
  }();
  return matches;
}
namespace {
[[gnu::used]] const std::size_t made_before_main = static_init_regex_matches();
}  // namespace
