// A Unicode regular expression over UTF-8 text (PCRE2, Perl semantics: leftmost-first), for the
// pre-tokenizer patterns of tokenizer.json files (\p{L}, \p{N}, lookahead, (?i:...)). PCRE2 is an
// optional dependency: the component tshard::tokenizer defines TSHARD_WITH_PCRE2 and links it;
// without it, making a UnicodeRegex is an IoError that says how to get it, never a fall-back.
//
// The tokenizer's own code does not depend on PCRE2: it may be compiled once, in tshard::kernels,
// which knows nothing of PCRE2. A translation unit compiled with TSHARD_WITH_PCRE2 defines the
// engine as a weak symbol that the linker resolves, so it is there before any code runs (a
// Tokenizer made in another translation unit's static initialisation finds it too).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tshard/core/error.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/train/byte_level.hpp"

#if defined(TSHARD_WITH_PCRE2)
#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#endif

namespace tshard::train {

// Whether this build has a Unicode regex engine (and so byte-level BPE tokenizers).
inline constexpr bool has_unicode_regex =
#if defined(TSHARD_WITH_PCRE2)
    true;
#else
    false;
#endif

namespace detail {

// A compiled pattern of a regex engine.
struct CompiledPattern {
  virtual ~CompiledPattern() = default;
  // Every non-overlapping match in well-formed UTF-8 `text`, as UnicodeRegex::find_all says.
  virtual std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const = 0;
};

// The engine: compiles a pattern (`what` names it in errors). Defined, weak and constant-initialised,
// in every translation unit compiled with TSHARD_WITH_PCRE2 (the linker keeps one); where none
// is, the symbol resolves to null and unicode_regex_engine() says there is no engine.
using PatternCompiler = std::shared_ptr<const CompiledPattern> (*)(const std::string& pattern, const std::string& what);
[[gnu::weak]] extern const PatternCompiler pcre2_pattern_compiler;
inline PatternCompiler unicode_regex_engine() { return &pcre2_pattern_compiler ? pcre2_pattern_compiler : nullptr; }

}  // namespace detail

class UnicodeRegex {
 public:
  // Compiles `pattern` (UTF-8, Unicode properties and classes; JIT where PCRE2 has it). `what`
  // names the pattern in errors.
  UnicodeRegex(const std::string& pattern, const std::string& what);

  // Every non-overlapping match of the pattern in `text`, left to right, as [begin, end) byte
  // offsets, empty ones included except one right where the last match ended (the iteration of
  // Oniguruma, which HF tokenizers uses). `text` must be well-formed UTF-8 (checked once here).
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;

 private:
  std::shared_ptr<const detail::CompiledPattern> pattern_;  // (shared: copies match with it; matching does not change it)
  std::string what_;
};

#if defined(TSHARD_WITH_PCRE2)
namespace detail {

class Pcre2Pattern final : public CompiledPattern {
 public:
  Pcre2Pattern(const std::string& pattern, const std::string& what) : what_(what) {
    int code = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &code, &at, nullptr);
    if (!re) throw IoError(what_ + ": the pattern does not compile at byte " + std::to_string(at) + ": " + message(code));
    code_.reset(re, [](pcre2_code* c) { pcre2_code_free(c); });
    jit_ = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
  }

  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const override {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), [](pcre2_match_data* d) { pcre2_match_data_free(d); });
    std::size_t start = 0, last_end = std::string_view::npos;
    while (start <= text.size()) {
      const int rc = jit_ ? pcre2_jit_match(code_.get(), subject, text.size(), start, 0, data.get(), nullptr)
                          : pcre2_match(code_.get(), subject, text.size(), start, PCRE2_NO_UTF_CHECK, data.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) throw IoError(what_ + ": matching failed: " + message(rc));
      const PCRE2_SIZE* v = pcre2_get_ovector_pointer(data.get());
      if (v[1] == v[0] && v[1] == last_end) {  // empty, where the last match ended: on one character
        start += start < text.size() ? utf8_length(static_cast<unsigned char>(text[start])) : 1;
        continue;
      }
      out.emplace_back(v[0], v[1]);
      start = last_end = v[1];
    }
    return out;
  }

  static std::shared_ptr<const CompiledPattern> compile(const std::string& pattern, const std::string& what) {
    return std::make_shared<const Pcre2Pattern>(pattern, what);
  }

 private:
  static std::string message(int code) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(code, buffer, sizeof buffer);
    return reinterpret_cast<const char*>(buffer);
  }
  std::shared_ptr<pcre2_code> code_;
  bool jit_ = false;
  std::string what_;
};

}  // namespace detail

namespace detail {
[[gnu::weak]] extern const PatternCompiler pcre2_pattern_compiler = &Pcre2Pattern::compile;
}  // namespace detail
#endif

}  // namespace tshard::train

#if TSHARD_HEADER_BODIES
#include "tshard/train/unicode_regex-inl.hpp"
#endif
