// The definitions of unicode_regex.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tshard/train/unicode_regex.hpp"

namespace tshard::train {

TSHARD_FUNC UnicodeRegex::UnicodeRegex(const std::string& pattern, const std::string& what) : what_(what) {
  const detail::PatternCompiler engine = detail::unicode_regex_engine();
  if (!engine)
    throw IoError(what_ + " needs a Unicode regex engine: this build of tshard has none (install libpcre2-dev, "
                  "reconfigure, and link tshard::tokenizer)");
  pattern_ = engine(pattern, what_);
}

TSHARD_FUNC std::vector<std::pair<std::size_t, std::size_t>> UnicodeRegex::find_all(std::string_view text) const {
  if (const std::size_t bad = detail::first_invalid_utf8(text); bad != std::string_view::npos)
    throw IoError(what_ + ": the text is not valid UTF-8 at byte " + std::to_string(bad));
  return pattern_->find_all(text);
}

}  // namespace tshard::train
