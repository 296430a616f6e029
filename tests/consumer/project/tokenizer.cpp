// A user's program with the component tokenizer: a byte-level BPE tokenizer.json (GPT-2's
// pre-tokenizer pattern, so PCRE2 is needed) encodes and decodes through the installed headers.
// Exits non-zero where the round trip or the ids are wrong.
#include <tshard/train/tokenizer.hpp>

#include <cstdio>
#include <string>
#include <vector>

int main() {
  static_assert(tshard::train::has_unicode_regex, "the component tokenizer brings PCRE2");
  // Bytes as GPT-2's byte-level alphabet prints them ("Ġ" is the space), and one merge.
  const std::string json = R"({"model": {"type": "BPE", "vocab": {"h": 0, "i": 1, "Ġ": 2, "Ã": 4, "©": 5, "hi": 6},
    "merges": ["h i"]}, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"}})";
  const tshard::train::Tokenizer tok(json, "consumer");
  const std::vector<std::int32_t> ids = tok.encode("hi hi"), want{6, 2, 6};  // "hi" | " hi": hi; Ġ, hi
  const bool ok = ids == want && tok.decode(tok.encode("hi \xc3\xa9")) == "hi \xc3\xa9";
  std::printf("consumer_tokenizer: %s\n", ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
